//! Finding watch-cache ghosts where kube-apiserver does not check its cache
//! (`DetectCacheInconsistency=false`): what kube-apiserver serves, and
//! endpoints-guard's compaction audit on it, on one kube-apiserver and on
//! two behind a load balancer (docs/ghosts.md).
//!
//! kube-apiserver compacts etcd to the revision of its own previous
//! compaction write (`compact_rev_key`, k8s.io/apiserver `etcd3/compact.go`),
//! and its watch cache drops every snapshot below that revision
//! (`cacher/compactor.go`, polled every 15 s). No pod was written at that
//! revision, so no snapshot of the pod cache is at or below it: a LIST at
//! exactly that revision is served by etcd (`cacher.go`,
//! `shouldDelegateExactRV`), while pods keep changing and every LIST at the
//! current revision is served by the cache. A client finds the revision
//! without any grant beyond `list`: below it an exact LIST answers 410, at or
//! above it succeeds.

use std::time::{Duration, Instant};

use crate::common::Guard;
use anyhow::{Context, Result, bail, ensure};
use eg_chaos::{Expected, Observer};
use eg_harness::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, VersionMatch};
use tokio::sync::watch;

const NS: &str = "compacted";
const COMPACTION: Duration = Duration::from_secs(60);
/// Two compactions after the delete, the cache's 15-s poll, and slack for a
/// loaded machine.
const TIMEOUT: Duration = Duration::from_secs(330);

/// What one exact LIST answered.
enum Exact {
    Listed(Vec<String>),
    /// 410: etcd has compacted the revision.
    Compacted,
}

async fn list_exact(pods: &Api<Pod>, rv: u64, limit: Option<u32>) -> Result<Exact> {
    let mut params = ListParams::default()
        .at(&rv.to_string())
        .matching(VersionMatch::Exact);
    if let Some(limit) = limit {
        params = params.limit(limit);
    }
    match pods.list(&params).await {
        Ok(list) => Ok(Exact::Listed(
            list.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect(),
        )),
        Err(kube::Error::Api(status)) if status.code == 410 => Ok(Exact::Compacted),
        Err(e) => Err(e).with_context(|| format!("exact LIST of pods at {rv}")),
    }
}

/// The current revision, from a consistent LIST of one pod.
async fn current_revision(pods: &Api<Pod>) -> Result<u64> {
    let list = pods.list(&ListParams::default().limit(1)).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    rv.parse()
        .with_context(|| format!("resourceVersion {rv:?} is not a revision"))
}

/// The oldest revision etcd still serves at or below `newest` (which it
/// serves), by bisection; and the LISTs that took.
async fn compacted_revision(pods: &Api<Pod>, newest: u64) -> Result<(u64, u32)> {
    // `below` answers 410 (or is 0); `at` is listed.
    let (mut below, mut at, mut probes) = (0u64, newest, 0u32);
    while at - below > 1 {
        let mid = below + (at - below) / 2;
        probes += 1;
        match list_exact(pods, mid, Some(1)).await? {
            Exact::Compacted => below = mid,
            Exact::Listed(_) => at = mid,
        }
    }
    Ok((at, probes))
}

/// Flips `name`'s readiness every 300 ms until told to stop (bounded by
/// [`TIMEOUT`]), so the pod cache has a snapshot at nearly every moment.
fn churn(cp: &ControlPlane, name: &'static str, ip: &'static str) -> watch::Sender<bool> {
    let (stop, mut stopped) = watch::channel(false);
    let client = cp.client();
    let started = Instant::now();
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, NS);
        let mut ready = false;
        while !*stopped.borrow() && started.elapsed() < TIMEOUT + Duration::from_secs(30) {
            let status = serde_json::json!({"status": {"conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}
            ], "podIP": ip, "phase": "Running"}});
            // A failed flip only thins the churn; the test's asserts see it.
            if let Err(e) = pods
                .patch_status(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&status),
                )
                .await
            {
                eprintln!("churn: flipping {name} failed: {e}");
            }
            ready = !ready;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                _ = stopped.changed() => {}
            }
        }
    });
    stop
}

/// A pod's DELETE lost in the watch cache, the check off, another pod
/// changing throughout: every LIST at the current revision serves the ghost,
/// and the LIST at the compacted revision does not, once that revision is
/// past the delete. endpoints-guard, its ghost scan's pass off so that only
/// its compaction audit reaches etcd, takes the ghost's address out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_list_at_the_compacted_revision_reads_etcd_while_the_cache_is_unchecked() -> Result<()> {
    let options = ControlPlaneOptions::default().with_etcd_fault_proxy();
    the_audit_takes_out_a_ghost(options).await
}

/// The same behind a load balancer: two kube-apiservers, the DELETE lost to
/// both watch caches. endpoints-guard's connections (one per request in
/// flight: its client speaks HTTP/1.1) reach either server, so the audit's
/// probes and pages meet two caches that learn of each compaction at
/// different moments (docs/ghosts.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_load_balancer_the_audit_takes_out_a_ghost_both_caches_serve() -> Result<()> {
    let options = ControlPlaneOptions {
        apiservers: 2,
        ..ControlPlaneOptions::default()
    }
    .with_etcd_fault_proxy_for_every_apiserver();
    the_audit_takes_out_a_ghost(options).await
}

async fn the_audit_takes_out_a_ghost(options: ControlPlaneOptions) -> Result<()> {
    let options = options
        .etcd_compaction_interval(COMPACTION)
        .apiserver_arg("--feature-gates=DetectCacheInconsistency=false");
    let cp = ControlPlane::start(options).await?;
    cp.create_namespace(NS).await?;
    let guard = Guard::start(
        cp.client(),
        &[
            "--resync-interval",
            "10s",
            "--ghost-scan-qps",
            "0",
            "--compaction-audit-interval",
            "10s",
            // Never a full list for its turn: only a count that differs
            // lists.
            "--compaction-audit-full-every",
            "1000",
            // Every list in pages of one object: the audit's pages after
            // the first carry only their continue token.
            "--list-page-size",
            "1",
        ],
    )
    .await?;
    let observer = Observer::start(&cp.client(), NS);
    cp.service_with_pod(NS, "a", "10.1.0.1").await?;
    cp.running_pod(NS, "a-1", "a", "10.1.0.2", true).await?;
    cp.service_with_pod(NS, "b", "10.1.0.3").await?;
    Expected::default()
        .service("a", &["10.1.0.1", "10.1.0.2"])
        .wait(
            &cp.client(),
            NS,
            Duration::from_secs(60),
            "both pods of a published",
        )
        .await?;
    let stop_churn = churn(&cp, "b-0", "10.1.0.3");
    // A compaction revision before the ghost: etcd's count there agrees
    // with the cache's, and nothing is listed.
    let counted = "endpoints_guard_compaction_audits_total{resource=\"pods\",result=\"counted\"}";
    let started = Instant::now();
    while guard.metric(counted) < 1.0 {
        ensure!(
            started.elapsed() < TIMEOUT,
            "no compaction revision was counted within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let listed = "endpoints_guard_compaction_audits_total{resource=\"pods\",result=\"listed\"}";
    let listed_before = guard.metric(listed);
    eprintln!(
        "{:.0}s after the start a compaction revision was counted, not listed; {listed_before} listed before",
        started.elapsed().as_secs_f64()
    );
    // The judge reads the first kube-apiserver alone, so that the LISTs
    // any other one answers are endpoints-guard's.
    let apiservers = cp.apiserver_clients();
    let judge = apiservers.first().cloned().context("no kube-apiserver")?;
    let pods: Api<Pod> = Api::namespaced(judge, NS);

    cp.etcd_drop_events(&format!("/registry/pods/{NS}/a-1"), &["PUT", "DELETE"])
        .await?;
    let deleted = Instant::now();
    cp.force_delete_pod(NS, "a-1").await?;
    ensure!(
        pods.get_opt("a-1").await?.is_none(),
        "etcd should not have the ghost"
    );
    ensure!(cp.etcd_dropped_events().await? >= 1, "no event was dropped");
    let after_delete = current_revision(&pods).await?;

    let mut found = None;
    while deleted.elapsed() < TIMEOUT {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = current_revision(&pods).await?;
        let cached = match list_exact(&pods, now, None).await? {
            Exact::Listed(names) => names.iter().any(|n| n == "a-1"),
            Exact::Compacted => bail!("the current revision {now} answered 410"),
        };
        let (compacted, probes) = compacted_revision(&pods, now).await?;
        let at_compacted = match list_exact(&pods, compacted, None).await? {
            Exact::Listed(names) => names,
            // Compacted again between the bisection and the list.
            Exact::Compacted => continue,
        };
        let ghost_at_compacted = at_compacted.iter().any(|n| n == "a-1");
        eprintln!(
            "{:>5.0}s  current {now}: exact LIST serves the ghost: {cached}  |  compacted {compacted} \
             ({probes} probes, delete before {after_delete}): ghost listed: {ghost_at_compacted}, live pod listed: {}",
            deleted.elapsed().as_secs_f64(),
            at_compacted.iter().any(|n| n == "b-0"),
        );
        ensure!(
            cached,
            "the cache served an exact LIST at the current revision without the ghost: \
             the churn did not keep a snapshot, so this run shows nothing"
        );
        if compacted >= after_delete && !ghost_at_compacted {
            ensure!(
                at_compacted.iter().any(|n| n == "b-0"),
                "the list at {compacted} misses the live pod"
            );
            found = Some(deleted.elapsed());
            break;
        }
    }
    let listed_without = found.with_context(|| {
        format!("no LIST at the compacted revision left out the ghost within {TIMEOUT:?}")
    })?;
    let took = Expected::default()
        .service("a", &["10.1.0.1"])
        .wait(
            &cp.client(),
            NS,
            TIMEOUT.saturating_sub(deleted.elapsed()),
            "the ghost's address removed",
        )
        .await;
    stop_churn.send_replace(true);
    let suspects =
        guard.metric("endpoints_guard_compaction_audit_suspects_total{resource=\"pods\"}");
    eprintln!(
        "the LIST at the compacted revision left out the ghost {:.0}s after the delete; \
         endpoints-guard's audits: {} counted, {} deferred, {} listed, {} unchanged, {} failed, {suspects} suspects; \
         the address removed: {} ({:.0}s after the delete)",
        listed_without.as_secs_f64(),
        guard.metric(counted),
        guard.metric(
            "endpoints_guard_compaction_audits_total{resource=\"pods\",result=\"deferred\"}"
        ),
        guard.metric(listed),
        guard.metric(
            "endpoints_guard_compaction_audits_total{resource=\"pods\",result=\"unchanged\"}"
        ),
        guard
            .metric("endpoints_guard_compaction_audits_total{resource=\"pods\",result=\"failed\"}"),
        took.is_ok(),
        deleted.elapsed().as_secs_f64(),
    );
    for (i, client) in apiservers.iter().enumerate() {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = client.request_text(request).await?;
        eprintln!(
            "kube-apiserver {}: {} LISTs of pods answered{}",
            i + 1,
            crate::common::metric_value(
                &text,
                "apiserver_request_total{resource=\"pods\",verb=\"LIST\"}"
            ),
            if i == 0 {
                " (the judge's among them)"
            } else {
                ""
            },
        );
    }
    took?;
    ensure!(suspects >= 1.0, "the audit counted no suspect");
    ensure!(
        guard.metric(listed) > listed_before,
        "no count differed: the ghost was not listed for"
    );
    ensure!(
        guard.metric("endpoints_guard_compaction_audits_total{result=\"failed\"}") == 0.0,
        "an audit failed"
    );
    ensure!(
        guard.metric("endpoints_guard_ghosts_found_total{resource=\"pods\"}") >= 1.0,
        "the ghost was not counted"
    );
    let spurious = observer.spurious_deletions();
    ensure!(
        spurious.is_empty(),
        "Endpoints of live Services were deleted: {spurious:?}"
    );
    guard.stop().await;
    Ok(())
}
