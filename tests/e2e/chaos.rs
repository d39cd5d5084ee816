//! The watch-chaos scenario matrix: every scenario runs on a fresh real control
//! plane, once with endpoints-guard and once with kube-controller-manager's
//! endpoints controller, both behind the `watch-chaos` proxy. Spurious
//! Endpoints deletions are counted by watches straight to kube-apiserver.
//!
//! `cargo test --test e2e chaos::` runs the fast subset; `EG_CHAOS=full` (make
//! chaos) runs them all. Reports: `target/chaos/report.{json,md}` (full) or
//! `target/chaos/fast/` (subset).

mod env;
mod scenarios;
mod store_faults;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{self, Guard};
use anyhow::{Context, Result};
use eg_chaos::{ChaosProxy, Observer, Published, Row, watch_convergence, write_report};
use eg_harness::binaries::workspace_root;
use eg_harness::loopback;
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use env::{Env, Which};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::Api;
use scenarios::{note, scenario};
use serde_json::json;

const NS: &str = "chaos";

/// The prefix of a row that reads EndpointSlices (the controllers run their
/// EndpointSlice controller alone).
const SLICES: &str = "slices/";

const FAST: [&str; 3] = [
    "failure-a-delete-oldest-service",
    "lost-pod-delete",
    "slices/failure-a-old-delete-of-live-pod",
];
/// A DELETE lost by the watch cache of one of two API servers: the
/// controllers talk to that one (docs/ghosts.md).
const TWO_API_SERVERS: &str = "watch-cache-lost-pod-delete-two-apiservers";

const FULL: [&str; 34] = [
    "failure-a-delete-oldest-service",
    "failure-a-old-delete-of-live-service",
    "failure-b-compaction-and-prevkv-nil",
    "lost-service-delete",
    "lost-pod-delete",
    "stale-rv0-list-on-restart",
    "reordered-service-updates",
    "cut-streams-mid-event",
    "apiserver-restart",
    "etcd-restore-plain",
    "etcd-restore-bump-revision",
    "watch-cache-lost-pod-delete",
    TWO_API_SERVERS,
    "endpoints-writes-denied-past-retries",
    "bare-404-on-get",
    "slices/lost-pod-delete",
    "slices/reordered-service-updates",
    "slices/failure-a-delete-oldest-service",
    "slices/failure-a-old-delete-of-live-pod",
    "slices/failure-b-compaction-and-prevkv-nil",
    "slices/apiserver-restart",
    "slices/service-and-pods-recreated",
    "slices/node-delete-replayed",
    "slices/node-added-unseen",
    "etcd-leader-stopped",
    "slices/etcd-leader-stopped",
    "etcd-member-partitioned",
    "slices/etcd-member-partitioned",
    "apiserver-watch-stalled",
    "slices/apiserver-watch-stalled",
    "half-open-pod-watch",
    "slices/half-open-pod-watch",
    "ready-flip-own-writes-lagging",
    "slices/ready-flip-own-writes-lagging",
];

/// How long a row is watched after its fault began: longer where the fault
/// itself takes a while (restarts, a denial that outlasts the retries).
fn window(row: &str, default: Duration) -> Duration {
    match row.strip_prefix(SLICES).unwrap_or(row) {
        "etcd-restore-plain" | "etcd-restore-bump-revision" => Duration::from_secs(60),
        // kube-apiserver's own writes may fail for a minute or more while its
        // etcd client gives up on the stalled member.
        "etcd-leader-stopped" | "etcd-member-partitioned" => Duration::from_secs(240),
        // The silence limit after the last bookmark (150 s), bookmarks a
        // minute apart, and a margin.
        "half-open-pod-watch" => Duration::from_secs(240),
        "node-added-unseen" => Duration::from_secs(60),
        "apiserver-watch-stalled" => Duration::from_secs(120),
        "watch-cache-lost-pod-delete" => Duration::from_secs(40),
        // kube-apiserver's check every 5 to 7.5 minutes, then a resync: the
        // 10-minute bound, and a minute to spare.
        TWO_API_SERVERS => Duration::from_secs(660),
        _ => default,
    }
}

/// The rows `only` (`EG_CHAOS_ONLY`) picks: a comma-separated list, where an
/// entry that is a row's whole name picks that row alone (so
/// `watch-cache-lost-pod-delete` leaves out its 11-minute two-API-server
/// variant) and any other entry picks every row whose name contains it
/// (`slices/`, `etcd-restore`). Empty: every row. An entry that picks
/// nothing is an error, so that a misspelt row cannot make a green run of
/// nothing.
fn select_rows<'a>(names: &[&'a str], only: &str) -> Result<Vec<&'a str>, String> {
    let entries: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Ok(names.to_vec());
    }
    let picks = |entry: &str, name: &str| {
        if names.contains(&entry) {
            name == entry
        } else {
            name.contains(entry)
        }
    };
    if let Some(unmatched) = entries.iter().find(|e| !names.iter().any(|n| picks(e, n))) {
        return Err(format!(
            "EG_CHAOS_ONLY: {unmatched:?} names no row of this run ({})",
            names.join(", ")
        ));
    }
    Ok(names
        .iter()
        .copied()
        .filter(|n| entries.iter().any(|e| picks(e, n)))
        .collect())
}

#[test]
fn chaos_only_picks_whole_names_alone_and_substrings_widely() {
    let pick = |only: &str| select_rows(&FULL, only);
    assert_eq!(pick("").map(|r| r.len()), Ok(FULL.len()));
    assert_eq!(
        pick("etcd-restore-plain, etcd-restore-bump-revision,watch-cache-lost-pod-delete"),
        Ok(vec![
            "etcd-restore-plain",
            "etcd-restore-bump-revision",
            "watch-cache-lost-pod-delete"
        ])
    );
    assert_eq!(
        pick("watch-cache"),
        Ok(vec!["watch-cache-lost-pod-delete", TWO_API_SERVERS])
    );
    assert_eq!(pick("slices/").map(|r| r.len()), Ok(14));
    assert!(pick("etcd-restore,no-such-row").is_err());
}

async fn run(row: &str, which: Which, window: Duration) -> Result<Row> {
    let (published, name) = match row.strip_prefix(SLICES) {
        Some(name) => (Published::EndpointSlices, name),
        None => (Published::Endpoints, row),
    };
    let mut options = ControlPlaneOptions::default();
    if name.starts_with("failure-b") {
        options = options.apiserver_arg("--watch-cache=false");
    }
    if name.starts_with("watch-cache-lost-pod-delete") {
        options = options.with_etcd_fault_proxy();
    }
    if name == "etcd-leader-stopped" || name == "etcd-member-partitioned" {
        options = ControlPlaneOptions::highly_available();
    }
    if name == "apiserver-watch-stalled" {
        options = ControlPlaneOptions::highly_available().with_etcd_fault_proxy();
    }
    let mut env = Env::new(which, published, options).await?;
    if name.starts_with("stale-rv0") {
        // kube-controller-manager 1.36 starts its informers with a watch-list
        // (sendInitialEvents, RV unset: consistent); with the gate off it makes
        // the classic LIST at resourceVersion=0 that a stale cache answers.
        env.kcm_args.push("--feature-gates=WatchListClient=false");
    }
    if name == "half-open-pod-watch" {
        // No resync to reopen the watch: the silence alone must be found.
        env.guard_args.push("--resync-interval=0");
    }
    // The judge reads the last kube-apiserver on its own: one behind the
    // load balancer may be the one a row stalls.
    let judge = env
        .cp
        .apiserver_clients()
        .pop()
        .unwrap_or_else(|| env.cp.client());
    env.observer = Some(Observer::start_for(&judge, NS, published));
    let (fault, expected) = scenario(name, &mut env).await?;
    eprintln!(
        "{row} / {}: the row's writes were done {:.1}s after the fault",
        which.name(),
        fault.elapsed().as_secs_f64()
    );
    let expected = expected.read_from(published);
    let (converged, seconds, problem) =
        watch_convergence(&judge, NS, &expected, fault, window).await;
    let spurious = env
        .observer
        .as_ref()
        .map(Observer::spurious_deletions)
        .unwrap_or_default();
    let stats = env.proxy.get("/stats").await.unwrap_or_default();
    // Both controllers ask for pods in protobuf, and watch-chaos answers on
    // it: the faults reach the decoder each runs in production.
    let protobuf_watches = ChaosProxy::protobuf_watches(&stats, "pods");
    anyhow::ensure!(
        protobuf_watches > 0,
        "{row} / {}: no pod watch went through watch-chaos in protobuf: {}",
        which.name(),
        stats["resources"]["pods"]
    );
    eprintln!(
        "{row} / {}: spurious {spurious:?}, converged {converged} in {seconds:.1}s {problem:?}; prevented {}; {}; proxy {}",
        which.name(),
        env.prevented(),
        env.findings(),
        stats["resources"]
    );
    let mut notes = Vec::new();
    if !spurious.is_empty() {
        notes.push(format!(
            "{} while the Service existed: {}",
            match published {
                Published::Endpoints => "deleted",
                Published::EndpointSlices => "removed from its slices",
            },
            spurious.join(", ")
        ));
    }
    if let Some(problem) = problem {
        notes.push(format!("final state: {problem}"));
    }
    env.stop_controller().await;
    Ok(Row {
        name: row.to_string(),
        controller: which.name().to_string(),
        spurious_deletions: spurious.len(),
        converged,
        converge_seconds: (seconds * 10.0).round() / 10.0,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn matrix() {
    let full = std::env::var("EG_CHAOS").is_ok_and(|v| v == "full");
    let (names, window, dir): (&[&str], _, _) = if full {
        (&FULL, Duration::from_secs(25), "target/chaos")
    } else {
        (&FAST, Duration::from_secs(15), "target/chaos/fast")
    };
    let only = std::env::var("EG_CHAOS_ONLY").unwrap_or_default();
    let selected = select_rows(names, &only).unwrap_or_else(|e| panic!("{e}"));
    let mut rows = Vec::new();
    for name in selected {
        let controllers = match std::env::var("EG_CHAOS_CONTROLLER").as_deref() {
            Ok("guard") => vec![Which::Guard],
            Ok("kcm") => vec![Which::Kcm],
            _ => vec![Which::Guard, Which::Kcm],
        };
        for which in controllers {
            let row = run(name, which, self::window(name, window))
                .await
                .unwrap_or_else(|e| panic!("{name} with {}: {e:#}", which.name()));
            rows.push(row);
        }
    }
    // Whether upstream was hurt is read from its row, not assumed.
    let notes: BTreeMap<String, String> = names
        .iter()
        .map(|n| {
            let (bit, no_harm) = note(n);
            let harmed = rows.iter().any(|r| {
                r.name == *n
                    && r.controller == Which::Kcm.name()
                    && (r.spurious_deletions > 0 || !r.converged)
            });
            let text = if harmed {
                format!("yes: {bit}")
            } else {
                format!("no harm observed: {no_harm}")
            };
            (n.to_string(), text)
        })
        .collect();
    let out = workspace_root().expect("workspace root").join(dir);
    write_report(&out, &rows, &notes).expect("report written");
    println!("{}", eg_chaos::markdown(&rows, &notes));
    for row in &rows {
        if row.controller == Which::Guard.name() {
            assert_eq!(
                row.spurious_deletions, 0,
                "endpoints-guard deleted Endpoints of a live Service: {row:?}"
            );
            assert!(row.converged, "endpoints-guard did not converge: {row:?}");
        } else if row.name.starts_with("failure-a")
            || row.name == "slices/failure-a-old-delete-of-live-pod"
        {
            assert!(
                row.spurious_deletions > 0,
                "failure A did not bite upstream, so it proves nothing: {row:?}"
            );
        }
    }
}

/// Regression test for a bug found while building the matrix: when an
/// Endpoints write fails with a long API error, the `FailedToUpdateEndpoint`
/// Warning Event must still be published (events.k8s.io/v1 `note` is limited
/// to 1024 characters; an untruncated note made kube-apiserver reject the
/// Event with 422). The write fails here because the pod has an IP but no
/// `spec.nodeName`, so the address gets `nodeName: ""`, which the API rejects
/// with a long message.
#[tokio::test]
async fn failed_write_event_is_published_even_for_long_errors() {
    use k8s_openapi::api::events::v1::Event;
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    cp.create_namespace(NS).await.expect("namespace");
    let guard = Guard::start(cp.client(), &[]).await.expect("guard starts");
    cp.create_service(
        ServiceBuilder::new(NS, "web")
            .selector("app", "web")
            .port("http", 80, 8080, "TCP"),
    )
    .await
    .expect("service");
    cp.create_pod(
        PodBuilder::new(NS, "web-0")
            .label("app", "web")
            .container_port("http", 8080, "TCP"),
    )
    .await
    .expect("pod");
    cp.set_pod_status(NS, "web-0", PodStatusSpec::ready(["10.1.0.1"]))
        .await
        .expect("status");
    let events: Api<Event> = Api::namespaced(cp.client(), NS);
    let found = common::eventually(
        Duration::from_secs(20),
        "a FailedToUpdateEndpoint Event",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FailedToUpdateEndpoint")))
            }
        },
    )
    .await;
    guard.stop().await;
    found.expect("the failed write is reported as an Event");
}

/// Audit mode observes the upstream controller deleting Endpoints of a live
/// Service. kube-controller-manager's endpoints controller runs behind
/// watch-chaos and gets failure A on command (the steps of the
/// `failure-a-old-delete-of-live-service` scenario): an old DELETE of the
/// live Service `long` is replayed to it, so it deletes `long`'s Endpoints
/// and never re-creates them. endpoints-guard runs in audit mode straight to
/// kube-apiserver (not through the proxy), started once the namespace has
/// settled so that only the fault can move its counter: it must count the
/// deletion and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_mode_observes_upstream_deleting_endpoints_of_live_service() -> Result<()> {
    let started = std::time::Instant::now();
    let mut env = Env::new(
        Which::Kcm,
        Published::Endpoints,
        ControlPlaneOptions::default(),
    )
    .await?;
    let observer = Observer::start(&env.cp.client(), NS);
    env.start_controller().await?;
    env.service_with_pod("long", "10.1.0.1").await?;
    let expected = env.churn().await?.service("long", &["10.1.0.1"]);
    env.settle(&expected).await?;

    let guard = Guard::start(
        env.cp.client(),
        &["--mode", "audit", "--resync-interval", "0"],
    )
    .await?;
    wait_ready(&guard).await?;
    const OBSERVED: &str = "endpoints_guard_observed_spurious_deletions_total";
    assert_eq!(
        guard.metric(OBSERVED),
        0.0,
        "nothing spurious happened before the fault"
    );

    let uid_before = Api::<Service>::namespaced(env.cp.client(), NS)
        .get("long")
        .await?
        .metadata
        .uid;
    env.proxy
        .post(
            "/actions/replay-old-delete",
            json!({"resource": "services", "namespace": NS, "name": "long", "pace_ms": 400}),
        )
        .await?;

    // (1) Upstream really deleted the Endpoints of the live Service: the
    // independent watches saw the DELETE while `long` existed, and they are
    // still gone while the Service is still there.
    common::eventually(
        Duration::from_secs(30),
        "upstream to delete the Endpoints of the live Service long",
        || async {
            let spurious = observer.spurious_deletions();
            Ok(spurious
                .iter()
                .any(|s| s.starts_with("long at "))
                .then_some(()))
        },
    )
    .await?;

    // (2) endpoints-guard counted it.
    common::eventually(
        Duration::from_secs(30),
        "endpoints-guard to count the deletion",
        || async { Ok((guard.metric(OBSERVED) >= 1.0).then_some(())) },
    )
    .await
    .with_context(|| format!("metrics:\n{}", guard.metrics_text()))?;

    let service = Api::<Service>::namespaced(env.cp.client(), NS)
        .get_opt("long")
        .await?;
    assert_eq!(
        service.and_then(|s| s.metadata.uid),
        uid_before,
        "Service long is still the same live Service"
    );
    let endpoints = Api::<Endpoints>::namespaced(env.cp.client(), NS)
        .get_opt("long")
        .await?;
    assert!(
        endpoints.is_none(),
        "upstream never re-creates the Endpoints (and audit mode did not either): {endpoints:?}"
    );

    // (3) endpoints-guard wrote nothing.
    guard.assert_wrote_nothing();
    eprintln!(
        "audit observed {} spurious deletion(s); upstream's: {:?}; {:.1}s",
        guard.metric(OBSERVED),
        observer.spurious_deletions(),
        started.elapsed().as_secs_f64()
    );
    guard.stop().await;
    env.stop_controller().await;
    Ok(())
}

/// Waits until the in-process endpoints-guard answers `/readyz` (caches
/// synced), so that it sees the fault as a watch event.
async fn wait_ready(guard: &Guard) -> Result<()> {
    let port = guard.running.metrics_addr.port();
    common::eventually(
        Duration::from_secs(30),
        "endpoints-guard /readyz",
        || async move { loopback::get(port, "/readyz").await.map(|_| Some(())) },
    )
    .await
}
