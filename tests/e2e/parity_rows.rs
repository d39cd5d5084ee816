//! One end-to-end case per parity row (docs/parity.md), each in its own
//! namespace on one real control plane, with endpoints-guard running in-process.
//! Then: once everything has converged, 60 s without changes must bring zero
//! Endpoints writes, counted by an independent watch.

mod rows;

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::Guard;
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";

type Check = fn(&Endpoints) -> Result<(), String>;

fn ips(list: &Option<Vec<EndpointAddress>>) -> Vec<String> {
    list.iter().flatten().map(|a| a.ip.clone()).collect()
}

fn only_subset(ep: &Endpoints) -> Result<&EndpointSubset, String> {
    match ep.subsets.as_deref() {
        Some([s]) => Ok(s),
        other => Err(format!("expected one subset, got {other:?}")),
    }
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

/// A GET of Endpoints `ns/name`, tried again when the connection fails under
/// it: kube-apiserver closes keep-alive connections idle for 90 s, and the
/// client's pool can hand out one at the moment it is being closed (seen after
/// the 60 s of steady state: "connection closed before message completed").
/// Go's HTTP client retries an idempotent request in that case too.
async fn endpoints(cp: &ControlPlane, ns: &str, name: &str) -> anyhow::Result<Option<Endpoints>> {
    let api = Api::<Endpoints>::namespaced(cp.client(), ns);
    let mut tries = 0;
    loop {
        match api.get_opt(name).await {
            Err(kube::Error::Service(_) | kube::Error::HyperError(_)) if tries < 3 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            got => return Ok(got?),
        }
    }
}

/// Waits until the Endpoints pass `check`, returning the last failure on timeout.
async fn wait_for(cp: &ControlPlane, ns: &str, name: &str, check: Check) -> Result<(), String> {
    let mut last = String::from("no Endpoints yet");
    for _ in 0..150 {
        match endpoints(cp, ns, name).await {
            Ok(Some(ep)) => match check(&ep) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            },
            Ok(None) => {}
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

async fn pod(
    cp: &ControlPlane,
    b: PodBuilder,
    status: Option<PodStatusSpec>,
) -> anyhow::Result<Pod> {
    let b = b.node_name("node-a");
    match status {
        Some(s) => cp.create_pod_with_status(b, s).await,
        None => cp.create_pod(b).await,
    }
}

fn web(ns: &str, name: &str) -> PodBuilder {
    PodBuilder::serving(ns, name, "web")
}

fn web_service(ns: &str) -> ServiceBuilder {
    ServiceBuilder::new(ns, "web")
        .selector("app", "web")
        .named_port("http", 80, "http", "TCP")
}

/// Objects that must exist before endpoints-guard starts (adoption, start-up sweep).
async fn before_start(cp: &ControlPlane) -> anyhow::Result<()> {
    cp.create_namespace("adopt").await?;
    cp.create_service(web_service("adopt").label("team", "a"))
        .await?;
    pod(
        cp,
        web("adopt", "w1"),
        Some(PodStatusSpec::ready(["10.1.0.1"])),
    )
    .await?;
    let stale: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "adopt", "labels": {MANAGED_BY: "endpoint-controller"}},
        "subsets": [{"addresses": [{"ip": "10.1.9.9"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
    }))?;
    Api::<Endpoints>::namespaced(cp.client(), "adopt")
        .create(&PostParams::default(), &stale)
        .await?;

    cp.create_namespace("sweep").await?;
    for (name, labels) in [
        (
            "orphan-upstream",
            json!({MANAGED_BY: "endpoint-controller"}),
        ),
        ("orphan-ours", json!({MANAGED_BY: "endpoints-guard"})),
        ("orphan-user", json!({"owner": "someone"})),
    ] {
        let ep: Endpoints = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "sweep", "labels": labels}}),
        )?;
        Api::<Endpoints>::namespaced(cp.client(), "sweep")
            .create(&PostParams::default(), &ep)
            .await?;
    }
    Ok(())
}

/// A row's outcome: `Err` if its setup failed, `Ok(Err)` if its check did.
type RowResult = anyhow::Result<Result<(), String>>;

/// A row: its name (also its namespace) and what it does.
type Row = (
    &'static str,
    for<'a> fn(&'a ControlPlane, &'a str) -> BoxFuture<'a, RowResult>,
);

/// Every parity row, in its own namespace. `adopt` and `sweep` set up their
/// namespaces before endpoints-guard starts (see `before_start`).
const ROWS: &[Row] = &[
    ("readiness-placement", |cp, ns| {
        Box::pin(rows::readiness_placement(cp, ns))
    }),
    ("dropped-pods", |cp, ns| {
        Box::pin(rows::dropped_pods(cp, ns))
    }),
    ("publish-not-ready", |cp, ns| {
        Box::pin(rows::publish_not_ready(cp, ns))
    }),
    ("empty-selector", |cp, ns| {
        Box::pin(rows::empty_selector(cp, ns))
    }),
    ("named-ports-sidecar", |cp, ns| {
        Box::pin(rows::named_ports_sidecar(cp, ns))
    }),
    ("hostname-subdomain", |cp, ns| {
        Box::pin(rows::hostname_subdomain(cp, ns))
    }),
    ("node-and-target-ref", |cp, ns| {
        Box::pin(rows::node_and_target_ref(cp, ns))
    }),
    ("readiness-flip", |cp, ns| {
        Box::pin(rows::readiness_flip(cp, ns))
    }),
    ("foreign-write-repaired", |cp, ns| {
        Box::pin(rows::foreign_write_repaired(cp, ns))
    }),
    ("external-name", |cp, ns| {
        Box::pin(rows::external_name(cp, ns))
    }),
    ("selectorless-untouched", |cp, ns| {
        Box::pin(rows::selectorless_untouched(cp, ns))
    }),
    ("adopt", |cp, ns| Box::pin(rows::adopt(cp, ns))),
    ("sweep", |cp, ns| Box::pin(rows::sweep(cp, ns))),
];

/// Runs one row in its namespace.
async fn row(cp: &ControlPlane, (name, run): &Row) -> RowResult {
    if !matches!(*name, "adopt" | "sweep") {
        cp.create_namespace(name).await?;
    }
    run(cp, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_then_a_quiet_steady_state() -> anyhow::Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    before_start(&cp).await?;
    let guard = Guard::start(cp.client(), &["--resync-interval", "0"]).await?;

    let results =
        futures::future::join_all(ROWS.iter().map(|r| async { (r.0, row(&cp, r).await) })).await;
    let mut failures = Vec::new();
    for (name, result) in results {
        match result {
            Ok(Ok(())) => eprintln!("row {name}: ok"),
            Ok(Err(why)) => failures.push(format!("{name}: {why}")),
            Err(err) => failures.push(format!("{name}: setup failed: {err:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "parity rows failed:\n{}",
        failures.join("\n")
    );
    // The gauge follows each key's reconcile (src/reconcile/orphans.rs), so it
    // settles once the last watch events are reconciled: poll, briefly.
    let orphans = "endpoints_guard_unmanaged_orphan_endpoints{scope=\"cluster\"}";
    for _ in 0..50 {
        if guard.metric(orphans) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(guard.metric(orphans), 1.0, "the user's orphan is reported");

    // A pod change that touches nothing Endpoints are made of must not cause a write.
    let before = endpoints(&cp, "readiness-placement", "web")
        .await?
        .and_then(|e| e.metadata.resource_version);
    Api::<Pod>::namespaced(cp.client(), "readiness-placement")
        .patch(
            "ready",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await?;

    // Steady state: 60 s with no changes, counted by an independent watch.
    let writes_before = guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}");
    let eps: Api<Endpoints> = Api::all(cp.client());
    let rv = eps
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let stream = eps.watch(&WatchParams::default().timeout(90), &rv).await?;
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            while let Some(event) = stream.next().await {
                if let Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) =
                    event
                {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    counter.abort();
    let writes = seen.load(Ordering::SeqCst);
    let after = endpoints(&cp, "readiness-placement", "web")
        .await?
        .and_then(|e| e.metadata.resource_version);
    eprintln!("steady state: {writes} Endpoints writes seen by an independent watch in 60 s");
    assert_eq!(
        before, after,
        "an annotation-only pod change rewrote Endpoints"
    );
    assert_eq!(writes, 0, "Endpoints were written in steady state");
    assert_eq!(
        guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}"),
        writes_before
    );
    guard.stop().await;
    Ok(())
}
