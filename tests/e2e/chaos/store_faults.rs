//! Chaos rows for what happens below and beside the watch: etcd restored from
//! a backup (both ways), kube-apiserver's watch cache losing a DELETE, work
//! dropped while writes are denied, and a 404 that is not a NotFound.

use std::time::{Duration, Instant};

use anyhow::Result;
use eg_chaos::Expected;
use eg_harness::EtcdBackup;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use super::NS;
use super::env::Env;

/// How the store is restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    /// The data folder copied back in place: revisions go back.
    Plain,
    /// `etcdutl snapshot restore --bump-revision --mark-compacted`.
    Bumped,
}

/// Far more revisions than the test writes after the backup.
pub const BUMP: u64 = 1_000_000;

/// The etcd restore rows: a backup, then changes (a pod turns not ready, a
/// Service is deleted, another created, thousands of unrelated revisions),
/// then the restore, with the controller running throughout, and a new pod
/// after it. The restored Services and pods, plus the new pod, are the truth.
pub async fn etcd_restore(env: &mut Env, how: Restore) -> Result<(Instant, Expected)> {
    env.service_with_pod("a", "10.1.0.1").await?;
    env.service_with_pod("b", "10.1.1.1").await?;
    env.settle(
        &Expected::default()
            .service("a", &["10.1.0.1"])
            .service("b", &["10.1.1.1"]),
    )
    .await?;
    let backup: EtcdBackup = env.cp.backup_etcd().await?;
    // After the backup.
    env.set_ready("a-0", "10.1.0.1", false).await?;
    env.delete_service("b").await?;
    env.service_with_pod("c", "10.1.2.1").await?;
    env.cp.write_unrelated_revisions(NS, 3000).await?;
    env.settle(
        &Expected::default()
            .service("a", &[])
            .absent("b")
            .service("c", &["10.1.2.1"]),
    )
    .await?;
    env.observer_restoring();
    match how {
        Restore::Plain => env.cp.restore_etcd_plain(&backup).await?,
        Restore::Bumped => env.cp.restore_etcd_bumped(&backup, BUMP).await?,
    }
    env.observer_restored();
    // Convergence counts from kube-apiserver being back on the restored store.
    let fault = Instant::now();
    // A change after the restore.
    env.pod("a-1", "a", "10.1.0.2", true).await?;
    Ok((
        fault,
        Expected::default()
            .service("a", &["10.1.0.1", "10.1.0.2"])
            .service("b", &["10.1.1.1"])
            .absent("c"),
    ))
}

/// kube-apiserver's watch cache loses a pod's DELETE (etcd-fault-proxy drops
/// the events of its key on their way from etcd): every watch and LIST keeps
/// the pod; only a GET, served from etcd, finds it gone.
pub async fn watch_cache_lost_pod_delete(env: &mut Env) -> Result<(Instant, Expected)> {
    env.service_with_pod("a", "10.1.0.1").await?;
    env.pod("a-1", "a", "10.1.0.2", true).await?;
    env.settle(&Expected::default().service("a", &["10.1.0.1", "10.1.0.2"]))
        .await?;
    env.cp
        .etcd_drop_events(&format!("/registry/pods/{NS}/a-1"), &["PUT", "DELETE"])
        .await?;
    let fault = Instant::now();
    env.cp.force_delete_pod(NS, "a-1").await?;
    Ok((fault, Expected::default().service("a", &["10.1.0.1"])))
}

/// Two API servers on one etcd, each with its own watch cache; the
/// controller talks to the first, behind etcd-fault-proxy, whose cache loses
/// a pod's DELETE; the second has it right. endpoints-guard runs with the
/// ghost scan off and its default resync: what finds the ghost is the
/// resync's exact-RV list, which the first API server serves from etcd once
/// its own consistency check failed (the bound at any size).
pub async fn lost_in_one_of_two_watch_caches(env: &mut Env) -> Result<(Instant, Expected)> {
    env.second = Some(env.cp.start_second_apiserver().await?);
    env.guard_args
        .extend(["--ghost-scan-qps=0", "--resync-interval=90s"]);
    let (fault, expected) = watch_cache_lost_pod_delete(env).await?;
    // The ghost is the first API server's alone.
    let listed = |client: kube::Client| async move {
        let pods: Api<Pod> = Api::namespaced(client, NS);
        anyhow::Ok(
            pods.list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some("a-1")),
        )
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = env.second.as_ref().map(|s| s.client.clone());
    anyhow::ensure!(
        listed(env.cp.client()).await?,
        "the first API server's LIST should still serve a-1"
    );
    if let Some(second) = second {
        anyhow::ensure!(
            !listed(second).await?,
            "the second API server's LIST should not serve a-1"
        );
    }
    Ok((fault, expected))
}

/// Endpoints writes are denied (a ValidatingAdmissionPolicy) for `denied`,
/// longer than the controller's retry budget, while a pod turns not ready;
/// then the policy goes. The Endpoints must follow within one resync.
pub async fn writes_denied_longer_than_retries(
    env: &mut Env,
    denied: Duration,
) -> Result<(Instant, Expected)> {
    env.service_with_pod("a", "10.1.0.1").await?;
    env.pod("a-1", "a", "10.1.0.2", true).await?;
    env.settle(&Expected::default().service("a", &["10.1.0.1", "10.1.0.2"]))
        .await?;
    env.cp.deny_endpoints_writes(NS).await?;
    env.set_ready("a-1", "10.1.0.2", false).await?;
    tokio::time::sleep(denied).await;
    env.cp.allow_endpoints_writes().await?;
    let fault = Instant::now();
    Ok((fault, Expected::default().service("a", &["10.1.0.1"])))
}

/// Failure A (an old DELETE of a live Service) while every GET of a Service
/// is answered by a bare text 404, as a proxy in front of the API server
/// would: a 404 that is not a NotFound of that Service must delete nothing.
pub async fn bare_404_on_get(env: &mut Env) -> Result<(Instant, Expected)> {
    env.service_with_pod("long", "10.1.0.1").await?;
    let expected = env.churn().await?.service("long", &["10.1.0.1"]);
    env.settle(&expected).await?;
    env.proxy.fault("services", "bare-404", json!({})).await?;
    let fault = Instant::now();
    env.proxy
        .post(
            "/actions/replay-old-delete",
            json!({"resource": "services", "namespace": NS, "name": "long", "pace_ms": 400}),
        )
        .await?;
    Ok((fault, expected))
}
