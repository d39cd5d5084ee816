//! `make demo`: start a local control plane, run the endpoints-guard binary
//! against it, create a small workload, and show what came of it: the
//! Endpoints and EndpointSlices, and a few metric lines; then failure A
//! replayed to each controller beside upstream's, for Endpoints (a Service
//! DELETE) and for EndpointSlices (a pod DELETE). Asks nothing, exits 0 when
//! everything worked.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_chaos::{ChaosProxy, Observer, SERVICE_NAME_LABEL, failure_a_history};
use eg_chart::prometheus::{Prometheus, render_chart_monitoring};
use eg_harness::binaries::workspace_root;
use eg_harness::loopback;
use eg_harness::process::{Process, free_port};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use k8s_openapi::api::core::v1::{Endpoints, Node};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};

fn controller_binary() -> Result<PathBuf> {
    release_binary("EG_BINARY", "endpoints-guard")
}

/// A GET on loopback: status code and body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    loopback::request(port, "GET", path, "text/plain", "").await
}

fn release_binary(env: &str, name: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let path = workspace_root()?.join("target/release").join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p endpoints-guard -p watch-chaos --bins` (make demo does)",
            path.display()
        );
    }
    Ok(path)
}

/// Drops terminal colour codes from a log line.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What one controller did in the failure-A replay.
struct Outcome {
    spurious: Vec<String>,
    long_endpoints: String,
}

/// A Prometheus scraping endpoints-guard on `port` as the chart's
/// ServiceMonitor would, with the chart's rules; None (said why) when the
/// binary is missing.
async fn start_prometheus(cp: &ControlPlane, port: u16) -> Result<Option<Prometheus>> {
    let binary = match Prometheus::binary() {
        Ok(binary) => binary,
        Err(err) => {
            println!("    Prometheus is not available, so no alert is shown: {err:#}");
            return Ok(None);
        }
    };
    let monitoring = render_chart_monitoring(&[])?;
    let prometheus = Prometheus::scraping_endpoints_guard(
        &binary,
        &cp.log_dir().join("prometheus"),
        &monitoring,
        port,
        "demo",
    )
    .await?;
    println!(
        "    Prometheus {} on 127.0.0.1:{} scrapes it (job {}, the chart's alert rules, every 1 s)",
        binary.display(),
        prometheus.port,
        monitoring.job
    );
    Ok(Some(prometheus))
}

/// The spurious-deletion alert as Prometheus's alerts API reports it, once it fires.
async fn prevented_alert(prometheus: &Prometheus) -> Result<String> {
    let alert = prometheus
        .wait_for_firing(
            "EndpointsGuardSpuriousDeletionsPrevented",
            &[],
            Duration::from_secs(30),
        )
        .await?;
    let labels: Vec<String> = alert["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k != "alertname")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(format!(
        "{} {} {{{}}} since {}: {}",
        alert["labels"]["alertname"].as_str().unwrap_or_default(),
        alert["state"].as_str().unwrap_or_default(),
        labels.join(", "),
        alert["activeAt"].as_str().unwrap_or_default(),
        alert["annotations"]["description"]
            .as_str()
            .unwrap_or_default()
    ))
}

/// Failure A through watch-chaos, once with endpoints-guard and once with
/// kube-controller-manager's endpoints controller behind the same proxy: the
/// proxy sends the controller's Service watch a DELETE of the live, long-lived
/// Service `long` carrying that Service's old resourceVersion (as API servers
/// before kubernetes#58547 did) and ends the stream; a client that resumes
/// from that RV gets the API server's replay of every Service event since.
async fn replay_failure_a(cp: &ControlPlane, proxy: &ChaosProxy) -> Result<()> {
    let mut outcomes = Vec::new();
    let mut seen = Vec::new();
    for (ns, upstream) in [("replay-guard", false), ("replay-upstream", true)] {
        let who = if upstream {
            "kube-controller-manager"
        } else {
            "endpoints-guard"
        };
        step(&format!("{who} behind watch-chaos, namespace {ns}"));
        cp.create_namespace(ns).await?;
        let observer = Observer::start(&cp.client(), ns);
        let port = free_port()?;
        let log = cp.log_dir().join(format!("{who}-replay.log"));
        let which = Pair {
            upstream: "endpoints-controller",
            guard: "endpoints",
        };
        let mut controller = which.start(cp, proxy, upstream, ns, port, &log)?;
        let prometheus = match upstream {
            false => start_prometheus(cp, port).await?,
            true => None,
        };
        println!(
            "    Service long (the oldest), then Service b created, deleted and created again"
        );
        let expected = failure_a_history(cp, ns, "10.0.1.10", "10.0.1.20").await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while expected.check(&cp.client(), ns).await?.is_some() {
            if Instant::now() > deadline {
                bail!(
                    "{who} did not write the Endpoints; its log:\n{}",
                    controller.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = proxy
            .post(
                "/actions/replay-old-delete",
                serde_json::json!({"resource": "services", "namespace": ns, "name": "long", "pace_ms": 400}),
            )
            .await?;
        println!("    POST /actions/replay-old-delete {ns}/long → {answer}");
        tokio::time::sleep(Duration::from_secs(6)).await;
        let long = Api::<Endpoints>::namespaced(cp.client(), ns)
            .get_opt("long")
            .await?;
        let long_endpoints = match long {
            Some(ep) => {
                let n = ep
                    .subsets
                    .iter()
                    .flatten()
                    .flat_map(|s| s.addresses.iter().flatten())
                    .count();
                format!("present ({n} address)")
            }
            None => "MISSING".to_string(),
        };
        if !upstream {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            println!("    endpoints-guard log:");
            for line in text.lines().filter(|l| l.contains("prevented")) {
                println!("      {}", plain(line));
            }
            println!("    Event on Service {ns}/long:");
            let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.client(), ns);
            for e in events.list(&Default::default()).await?.items {
                if e.reason.as_deref() == Some("SpuriousDeletionPrevented") {
                    let about = e
                        .regarding
                        .as_ref()
                        .and_then(|r| r.name.clone())
                        .unwrap_or_default();
                    println!(
                        "      {} {} Service/{about}: {}",
                        e.type_.unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.note.unwrap_or_default()
                    );
                }
            }
            let (_, metrics) = http_get(port, "/metrics").await?;
            println!("    metric:");
            for line in metrics
                .lines()
                .filter(|l| !l.starts_with('#') && l.contains("prevented"))
            {
                println!("      {line}");
                if !line.ends_with(" 0") {
                    seen.push(format!("metric: {line}"));
                }
            }
            if let Some(prometheus) = &prometheus {
                let alert = prevented_alert(prometheus).await?;
                println!("    alert (Prometheus /api/v1/alerts):\n      {alert}");
                seen.push(format!("alert:  {alert}"));
            } else {
                seen.push(
                    "alert:  not shown: Prometheus is missing (make controlplane builds it)".into(),
                );
            }
        }
        let spurious = observer.spurious_deletions();
        println!(
            "    Endpoints deleted while their Service existed (seen by a direct watch): {spurious:?}"
        );
        println!("    Endpoints {ns}/long 6 s after the replay: {long_endpoints}");
        controller.stop().await?;
        outcomes.push(Outcome {
            spurious,
            long_endpoints,
        });
    }
    step("side by side: the same failure-A replay");
    let header = ("", "endpoints-guard", "kube-controller-manager");
    println!("    {:<52} {:<22} {}", header.0, header.1, header.2);
    let [guard, upstream] = [&outcomes[0], &outcomes[1]];
    println!(
        "    {:<52} {:<22} {}",
        "Endpoints deleted while their Service existed",
        guard.spurious.len(),
        upstream.spurious.len()
    );
    println!(
        "    {:<52} {:<22} {}",
        "Endpoints of the live Service long afterwards",
        guard.long_endpoints,
        upstream.long_endpoints
    );
    step("what the operator of endpoints-guard sees");
    for line in seen {
        println!("    {line}");
    }
    Ok(())
}

/// The addresses in the EndpointSlices of Service `service`, ready or not.
async fn slice_addresses(cp: &ControlPlane, ns: &str, service: &str) -> Result<Vec<String>> {
    let params = ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={service}"));
    let mut ips: Vec<String> = Api::<EndpointSlice>::namespaced(cp.client(), ns)
        .list(&params)
        .await?
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    ips.sort();
    Ok(ips)
}

/// A replayed pod DELETE against each EndpointSlice controller in turn, both
/// behind watch-chaos: the proxy sends the controller's pod watch a DELETE of
/// the live pod web-0 carrying its old resourceVersion, and the watch resumes
/// from there. Both caches drop the pod; upstream takes its endpoint out of
/// the slice, endpoints-guard first reads the pod live, finds it, puts it
/// back in its cache and leaves the slice as it is.
async fn replay_pod_delete_for_slices(cp: &ControlPlane, proxy: &ChaosProxy) -> Result<()> {
    let mut rows = Vec::new();
    for (ns, upstream) in [("slices-guard", false), ("slices-upstream", true)] {
        let who = if upstream {
            "kube-controller-manager (endpointslice-controller)"
        } else {
            "endpoints-guard (--controllers=endpointslices)"
        };
        step(&format!("{who} behind watch-chaos, namespace {ns}"));
        cp.create_namespace(ns).await?;
        let port = free_port()?;
        let log = cp.log_dir().join(format!("slices-{ns}.log"));
        let which = Pair {
            upstream: "endpointslice-controller",
            guard: "endpointslices",
        };
        let mut controller = which.start(cp, proxy, upstream, ns, port, &log)?;
        cp.create_service(
            ServiceBuilder::new(ns, "web")
                .selector("app", "web")
                .port("http", 80, 8080, "TCP"),
        )
        .await?;
        let want = ["10.0.2.10", "10.0.2.11"];
        for (i, ip) in want.iter().enumerate() {
            cp.create_pod_with_status(
                PodBuilder::serving(ns, &format!("web-{i}"), "web"),
                PodStatusSpec::ready([*ip]),
            )
            .await?;
        }
        println!("    Service web, pods web-0 10.0.2.10 and web-1 10.0.2.11 (Ready, on node-a)");
        let deadline = Instant::now() + Duration::from_secs(60);
        while slice_addresses(cp, ns, "web").await? != want {
            if Instant::now() > deadline {
                bail!(
                    "{who} did not write the slice; its log:\n{}",
                    controller.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("    slice endpoints: {want:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = proxy
            .post(
                "/actions/replay-old-delete",
                serde_json::json!({"resource": "pods", "namespace": ns, "name": "web-0"}),
            )
            .await?;
        println!("    POST /actions/replay-old-delete pods {ns}/web-0 → {answer}");
        tokio::time::sleep(Duration::from_secs(6)).await;
        let after = slice_addresses(cp, ns, "web").await?;
        println!("    slice endpoints 6 s after the replayed DELETE: {after:?}");
        if !upstream {
            // The replayed DELETE carries the RV of the version of web-0 the
            // cache holds, so it takes the pod out of the cache; the slice
            // loses the endpoint only once a live read confirms the pod gone.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            println!("    endpoints-guard log:");
            for line in text.lines().filter(|l| l.contains("pod still exists")) {
                println!("      {}", plain(line));
            }
            let (_, metrics) = http_get(port, "/metrics").await?;
            println!("    metrics:");
            for line in metrics.lines().filter(|l| {
                !l.starts_with('#')
                    && ((l.contains("stale_events_ignored_total") && l.contains("pods"))
                        || l.contains("pod_deletions_held_total")
                        || (l.contains("prevented") && l.contains("endpointslices")))
            }) {
                println!("      {line}");
            }
        }
        controller.stop().await?;
        rows.push(after.contains(&"10.0.2.10".to_string()));
    }
    step("side by side: the same replayed pod DELETE");
    let cell = |kept: bool| if kept { "kept" } else { "REMOVED" };
    let header = ("", "endpoints-guard", "kube-controller-manager");
    println!("    {:<52} {:<22} {}", header.0, header.1, header.2);
    println!(
        "    {:<52} {:<22} {}",
        "the live pod web-0 in its Service's EndpointSlice",
        cell(rows[0]),
        cell(rows[1])
    );
    Ok(())
}

/// One controller of each side for a replay: kube-controller-manager's
/// `upstream` controller, or endpoints-guard's `--controllers=guard`.
struct Pair {
    upstream: &'static str,
    guard: &'static str,
}

impl Pair {
    /// Starts one side behind watch-chaos: upstream, or endpoints-guard on
    /// namespace `ns` with its metrics on `port` and its log in `log`.
    fn start(
        &self,
        cp: &ControlPlane,
        proxy: &ChaosProxy,
        upstream: bool,
        ns: &str,
        port: u16,
        log: &std::path::Path,
    ) -> Result<Process> {
        let kubeconfig = format!("--kubeconfig={}", proxy.kubeconfig.display());
        if upstream {
            return cp.start_controller_manager(self.upstream, &[&kubeconfig]);
        }
        let args = vec![
            kubeconfig,
            format!("--namespace={ns}"),
            format!("--metrics-addr=127.0.0.1:{port}"),
            format!("--controllers={}", self.guard),
        ];
        Process::spawn("endpoints-guard", &controller_binary()?, &args, log)
    }
}

fn step(text: &str) {
    println!("\n==> {text}");
}

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    step("starting a local control plane (etcd + kube-apiserver on 127.0.0.1)");
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    println!(
        "    API server {}  (logs in {})",
        cp.server_url(),
        cp.log_dir().display()
    );

    step("starting endpoints-guard");
    let port = free_port()?;
    let binary = controller_binary()?;
    let args: Vec<String> = [
        "--kubeconfig",
        &cp.kubeconfig_path().display().to_string(),
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--resync-interval",
        "30s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut guard = Process::spawn(
        "endpoints-guard",
        &binary,
        &args,
        &cp.log_dir().join("endpoints-guard.log"),
    )?;
    println!("    {} {}", binary.display(), args.join(" "));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = http_get(port, "/readyz").await {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "endpoints-guard did not become ready; its log:\n{}",
                guard.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("    ready (/readyz answers 200)");

    step(
        "creating Node node-a (zone-a), namespace demo: Service web (ports http, metrics) and three pods",
    );
    // The EndpointSlice controller takes an endpoint's zone from its Node,
    // and leaves out pods on a Node that does not exist.
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}}
    }))?;
    Api::<Node>::all(cp.client())
        .create(&PostParams::default(), &node)
        .await
        .context("creating Node node-a")?;
    cp.create_namespace("demo").await?;
    cp.create_service(
        ServiceBuilder::new("demo", "web")
            .selector("app", "web")
            .named_port("http", 80, "http", "TCP")
            .port("metrics", 9090, 9090, "TCP"),
    )
    .await?;
    for (name, ip, ready) in [
        ("web-0", "10.0.0.10", true),
        ("web-1", "10.0.0.11", true),
        ("web-2", "10.0.0.12", false),
    ] {
        cp.create_pod_with_status(
            PodBuilder::serving("demo", name, "web"),
            PodStatusSpec::running([ip], ready),
        )
        .await?;
        println!(
            "    pod {name} ip {ip} {}",
            if ready { "Ready" } else { "not ready" }
        );
    }

    step("Endpoints demo/web as endpoints-guard wrote them");
    let api: Api<Endpoints> = Api::namespaced(cp.client(), "demo");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ep = loop {
        if let Some(ep) = api.get_opt("web").await? {
            let s = ep.subsets.as_ref().and_then(|s| s.first());
            let ready = s.and_then(|s| s.addresses.as_ref()).map_or(0, Vec::len);
            let not_ready = s
                .and_then(|s| s.not_ready_addresses.as_ref())
                .map_or(0, Vec::len);
            if ready == 2 && not_ready == 1 {
                break ep;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "Endpoints demo/web did not converge; endpoints-guard log:\n{}",
                guard.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut shown = ep.clone();
    shown.metadata.managed_fields = None;
    print!(
        "{}",
        serde_yaml::to_string(&shown).context("rendering Endpoints")?
    );

    step("EndpointSlices of demo/web as endpoints-guard wrote them");
    let deadline = Instant::now() + Duration::from_secs(30);
    while slice_addresses(&cp, "demo", "web").await?.len() != 3 {
        if Instant::now() > deadline {
            bail!(
                "the EndpointSlice of demo/web did not converge; endpoints-guard log:\n{}",
                guard.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let params = ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=web"));
    for mut slice in Api::<EndpointSlice>::namespaced(cp.client(), "demo")
        .list(&params)
        .await?
        .items
    {
        slice.metadata.managed_fields = None;
        print!(
            "{}",
            serde_yaml::to_string(&slice).context("rendering EndpointSlice")?
        );
    }

    step("a few metric lines from /metrics");
    let (_, metrics) = http_get(port, "/metrics").await?;
    for line in metrics.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("endpoints_guard_endpoints_writes_total")
                || l.starts_with("endpoints_guard_endpointslice_writes_total")
                || l.starts_with("endpoints_guard_cache_objects")
                || l.starts_with("endpoints_guard_reconciles_total")
                || l.starts_with("endpoints_guard_spurious_deletions_prevented_total"))
    }) {
        println!("    {line}");
    }

    step("stopping endpoints-guard (SIGTERM)");
    guard.stop().await?;

    step(
        "failure A replayed through watch-chaos (a proxy between the controller and kube-apiserver)",
    );
    let chaos = release_binary("EG_CHAOS_BINARY", "watch-chaos")?;
    let proxy = ChaosProxy::start(&cp, &chaos, "watch-chaos").await?;
    println!(
        "    {} on 127.0.0.1:{} (control API 127.0.0.1:{})",
        chaos.display(),
        proxy.proxy_port,
        proxy.control_port
    );
    replay_failure_a(&cp, &proxy).await?;

    step("EndpointSlices: a replayed pod DELETE through watch-chaos");
    replay_pod_delete_for_slices(&cp, &proxy).await?;

    step("stopping the control plane");
    drop(cp);
    println!("\ndemo finished in {:.0}s", started.elapsed().as_secs_f64());
    Ok(())
}
