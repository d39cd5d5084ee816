//! A production control plane under pressure (the HA harness: three etcd
//! members, two kube-apiservers behind HAProxy, API Priority and Fairness on
//! with seats two cores can fill), both controllers side by side, each as
//! production runs it: kube-controller-manager as its own user with its
//! controllers' kube-system ServiceAccounts, endpoints-guard as the chart
//! installs it (its ServiceAccount, RBAC and, in the second phase, its
//! FlowSchemas), in opt-in scope so each publishes its own Service.
//!
//! The row: a co-tenant (another namespace's ServiceAccount) floods the
//! API servers with LISTs and GETs of pods, bounded in count and time, while
//! a pod of each Service flips ready and not ready. Judged per phase (without
//! and with the chart's FlowSchemas) and per controller: the time from the
//! pod's status write to its Endpoints showing it (p50, p99; seen by an
//! exempt watch), the leader changes of its Lease, and how long its requests
//! waited in APF queues (kube-apiserver's own histogram). The test asserts
//! what must hold (every flip published, no leader change of endpoints-guard
//! with its FlowSchemas, the flood filled the queues); the latencies are a
//! report, target/chaos/overload.json (docs/chaos.md), never a timing
//! assertion.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use eg_harness::binaries::{program, workspace_root};
use eg_harness::process::{Process, free_port};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

use crate::co_tenant::{self, CoTenant, Filler, FloodCounts, apf_waits, percentile};
use crate::common::{endpoints_guard, eventually, service_account_token};

const NS: &str = "shop";
const SYSTEM_NS: &str = "endpoints-guard";
/// Pods the co-tenant lists over and over: enough for a LIST to be charged
/// several seats.
const FILLER_PODS: usize = 3000;
/// The flood's concurrent clients, and the most requests it sends in all.
const FLOOD_CLIENTS: usize = 24;
const FLOOD_MAX_REQUESTS: u64 = 50_000;
/// The two Services: the one endpoints-guard publishes (opted in) and the
/// one kube-controller-manager does.
const GUARDED: &str = "guarded";
const PLAIN: &str = "plain";

/// How long each part of a phase lasts.
fn durations() -> (usize, Duration) {
    match std::env::var("EG_CHAOS").as_deref() {
        Ok("full") => (10, Duration::from_secs(90)),
        _ => (5, Duration::from_secs(25)),
    }
}

#[derive(Debug, Default, serde::Serialize)]
struct Column {
    /// Flip → published, quiet and under the flood (ms).
    quiet_p50_ms: f64,
    quiet_p99_ms: f64,
    flood_p50_ms: f64,
    flood_p99_ms: f64,
    flips: usize,
    leader_changes: i64,
    /// Mean wait in APF queues of its requests during the flood (ms), from
    /// kube-apiserver's `apiserver_flowcontrol_request_wait_duration_seconds`.
    apf_wait_mean_ms: f64,
}

#[derive(Debug, serde::Serialize)]
struct Phase {
    flow_schemas: bool,
    endpoints_guard: Column,
    kube_controller_manager: Column,
    flood: FloodCounts,
    /// Mean wait of the co-tenant's requests (ms): the flood filled its queues.
    flood_apf_wait_mean_ms: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apf_overload_by_a_co_tenant() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::highly_available()).await?;
    let admin = cp.client();
    cp.create_namespace(NS).await?;
    let mut kcm_args = cp.kube_controller_manager_identity()?;
    kcm_args.extend([
        "--leader-elect=true".to_string(),
        "--leader-elect-resource-namespace=kube-system".to_string(),
    ]);
    let kcm_args: Vec<&str> = kcm_args.iter().map(String::as_str).collect();
    let _kcm = cp.start_controller_manager("endpoints-controller", &kcm_args)?;
    helm(
        &cp,
        &[
            "install",
            "endpoints-guard",
            "--create-namespace",
            "--set",
            "flowSchemas.enabled=false",
        ],
    )?;
    let mut guard = start_guard(&cp).await?;
    workload(&cp).await?;
    let flood = CoTenant::create(&cp, Filler::Pods, FILLER_PODS).await?;

    let mut phases = Vec::new();
    for flow_schemas in [false, true] {
        if flow_schemas {
            helm(
                &cp,
                &[
                    "upgrade",
                    "endpoints-guard",
                    "--reuse-values",
                    "--set",
                    "flowSchemas.enabled=true",
                ],
            )?;
        }
        guard.ensure_running()?;
        let phase = run_phase(&cp, &admin, &flood, flow_schemas).await?;
        eprintln!("pressure: {phase:?}");
        phases.push(phase);
    }
    guard.ensure_running()?;
    let out = workspace_root()?.join("target/chaos");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("overload.json"),
        serde_json::to_string_pretty(&json!({"phases": phases}))?,
    )?;
    let with = &phases[1];
    ensure!(
        with.endpoints_guard.leader_changes == 0,
        "endpoints-guard changed leader {} times with its FlowSchemas",
        with.endpoints_guard.leader_changes
    );
    ensure!(
        phases.iter().all(|p| p.flood.failed == 0),
        "the flood's requests failed: {phases:?}"
    );
    ensure!(
        phases.iter().all(|p| p.flood_apf_wait_mean_ms > 0.0),
        "the flood never queued: the row proves nothing ({phases:?})"
    );
    Ok(())
}

/// `helm <args>` on the repository's chart in endpoints-guard's namespace.
fn helm(cp: &ControlPlane, args: &[&str]) -> Result<()> {
    let chart = workspace_root()?.join("charts/endpoints-guard");
    let mut command = Command::new(program("helm")?);
    command.args(&args[..2]).arg(&chart).args(&args[2..]);
    command.args(["--namespace", SYSTEM_NS, "--set", "scope=opt-in"]);
    command.arg("--kubeconfig").arg(cp.kubeconfig_path());
    let out = command.output().context("running helm")?;
    ensure!(
        out.status.success(),
        "helm {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The endpoints-guard binary with the chart's ServiceAccount, in opt-in
/// scope with leader election, as the chart runs it.
async fn start_guard(cp: &ControlPlane) -> Result<Process> {
    let token = service_account_token(&cp.client(), SYSTEM_NS, "endpoints-guard").await?;
    let kubeconfig = cp.kubeconfig_for_token("endpoints-guard-sa", &token)?;
    let args: Vec<String> = [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--scope",
        "opt-in",
        "--metrics-addr",
        &format!("127.0.0.1:{}", free_port()?),
        "--leader-elect",
        "--leader-election-namespace",
        SYSTEM_NS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Process::spawn(
        "endpoints-guard",
        &endpoints_guard(),
        &args,
        &cp.log_dir().join("endpoints-guard-pressure.log"),
    )
}

/// Two Services of three ready pods each (one opted in).
async fn workload(cp: &ControlPlane) -> Result<()> {
    let services: Api<Service> = Api::namespaced(cp.client(), NS);
    let service = |name: &str, opted_in: bool| -> Result<Service> {
        let mut manifest = json!({"metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
        if opted_in {
            manifest["metadata"]["labels"] = json!({"endpoints-guard/opt-in": "true",
                "endpointslice.kubernetes.io/skip-mirror": "true"});
            manifest["metadata"]["annotations"] =
                json!({"endpoints-guard/selector": format!(r#"{{"app":"{name}"}}"#)});
        } else {
            manifest["spec"]["selector"] = json!({"app": name});
        }
        Ok(serde_json::from_value(manifest)?)
    };
    services
        .create(&PostParams::default(), &service(GUARDED, true)?)
        .await?;
    services
        .create(&PostParams::default(), &service(PLAIN, false)?)
        .await?;
    for (app, octet) in [(GUARDED, 1), (PLAIN, 2)] {
        for i in 0..3 {
            cp.create_pod_with_status(
                PodBuilder::serving(NS, &format!("{app}-{i}"), app),
                PodStatusSpec::ready([format!("10.2.{octet}.{}", i + 1)]),
            )
            .await?;
        }
    }
    for (name, ready) in [(GUARDED, 3), (PLAIN, 3)] {
        eventually(
            Duration::from_secs(60),
            &format!("{name} published"),
            || async {
                Ok((ready_ips(&Api::namespaced(cp.client(), NS), name)
                    .await?
                    .len()
                    == ready)
                    .then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// The ready addresses of Endpoints `name`.
async fn ready_ips(api: &Api<Endpoints>, name: &str) -> Result<Vec<String>> {
    Ok(api
        .get_opt(name)
        .await?
        .map(|ep| eg_harness::ready_ips(&ep))
        .unwrap_or_default())
}

/// One phase: flips without the flood, then with it; latencies, leader
/// changes and APF waits.
async fn run_phase(
    cp: &ControlPlane,
    admin: &Client,
    flood: &CoTenant,
    flow_schemas: bool,
) -> Result<Phase> {
    let (quiet_flips, flood_for) = durations();
    let leases = [
        ("endpoints-guard", SYSTEM_NS, "endpoints-guard"),
        (
            "kube-controller-manager",
            "kube-system",
            "kube-controller-manager",
        ),
    ];
    let transitions_before = co_tenant::lease_transitions(admin, &leases).await?;
    let quiet = flips(cp, admin, quiet_flips, None).await?;
    let deadline = Instant::now() + flood_for;
    let flooding = flood.flood(FLOOD_CLIENTS, deadline, FLOOD_MAX_REQUESTS);
    let waits_start = apf_waits(cp).await?;
    let under = flips(cp, admin, usize::MAX, Some(deadline)).await?;
    let counts = flooding.finish().await?;
    let waits_end = apf_waits(cp).await?;
    let transitions_after = co_tenant::lease_transitions(admin, &leases).await?;
    let guard_schema = if flow_schemas {
        "endpoints-guard-workload"
    } else {
        "service-accounts"
    };
    let column = |latencies: (&[f64], &[f64]), leader: &str, schema: &str| Column {
        quiet_p50_ms: percentile(latencies.0, 0.50),
        quiet_p99_ms: percentile(latencies.0, 0.99),
        flood_p50_ms: percentile(latencies.1, 0.50),
        flood_p99_ms: percentile(latencies.1, 0.99),
        flips: latencies.1.len(),
        leader_changes: transitions_after.get(leader).copied().unwrap_or_default()
            - transitions_before.get(leader).copied().unwrap_or_default(),
        apf_wait_mean_ms: waits_end.mean_ms_since(&waits_start, schema),
    };
    Ok(Phase {
        flow_schemas,
        endpoints_guard: column((&quiet.0, &under.0), "endpoints-guard", guard_schema),
        kube_controller_manager: column(
            (&quiet.1, &under.1),
            "kube-controller-manager",
            "kube-system-service-accounts",
        ),
        flood: counts,
        flood_apf_wait_mean_ms: waits_end.mean_ms_since(&waits_start, "service-accounts"),
    })
}

/// Flips pod `<app>-1` of each Service not ready and ready again, `count`
/// times or until `deadline`; returns the flip → published latencies (ms)
/// of endpoints-guard's Service and of kube-controller-manager's, seen by
/// a watch of the admin (exempt from APF: its view is not queued).
async fn flips(
    cp: &ControlPlane,
    admin: &Client,
    count: usize,
    deadline: Option<Instant>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let endpoints: Api<Endpoints> = Api::namespaced(admin.clone(), NS);
    let (store, writer) = kube::runtime::reflector::store();
    let watch = tokio::spawn(
        kube::runtime::reflector(writer, watcher(endpoints, watcher::Config::default()))
            .default_backoff()
            .for_each(|_| async {}),
    );
    store.wait_until_ready().await?;
    let ready_of = |name: &str| -> Vec<String> {
        store
            .state()
            .iter()
            .find(|ep| ep.metadata.name.as_deref() == Some(name))
            .map(|ep| eg_harness::ready_ips(ep))
            .unwrap_or_default()
    };
    let (mut guarded, mut plain) = (Vec::new(), Vec::new());
    let mut ready = true;
    let mut done = 0;
    while done < count && deadline.is_none_or(|d| Instant::now() < d) {
        ready = !ready;
        let started = Instant::now();
        for (app, octet) in [(GUARDED, 1), (PLAIN, 2)] {
            cp.set_pod_ready(NS, &format!("{app}-1"), &format!("10.2.{octet}.2"), ready)
                .await?;
        }
        let want = if ready { 3 } else { 2 };
        let (mut seen_guarded, mut seen_plain) = (None, None);
        while seen_guarded.is_none() || seen_plain.is_none() {
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "a flip not published within 60 s (guarded {seen_guarded:?}, plain {seen_plain:?})"
            );
            if seen_guarded.is_none() && ready_of(GUARDED).len() == want {
                seen_guarded = Some(started.elapsed());
            }
            if seen_plain.is_none() && ready_of(PLAIN).len() == want {
                seen_plain = Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        guarded.extend(seen_guarded.map(|d| d.as_secs_f64() * 1000.0));
        plain.extend(seen_plain.map(|d| d.as_secs_f64() * 1000.0));
        done += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    watch.abort();
    Ok((guarded, plain))
}
