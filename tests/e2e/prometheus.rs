//! endpoints-guard under a real Prometheus. The endpoints-guard binary runs
//! behind watch-chaos on the local control plane, /metrics over HTTPS
//! (`--secure-metrics-addr`, the certificate from files as a mounted Secret
//! would give it); Prometheus scrapes it through a static scrape config that
//! stands in for the chart's ServiceMonitor (the same job and namespace
//! labels, HTTPS checked against the CA, the token of a ServiceAccount bound
//! to the chart's metrics-reader ClusterRole) and evaluates the rules `helm
//! template` renders, every second. Two more jobs scrape the same port with
//! the token of a ServiceAccount without the role (403) and with no token
//! (401), as Prometheus's targets API reports. Read from the alerts API:
//! (a) failure A replayed through watch-chaos fires
//!     EndpointsGuardSpuriousDeletionsPrevented;
//! (b) a pod delete the watch never delivers (watch-chaos `drop-deletes`),
//!     found by the periodic resync, fires EndpointsGuardResyncDrift;
//! (c) killing the controller fires EndpointsGuardDown;
//! and (d) every query of the Grafana dashboard parses and returns data.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common;
use anyhow::{Context, Result, bail};
use eg_chaos::{ChaosProxy, Expected, failure_a_history};
use eg_chart::prometheus::{
    ChartMonitoring, Job, Prometheus, Scheme, Target, alert_names, render_chart_monitoring,
};
use eg_harness::loopback;
use eg_harness::process::{Process, free_ports};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
use endpoints_guard::metrics::prevention::ALL as PREVENTION_REASONS;
use k8s_openapi::api::core::v1::{Endpoints, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Where the workload lives (the scrapes' namespace label is the chart's).
const NS: &str = "observed";
const ALERT_TIMEOUT: Duration = Duration::from_secs(60);

async fn wait_for(cp: &ControlPlane, expected: &Expected) -> Result<()> {
    let client = cp.client();
    common::eventually(Duration::from_secs(60), "the Endpoints", || {
        let client = client.clone();
        async move {
            match expected.check(&client, NS).await? {
                None => Ok(Some(())),
                Some(problem) => Err(anyhow::anyhow!(problem)),
            }
        }
    })
    .await
}

/// How many alerts `name` whose labels include `labels` are firing now.
async fn firing(prometheus: &Prometheus, name: &str, labels: &[(&str, &str)]) -> Result<usize> {
    Ok(prometheus
        .alerts_matching(name, "firing", labels)
        .await?
        .len())
}

/// The dashboard's queries, `$namespace` set: every panel target, and the
/// variable's `label_values(metric, label)` as the series query it stands for.
fn dashboard_queries(monitoring: &ChartMonitoring) -> Result<Vec<(String, String)>> {
    let ns = format!("\"{}\"", monitoring.namespace);
    let mut queries = Vec::new();
    for panel in monitoring.dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .context("panel target without expr")?;
            let title = panel["title"].as_str().unwrap_or_default();
            queries.push((title.to_string(), expr.replace("\"$namespace\"", &ns)));
        }
    }
    for var in monitoring.dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(query) = var["query"].as_str().filter(|_| var["type"] == "query") {
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .with_context(|| format!("variable query {query}"))?;
            let (metric, label) = inner
                .split_once(',')
                .context("label_values(metric, label)")?;
            queries.push((
                format!("variable {}", var["name"]),
                format!("count by ({}) ({metric})", label.trim()),
            ));
        }
    }
    Ok(queries)
}

/// Where the scrapers' ServiceAccounts live.
const MONITORING: &str = "monitoring";

/// The chart's metrics-reader ClusterRole and its binding to
/// `monitoring/prometheus` (`metrics.readers`), as `helm template` renders them.
fn metrics_reader_objects() -> Result<(ClusterRole, ClusterRoleBinding)> {
    let out = std::process::Command::new(eg_harness::binaries::program("helm")?)
        .args(["template", "endpoints-guard"])
        .arg(eg_harness::binaries::workspace_root()?.join("charts/endpoints-guard"))
        .args(["--namespace", "endpoints-guard"])
        .args(["--set", "metrics.readers[0].kind=ServiceAccount"])
        .args(["--set", "metrics.readers[0].name=prometheus"])
        .args([
            "--set",
            &format!("metrics.readers[0].namespace={MONITORING}"),
        ])
        .args(["--show-only", "templates/secure-metrics.yaml"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut role = None;
    let mut binding = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)?;
        let name = value["metadata"]["name"].as_str().unwrap_or_default();
        match value["kind"].as_str() {
            Some("ClusterRole") => role = Some(serde_yaml::from_value(value)?),
            Some("ClusterRoleBinding") if name.ends_with("-metrics-reader") => {
                binding = Some(serde_yaml::from_value(value)?)
            }
            _ => {}
        }
    }
    Ok((
        role.context("no metrics-reader ClusterRole")?,
        binding.context("no metrics-reader ClusterRoleBinding")?,
    ))
}

/// A token of ServiceAccount `monitoring/<name>` (created here), in a file.
async fn service_account_token(cp: &ControlPlane, name: &str) -> Result<std::path::PathBuf> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cp.client(), MONITORING);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    accounts.create(&PostParams::default(), &account).await?;
    let token = common::service_account_token(&cp.client(), MONITORING, name).await?;
    let file = cp.log_dir().join(format!("token-{name}"));
    std::fs::write(&file, token)?;
    Ok(file)
}

/// Waits until Prometheus's scrapes of job `job` fail with `status`.
async fn scrape_fails_with(prometheus: &Prometheus, job: &str, status: &str) -> Result<()> {
    common::eventually(
        Duration::from_secs(30),
        &format!("job {job} answered {status}"),
        || async {
            let targets = prometheus.targets().await?;
            let target = targets.iter().find(|t| t["scrapePool"] == job);
            let error = target
                .and_then(|t| t["lastError"].as_str())
                .unwrap_or_default();
            if error.contains(status) {
                eprintln!("{job}: {error}");
                return Ok(Some(()));
            }
            Err(anyhow::anyhow!("{job}: {target:?}"))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fires_the_charts_alerts() -> Result<()> {
    let started = Instant::now();
    // downFor is the one `for` the scenario waits out; 5s keeps it short.
    let monitoring = render_chart_monitoring(&["prometheusRule.downFor=5s"])?;
    let namespace = monitoring.namespace.as_str();
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let proxy = ChaosProxy::in_front_of(&cp).await?;
    cp.create_namespace(NS).await?;

    // Who may scrape: monitoring/prometheus through the chart's
    // metrics-reader ClusterRole; monitoring/stranger has no role.
    cp.create_namespace(MONITORING).await?;
    let (reader, binding) = metrics_reader_objects()?;
    Api::<ClusterRole>::all(cp.client())
        .create(&PostParams::default(), &reader)
        .await?;
    Api::<ClusterRoleBinding>::all(cp.client())
        .create(&PostParams::default(), &binding)
        .await?;
    let allowed_token = service_account_token(&cp, "prometheus").await?;
    let stranger_token = service_account_token(&cp, "stranger").await?;

    let [port, secure_port] = free_ports()?;
    let pki = cp.pki();
    let args = vec![
        format!("--kubeconfig={}", proxy.kubeconfig.display()),
        format!("--metrics-addr=127.0.0.1:{port}"),
        format!("--secure-metrics-addr=127.0.0.1:{secure_port}"),
        format!("--tls-cert-file={}", pki.serving_cert.display()),
        format!("--tls-private-key-file={}", pki.serving_key.display()),
        "--resync-interval=5s".to_string(),
    ];
    let log = cp.log_dir().join("endpoints-guard.log");
    let mut guard = Process::spawn("endpoints-guard", &common::endpoints_guard(), &args, &log)?;
    common::eventually(
        Duration::from_secs(60),
        "endpoints-guard /readyz",
        || async {
            Ok(matches!(
                loopback::request(port, "GET", "/readyz", "text/plain", "").await,
                Ok((200, _))
            )
            .then_some(()))
        },
    )
    .await
    .with_context(|| guard.log_tail(20))?;

    // The plain port serves the probes only.
    let (status, _) = loopback::request(port, "GET", "/metrics", "text/plain", "").await?;
    assert_eq!(status, 404, "/metrics over plain HTTP");
    let https = |token_file: Option<std::path::PathBuf>| Scheme::Https {
        ca_file: pki.ca_cert.clone(),
        server_name: String::new(),
        token_file,
    };
    let probe = |name: &str, token_file| Job {
        name: name.to_string(),
        targets: vec![Target {
            address: format!("127.0.0.1:{secure_port}"),
            labels: Default::default(),
        }],
        scheme: https(token_file),
    };
    let prometheus = Prometheus::scraping_endpoints_guard_with(
        &Prometheus::binary()?,
        &cp.log_dir().join("prometheus"),
        &monitoring,
        secure_port,
        "endpoints-guard-0",
        https(Some(allowed_token)),
        &[
            probe("no-role", Some(stranger_token)),
            probe("no-token", None),
        ],
    )
    .await
    .with_context(|| guard.log_tail(20))?;
    scrape_fails_with(&prometheus, "no-role", "403").await?;
    scrape_fails_with(&prometheus, "no-token", "401").await?;
    let alerts = alert_names(&monitoring.rules)?;
    assert_eq!(
        prometheus.alerting_rules().await?,
        alerts,
        "the rules Prometheus loaded"
    );

    // Exported at 0 before anything happened, so the first prevention is an increase.
    let selector = format!("{{namespace=\"{namespace}\", job=\"{}\"}}", monitoring.job);
    let prevented = format!("endpoints_guard_spurious_deletions_prevented_total{selector}");
    let series = prometheus.query(&prevented).await?;
    let zeros: BTreeSet<&str> = series
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["value"][1] == "0")
        .filter_map(|s| s["metric"]["reason"].as_str())
        .collect();
    assert_eq!(
        zeros,
        PREVENTION_REASONS.iter().copied().collect(),
        "every reason scraped at 0: {series}"
    );
    // Quiet: nothing fires. Until its first scrape (discovery hands targets
    // over after ~5 s) Down's absent(up) holds, so with a 5 s `for` it may
    // fire at start; it must clear. A counter alert, once firing, would stay.
    common::eventually(Duration::from_secs(30), "no alert firing", || async {
        let mut firing_now = Vec::new();
        for name in &alerts {
            if firing(&prometheus, name, &[]).await? > 0 {
                firing_now.push(name.clone());
            }
        }
        anyhow::ensure!(firing_now.is_empty(), "firing: {firing_now:?}");
        Ok(Some(()))
    })
    .await?;

    // (a) Failure A: a replayed old DELETE of the live Service `long`.
    let expected = failure_a_history(&cp, NS, "10.1.0.1", "10.1.1.1").await?;
    wait_for(&cp, &expected).await?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let replay = json!({"resource": "services", "namespace": NS, "name": "long", "pace_ms": 400});
    proxy.post("/actions/replay-old-delete", replay).await?;
    let fault = Instant::now();
    let alert = prometheus
        .wait_for_firing(
            "EndpointsGuardSpuriousDeletionsPrevented",
            &[("namespace", namespace)],
            ALERT_TIMEOUT,
        )
        .await
        .with_context(|| guard.log_tail(20))?;
    eprintln!("(a) after {:.1}s: {alert}", fault.elapsed().as_secs_f64());
    let value: f64 = alert["value"].as_str().context("alert value")?.parse()?;
    assert!(value >= 1.0, "{alert}");
    let long = Api::<Endpoints>::namespaced(cp.client(), NS)
        .get_opt("long")
        .await?;
    assert!(
        long.is_some(),
        "the Endpoints of the live Service long were deleted"
    );

    // (b) A pod delete the watch never delivers; the 5 s resync finds it.
    let drift = [
        ("namespace", namespace),
        ("resource", "pods"),
        ("kind", "missed_delete"),
    ];
    assert_eq!(
        firing(&prometheus, "EndpointsGuardResyncDrift", &drift).await?,
        0
    );
    cp.create_pod_with_status(
        PodBuilder::serving(NS, "spare", "spare"),
        PodStatusSpec::ready(["10.1.2.1"]),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.fault("pods", "drop-deletes", json!({})).await?;
    cp.force_delete_pod(NS, "spare").await?;
    let fault = Instant::now();
    let alert = prometheus
        .wait_for_firing("EndpointsGuardResyncDrift", &drift, ALERT_TIMEOUT)
        .await
        .with_context(|| guard.log_tail(20))?;
    eprintln!("(b) after {:.1}s: {alert}", fault.elapsed().as_secs_f64());
    let dropped = proxy.stat("pods", "deletes_dropped").await;
    assert!(
        dropped >= 1,
        "watch-chaos dropped no pod delete: the drift was not a lost event"
    );
    proxy.clear_faults().await?;

    // (d) Every dashboard query parses and returns data.
    for (title, expr) in dashboard_queries(&monitoring)? {
        let result = prometheus.query(&expr).await?;
        let empty = result.as_array().is_some_and(Vec::is_empty);
        if empty || result.is_null() {
            bail!("dashboard panel {title}: {expr} returned nothing");
        }
    }

    // (c) The controller killed: no target answers; Down after its 5 s.
    // By the metrics Service's name (the `service` label), not by `job`.
    let not_ready = [
        ("namespace", namespace),
        ("service", monitoring.job.as_str()),
    ];
    assert_eq!(
        firing(&prometheus, "EndpointsGuardDown", &not_ready).await?,
        0
    );
    guard.kill();
    let fault = Instant::now();
    let alert = prometheus
        .wait_for_firing("EndpointsGuardDown", &not_ready, ALERT_TIMEOUT)
        .await?;
    eprintln!("(c) after {:.1}s: {alert}", fault.elapsed().as_secs_f64());
    eprintln!("whole test {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
