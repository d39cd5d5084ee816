//! The differential parity test: the same generated workload is reconciled once by
//! kube-controller-manager's endpoints controller alone and once by
//! endpoints-guard alone; every Endpoints object must come out identical except for
//! the trigger-time annotation (the managed-by label included: endpoints-guard
//! writes upstream's value by default).
//!
//! Twice: from a cold start, and after a round of changes
//! (`Workload::churn`) that endpoints-guard follows incrementally while
//! kube-controller-manager, started afterwards on the same objects with their
//! Endpoints deleted, computes them from nothing: endpoints-guard's way there
//! must end where upstream's rules do.
//!
//! `EG_PARITY_SCALE=full` (what `make parity` sets) runs 200+ Services and 2000+
//! pods; the default is the smaller run `make test` includes. Writes
//! `target/parity/report.json`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common;
use eg_harness::{ControlPlane, ControlPlaneOptions};
use eg_workload::workload::{self, Size, Workload};
use k8s_openapi::api::core::v1::Endpoints;
use serde_json::{Value, json};

const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// What is compared: labels, annotations (less the trigger time, the one
/// allowed difference) and the subsets exactly as stored, order included.
fn comparable(ep: &Endpoints) -> Value {
    let labels = ep.metadata.labels.clone().unwrap_or_default();
    let mut annotations = ep.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(TRIGGER_TIME);
    json!({"labels": labels, "annotations": annotations, "subsets": ep.subsets.clone().unwrap_or_default()})
}

fn comparable_all(snapshot: &BTreeMap<String, Endpoints>) -> BTreeMap<String, Value> {
    snapshot
        .iter()
        .map(|(k, ep)| (k.clone(), comparable(ep)))
        .collect()
}

/// Waits until `expected` Endpoints exist and nothing changed for three polls.
async fn converge(
    client: &kube::Client,
    wl: &Workload,
    expected: usize,
    who: &str,
) -> anyhow::Result<(BTreeMap<String, Endpoints>, f64)> {
    let start = Instant::now();
    let mut last = None;
    let mut stable = 0;
    loop {
        let snap = workload::snapshot_endpoints(client, &wl.namespaces).await?;
        let view = comparable_all(&snap);
        if snap.len() >= expected && last.as_ref() == Some(&view) {
            stable += 1;
            if stable >= 3 {
                return Ok((snap, start.elapsed().as_secs_f64()));
            }
        } else {
            stable = 0;
        }
        last = Some(view);
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "{who} did not converge in 300 s: {} of {expected} Endpoints",
            snap.len()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn first_difference(a: &Value, b: &Value) -> String {
    let a = serde_json::to_string_pretty(a).unwrap_or_default();
    let b = serde_json::to_string_pretty(b).unwrap_or_default();
    for (i, (la, lb)) in a.lines().zip(b.lines()).enumerate() {
        if la != lb {
            return format!(
                "line {}: upstream `{}` vs endpoints-guard `{}`",
                i + 1,
                la.trim(),
                lb.trim()
            );
        }
    }
    format!(
        "lengths differ: upstream {} lines, endpoints-guard {} lines",
        a.lines().count(),
        b.lines().count()
    )
}

/// Compares two snapshots object by object: how many are identical, and
/// what differs in the others.
fn compare(upstream: &BTreeMap<String, Endpoints>, ours: &BTreeMap<String, Endpoints>) -> Value {
    let upstream_view = comparable_all(upstream);
    let ours_view = comparable_all(ours);
    let mut identical = 0;
    let mut different = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        upstream_view.keys().chain(ours_view.keys()).collect();
    for key in &keys {
        match (upstream_view.get(*key), ours_view.get(*key)) {
            (Some(a), Some(b)) if a == b => identical += 1,
            (Some(a), Some(b)) => {
                different.push(json!({"service": key, "diff": first_difference(a, b)}))
            }
            (Some(_), None) => different
                .push(json!({"service": key, "diff": "missing from endpoints-guard's run"})),
            (None, _) => {
                different.push(json!({"service": key, "diff": "missing from upstream's run"}))
            }
        }
    }
    json!({"endpoints_compared": keys.len(), "identical": identical, "different": different})
}

/// The keys of the Endpoints a controller made (upstream's managed-by
/// label, which endpoints-guard writes too); the user's hand-made Endpoints
/// of selector-less Services are not among them.
fn made_by_a_controller(snapshot: &BTreeMap<String, Endpoints>) -> Vec<String> {
    snapshot
        .iter()
        .filter(|(_, ep)| {
            ep.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY))
                .is_some()
        })
        .map(|(k, _)| k.clone())
        .collect()
}

fn count(round: &Value, field: &str) -> usize {
    match &round[field] {
        Value::Array(items) => items.len(),
        other => other.as_u64().unwrap_or_default() as usize,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_kube_controller_manager() -> anyhow::Result<()> {
    let full = std::env::var("EG_PARITY_SCALE").is_ok_and(|s| s == "full");
    let size = if full { Size::FULL } else { Size::SMALL };
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    let wl = Workload::generate(size, "parity");
    let created = Instant::now();
    wl.create(&client).await?;
    eprintln!(
        "parity: created {} services and {} pods in {:.1}s",
        wl.services.len(),
        wl.pods.len(),
        created.elapsed().as_secs_f64()
    );
    let expected = wl.selector_services() + wl.user_endpoints.len();

    // Cold start, upstream alone.
    let kcm = cp.start_controller_manager("endpoints-controller", &[])?;
    let (upstream, upstream_s) =
        converge(&client, &wl, expected, "kube-controller-manager").await?;
    drop(kcm);
    // Its Endpoints go, so that endpoints-guard starts from nothing too.
    workload::delete_all_endpoints(&client, made_by_a_controller(&upstream)).await?;

    // Cold start, endpoints-guard alone.
    let guard = common::Guard::start(client.clone(), &["--resync-interval", "0"]).await?;
    let (ours, ours_s) = converge(&client, &wl, expected, "endpoints-guard").await?;
    let cold_writes = guard.metric("endpoints_guard_endpoints_writes_total{verb=\"create\"}")
        + guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}");
    // endpoints-guard wrote them (upstream's were deleted before its round),
    // with upstream's managed-by value.
    assert!(cold_writes > 0.0, "endpoints-guard wrote no Endpoints");
    for (key, ep) in &ours {
        let label = ep.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY));
        if upstream
            .get(key)
            .and_then(|u| u.metadata.labels.as_ref())
            .and_then(|l| l.get(MANAGED_BY))
            .is_some()
        {
            assert_eq!(
                label.map(String::as_str),
                Some("endpoint-controller"),
                "{key}: managed-by"
            );
        }
    }
    let mut cold = compare(&upstream, &ours);
    cold["upstream_converge_seconds"] = json!(upstream_s);
    cold["endpoints_guard_converge_seconds"] = json!(ours_s);
    cold["endpoints_guard_writes"] = json!(cold_writes);

    // After churn: endpoints-guard, still running, follows the changes.
    let changed = wl.churn(&client).await?;
    let (ours_churned, ours_churn_s) =
        converge(&client, &wl, expected, "endpoints-guard after churn").await?;
    let writes = guard.metric("endpoints_guard_endpoints_writes_total{verb=\"create\"}")
        + guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}")
        + guard.metric("endpoints_guard_endpoints_writes_total{verb=\"delete\"}");
    guard.stop().await;
    assert!(
        writes > cold_writes,
        "endpoints-guard wrote nothing after {changed} changes"
    );
    // Upstream computes the changed workload from nothing.
    workload::delete_all_endpoints(&client, made_by_a_controller(&ours_churned)).await?;
    let kcm = cp.start_controller_manager("endpoints-controller", &[])?;
    let (upstream_churned, upstream_churn_s) = converge(
        &client,
        &wl,
        expected,
        "kube-controller-manager after churn",
    )
    .await?;
    drop(kcm);
    let mut after_churn = compare(&upstream_churned, &ours_churned);
    after_churn["objects_changed"] = json!(changed);
    after_churn["upstream_converge_seconds"] = json!(upstream_churn_s);
    after_churn["endpoints_guard_converge_seconds"] = json!(ours_churn_s);
    after_churn["endpoints_guard_writes"] = json!(writes - cold_writes);

    let identical = count(&cold, "identical") + count(&after_churn, "identical");
    let different = count(&cold, "different") + count(&after_churn, "different");
    let report = json!({
        "services": wl.services.len(),
        "pods": wl.pods.len(),
        "identical": identical,
        "different": different,
        "cold_start": cold,
        "after_churn": after_churn,
        "scale": if full { "full" } else { "small" },
    });
    let path = workload::write_parity_report("report.json", &report)?;
    for (name, round) in [("cold start", &cold), ("after churn", &after_churn)] {
        eprintln!(
            "parity, {name}: {} identical, {} different",
            count(round, "identical"),
            count(round, "different")
        );
    }
    eprintln!("parity: report in {}", path.display());
    assert!(
        ours.get(&format!("{}/big", wl.namespaces[0]))
            .is_some_and(|ep| ep.metadata.annotations.as_ref().is_some_and(|a| a
                .get("endpoints.kubernetes.io/over-capacity")
                .is_some_and(|v| v == "truncated"))),
        "the Service over 1000 pods must be truncated"
    );
    assert!(
        different == 0,
        "Endpoints differ from upstream: {}",
        serde_json::to_string_pretty(&json!([cold["different"], after_churn["different"]]))?
    );
    Ok(())
}
