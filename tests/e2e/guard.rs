//! The hardened watcher and the deletion guard on a real control plane, for the
//! failures that need no proxy: a DELETE lost while kube-apiserver was down and
//! etcd compacted behind the watch, an API server restart, a Service deleted and
//! re-created under the same name, a Service deleted for real, and audit mode
//! watching kube-controller-manager.

use std::time::Duration;

use crate::common::{self, Guard, eventually};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::Api;
use kube::api::DeleteParams;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn get_ep(cp: &ControlPlane, ns: &str, name: &str) -> anyhow::Result<Option<Endpoints>> {
    Ok(Api::<Endpoints>::namespaced(cp.client(), ns)
        .get_opt(name)
        .await?)
}

async fn wait_ips(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    want: &[&str],
) -> anyhow::Result<Endpoints> {
    common::wait_endpoint_ips(cp, ns, name, want, TIMEOUT).await
}

async fn wait_gone(cp: &ControlPlane, ns: &str, name: &str) -> anyhow::Result<()> {
    eventually(
        TIMEOUT,
        &format!("Endpoints {ns}/{name} deleted"),
        || async { Ok(get_ep(cp, ns, name).await?.is_none().then_some(())) },
    )
    .await
}

async fn service_with_pods(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    ips: &[&str],
) -> anyhow::Result<()> {
    cp.create_service(
        ServiceBuilder::new(ns, name)
            .selector("app", name)
            .named_port("http", 80, "http", "TCP"),
    )
    .await?;
    for (i, ip) in ips.iter().enumerate() {
        let pod = format!("{name}-{i}");
        cp.create_pod_with_status(
            PodBuilder::serving(ns, &pod, name),
            PodStatusSpec::ready([*ip]),
        )
        .await?;
    }
    Ok(())
}

/// A Service and a pod are deleted straight from etcd while kube-apiserver is
/// down, and etcd is compacted: no watch ever sees those DELETEs, and resuming
/// from the old resourceVersion fails with 410. The watcher must relist
/// (consistently), learn both deletions from the list, confirm them with live
/// reads, delete the gone Service's Endpoints, drop the gone pod's address —
/// and touch nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_deletes_behind_a_compaction_are_relisted_confirmed_and_repaired() -> anyhow::Result<()>
{
    let mut cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace("g").await?;
    service_with_pods(&cp, "g", "keep", &["10.20.0.1", "10.20.0.2"]).await?;
    service_with_pods(&cp, "g", "gone", &["10.20.1.1"]).await?;
    let guard = Guard::start(cp.client(), &["--resync-interval", "0"]).await?;
    let keep_before = wait_ips(&cp, "g", "keep", &["10.20.0.1", "10.20.0.2"]).await?;
    wait_ips(&cp, "g", "gone", &["10.20.1.1"]).await?;
    let relists_before = guard.metric("endpoints_guard_relists_total{resource=\"services\"}");

    cp.stop_apiserver().await?;
    assert_eq!(
        cp.etcd_delete_key("/registry/services/specs/g/gone")
            .await?,
        1
    );
    assert_eq!(cp.etcd_delete_key("/registry/pods/g/keep-1").await?, 1);
    cp.compact_etcd().await?;
    cp.start_apiserver_again().await?;

    wait_gone(&cp, "g", "gone").await?;
    let keep_after = wait_ips(&cp, "g", "keep", &["10.20.0.1"]).await?;
    assert_eq!(
        keep_after.metadata.uid, keep_before.metadata.uid,
        "the live Service's Endpoints were never deleted"
    );
    assert!(
        guard.metric("endpoints_guard_relists_total{resource=\"services\"}") > relists_before,
        "a relist, not a resume"
    );
    assert_eq!(
        guard.metric("endpoints_guard_endpoints_writes_total{verb=\"delete\"}"),
        1.0
    );
    assert_eq!(
        guard.metric(
            "endpoints_guard_spurious_deletions_prevented_total{reason=\"missing_from_list\"}"
        ),
        0.0
    );

    // After the restart new work is reconciled as usual.
    service_with_pods(&cp, "g", "later", &["10.20.2.1"]).await?;
    wait_ips(&cp, "g", "later", &["10.20.2.1"]).await?;
    guard.stop().await;
    Ok(())
}

/// A Service deleted for real loses its Endpoints, after a live read confirmed
/// it; one deleted and re-created under the same name keeps working Endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_deletions_and_recreations() -> anyhow::Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace("d").await?;
    service_with_pods(&cp, "d", "doomed", &["10.21.0.1"]).await?;
    service_with_pods(&cp, "d", "phoenix", &["10.21.1.1"]).await?;
    let guard = Guard::start(cp.client(), &["--resync-interval", "0"]).await?;
    wait_ips(&cp, "d", "doomed", &["10.21.0.1"]).await?;
    wait_ips(&cp, "d", "phoenix", &["10.21.1.1"]).await?;

    let services: Api<Service> = Api::namespaced(cp.client(), "d");
    services.delete("doomed", &DeleteParams::default()).await?;
    // kube-apiserver itself deletes a Service's Endpoints when the Service is
    // deleted through it (the Service storage's after-delete hook), so either
    // it or endpoints-guard (after a live read found the Service gone) does it.
    wait_gone(&cp, "d", "doomed").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get_ep(&cp, "d", "doomed").await?.is_none(),
        "the Endpoints stay deleted"
    );
    let prevented: f64 = ["watch_delete", "missing_from_list", "not_in_cache"]
        .iter()
        .map(|r| {
            guard.metric(&format!(
                "endpoints_guard_spurious_deletions_prevented_total{{reason=\"{r}\"}}"
            ))
        })
        .sum();
    assert_eq!(prevented, 0.0, "a real deletion is not a spurious one");

    let old = services.get("phoenix").await?;
    services.delete("phoenix", &DeleteParams::default()).await?;
    cp.create_service(
        ServiceBuilder::new("d", "phoenix")
            .selector("app", "phoenix")
            .named_port("http", 80, "http", "TCP"),
    )
    .await?;
    let new = services.get("phoenix").await?;
    assert_ne!(old.metadata.uid, new.metadata.uid);
    // Whether the Endpoints went and came back or stayed, they end up right.
    wait_ips(&cp, "d", "phoenix", &["10.21.1.1"]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_ips(&cp, "d", "phoenix", &["10.21.1.1"]).await?;
    guard.stop().await;
    Ok(())
}

/// Audit mode beside kube-controller-manager: endpoints-guard writes nothing,
/// and counts an Endpoints deletion made while its Service existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_mode_writes_nothing_and_counts_deletions_of_live_services() -> anyhow::Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace("a").await?;
    let _kcm = cp.start_controller_manager("endpoints-controller", &[])?;
    let guard = Guard::start(cp.client(), &["--mode", "audit", "--resync-interval", "0"]).await?;
    service_with_pods(&cp, "a", "web", &["10.22.0.1"]).await?;
    let first = wait_ips(&cp, "a", "web", &["10.22.0.1"]).await?;
    let manager = first
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("endpoints.kubernetes.io/managed-by"))
        .cloned();
    assert_eq!(
        manager.as_deref(),
        Some("endpoint-controller"),
        "upstream wrote them"
    );

    // Someone deletes the Endpoints of a live Service; upstream re-creates them.
    Api::<Endpoints>::namespaced(cp.client(), "a")
        .delete("web", &DeleteParams::default())
        .await?;
    eventually(TIMEOUT, "the deletion to be observed", || async {
        Ok(
            (guard.metric("endpoints_guard_observed_spurious_deletions_total") >= 1.0)
                .then_some(()),
        )
    })
    .await?;
    let again = wait_ips(&cp, "a", "web", &["10.22.0.1"]).await?;
    assert_ne!(
        again.metadata.uid, first.metadata.uid,
        "upstream re-created them"
    );
    assert_eq!(
        guard.metric("endpoints_guard_observed_spurious_deletions_total"),
        1.0
    );
    guard.assert_wrote_nothing();
    let labels = again.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("endpoints.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpoint-controller")
    );
    guard.stop().await;
    Ok(())
}
