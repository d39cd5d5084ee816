//! The reads endpoints-guard trusts, on a real control plane: etcd restored
//! from a backup under a running controller (both ways), a DELETE lost in
//! kube-apiserver's own watch cache, work dropped while writes were denied,
//! drift that is only watch lag, and tombstones under churn. endpoints-guard
//! runs in-process straight against kube-apiserver, never restarted.

use std::time::{Duration, Instant};

use crate::common::{Guard, eventually};
use anyhow::{Context, Result, ensure};
use eg_chaos::{Expected, Observer};
use eg_harness::{ControlPlane, ControlPlaneOptions, ServiceBuilder};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

const NS: &str = "store";
const RESYNC: Duration = Duration::from_secs(10);

struct Env {
    cp: ControlPlane,
    guard: Guard,
    observer: Observer,
}

impl Env {
    async fn start(options: ControlPlaneOptions, args: &[&str]) -> Result<Self> {
        let cp = ControlPlane::start(options).await?;
        cp.create_namespace(NS).await?;
        let mut argv = if args.contains(&"--resync-interval") {
            Vec::new()
        } else {
            vec!["--resync-interval", "10s"]
        };
        argv.extend_from_slice(args);
        let guard = Guard::start(cp.client(), &argv).await?;
        let observer = Observer::start(&cp.client(), NS);
        Ok(Self {
            cp,
            guard,
            observer,
        })
    }

    async fn service_with_pod(&self, name: &str, ip: &str) -> Result<()> {
        self.cp.service_with_pod(NS, name, ip).await
    }

    async fn pod(&self, name: &str, app: &str, ip: &str, ready: bool) -> Result<()> {
        self.cp.running_pod(NS, name, app, ip, ready).await
    }

    async fn set_ready(&self, name: &str, ip: &str, ready: bool) -> Result<()> {
        self.cp.set_pod_ready(NS, name, ip, ready).await
    }

    /// Service `a` with two ready pods, a-0 at 10.1.0.1 and a-1 at 10.1.0.2,
    /// both in its Endpoints.
    async fn service_with_two_pods(&self) -> Result<()> {
        self.service_with_pod("a", "10.1.0.1").await?;
        self.pod("a-1", "a", "10.1.0.2", true).await?;
        self.converge(
            &Expected::default().service("a", &["10.1.0.1", "10.1.0.2"]),
            Duration::from_secs(60),
            "both pods in the Endpoints",
        )
        .await
        .map(drop)
    }

    async fn delete_service(&self, name: &str) -> Result<()> {
        self.cp.delete_service(NS, name).await
    }

    /// Waits until the namespace's Endpoints match; returns how long it took.
    async fn converge(
        &self,
        expected: &Expected,
        timeout: Duration,
        what: &str,
    ) -> Result<Duration> {
        expected.wait(&self.cp.client(), NS, timeout, what).await
    }

    /// Summed over every resource.
    fn metric_sum(&self, name: &str) -> f64 {
        self.guard.metric(&format!("endpoints_guard_{name}"))
    }

    fn assert_no_spurious_deletions(&self) {
        let spurious = self.observer.spurious_deletions();
        assert!(
            spurious.is_empty(),
            "Endpoints of live Services were deleted: {spurious:?}"
        );
    }
}

/// Both restore styles, endpoints-guard running throughout and not restarted.
async fn etcd_restore(bumped: bool) -> Result<()> {
    let mut env = Env::start(ControlPlaneOptions::default(), &[]).await?;
    env.service_with_pod("a", "10.1.0.1").await?;
    env.service_with_pod("b", "10.1.1.1").await?;
    let before = Expected::default()
        .service("a", &["10.1.0.1"])
        .service("b", &["10.1.1.1"]);
    env.converge(
        &before,
        Duration::from_secs(60),
        "the state before the backup",
    )
    .await?;
    let backup = env.cp.backup_etcd().await?;
    // After the backup: a's pod turns not ready, b is deleted, c created, and
    // thousands of unrelated revisions are written.
    env.set_ready("a-0", "10.1.0.1", false).await?;
    env.delete_service("b").await?;
    env.service_with_pod("c", "10.1.2.1").await?;
    env.cp.write_unrelated_revisions(NS, 3000).await?;
    let after = Expected::default()
        .service("a", &[])
        .absent("b")
        .service("c", &["10.1.2.1"]);
    env.converge(
        &after,
        Duration::from_secs(60),
        "the state before the restore",
    )
    .await?;

    env.observer.store_restoring();
    if bumped {
        env.cp
            .restore_etcd_bumped(&backup, 1_000_000)
            .await
            .context("bump-revision restore")?;
    } else {
        env.cp
            .restore_etcd_plain(&backup)
            .await
            .context("plain restore")?;
    }
    env.observer.store_restored();
    let restored = Instant::now();
    // The restored Services and pods are the truth again.
    let truth = Expected::default()
        .service("a", &["10.1.0.1"])
        .service("b", &["10.1.1.1"])
        .absent("c");
    let took = env
        .converge(
            &truth,
            RESYNC + Duration::from_secs(15),
            "the Endpoints the restored store calls for",
        )
        .await?;
    eprintln!(
        "{} restore: restored state reached {:.1}s after kube-apiserver was back (resync interval {RESYNC:?})",
        if bumped { "bump-revision" } else { "plain" },
        took.as_secs_f64()
    );
    ensure!(
        took <= RESYNC + Duration::from_secs(5),
        "the restored state took {took:?}, more than one resync interval"
    );
    // A new change made after the restore appears within seconds.
    let change = Instant::now();
    env.pod("a-1", "a", "10.1.0.2", true).await?;
    let new_pod = truth.clone().service("a", &["10.1.0.1", "10.1.0.2"]);
    let latency = env
        .converge(
            &new_pod,
            Duration::from_secs(20),
            "a pod created after the restore",
        )
        .await?;
    eprintln!(
        "a pod created after the restore reached its Endpoints in {:.2}s ({:.1}s after the restore)",
        latency.as_secs_f64(),
        restored.elapsed().as_secs_f64()
    );
    ensure!(
        change.elapsed() <= Duration::from_secs(5),
        "a change after the restore took {:?}",
        change.elapsed()
    );
    let rewinds = env.metric_sum("store_rewinds_total");
    ensure!(
        rewinds >= 1.0,
        "no store rewind was counted:\n{}",
        env.guard.metrics_text()
    );
    eprintln!("store_rewinds_total (all resources): {rewinds}");
    env.assert_no_spurious_deletions();
    env.guard.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_etcd_restore_under_a_running_controller() -> Result<()> {
    etcd_restore(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bump_revision_etcd_restore_under_a_running_controller() -> Result<()> {
    etcd_restore(true).await
}

/// kube-apiserver's watch cache loses a pod's DELETE (etcd-fault-proxy drops
/// its events): LISTs and watches keep the pod, a GET does not. The ghost
/// scan finds it and the pod's address goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_lost_in_the_watch_cache_is_found_by_reads_from_etcd() -> Result<()> {
    let env = Env::start(ControlPlaneOptions::default().with_etcd_fault_proxy(), &[]).await?;
    env.service_with_two_pods().await?;
    env.cp
        .etcd_drop_events(&format!("/registry/pods/{NS}/a-1"), &["PUT", "DELETE"])
        .await?;
    let deleted = Instant::now();
    env.cp.force_delete_pod(NS, "a-1").await?;
    // The fault is real: a LIST (from the watch cache) still has the pod, a
    // GET (from etcd) does not.
    let pods: Api<Pod> = Api::namespaced(env.cp.client(), NS);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = pods.list(&ListParams::default()).await?;
    ensure!(
        listed
            .items
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("a-1")),
        "the watch cache should still serve a-1 in LISTs"
    );
    ensure!(
        pods.get_opt("a-1").await?.is_none(),
        "etcd should not have a-1"
    );
    ensure!(
        env.cp.etcd_dropped_events().await? >= 1,
        "no event was dropped"
    );
    let took = env
        .converge(
            &Expected::default().service("a", &["10.1.0.1"]),
            Duration::from_secs(60),
            "the ghost pod's address removed",
        )
        .await?;
    let ghosts = env
        .guard
        .metric("endpoints_guard_ghosts_found_total{resource=\"pods\"}");
    eprintln!(
        "ghost pod found and its address removed {:.1}s after the delete; ghosts_found_total{{pods}} = {ghosts}; ghost scan reads {}",
        deleted.elapsed().as_secs_f64(),
        env.guard.metric("endpoints_guard_ghost_scan_reads_total")
    );
    ensure!(ghosts >= 1.0, "the ghost was not counted");
    ensure!(
        took <= Duration::from_secs(40),
        "finding the ghost took {took:?}"
    );
    env.assert_no_spurious_deletions();
    env.guard.stop().await;
    Ok(())
}

/// A DELETE lost in kube-apiserver's watch cache, with the ghost scan off:
/// the resync, which lists at exactly the store's current resourceVersion,
/// finds it once kube-apiserver serves that list from etcd. It does so once
/// its own consistency check (every 5 to 7.5 minutes) found its cache
/// wrong (`make chaos` waits for that, docs/ghosts.md), and, the path this
/// shorter test takes, once compaction removed every snapshot of the cache
/// at or below that resourceVersion: pods quiet since before the last
/// compaction (here every 60 s). A consistent LIST keeps serving the ghost
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_lost_in_the_watch_cache_is_found_by_the_resyncs_exact_list() -> Result<()> {
    let options = ControlPlaneOptions::default()
        .with_etcd_fault_proxy()
        .etcd_compaction_interval(Duration::from_secs(60));
    let env = Env::start(options, &["--ghost-scan-qps", "0"]).await?;
    env.service_with_two_pods().await?;
    env.cp
        .etcd_drop_events(&format!("/registry/pods/{NS}/a-1"), &["PUT", "DELETE"])
        .await?;
    let deleted = Instant::now();
    env.cp.force_delete_pod(NS, "a-1").await?;
    let pods: Api<Pod> = Api::namespaced(env.cp.client(), NS);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let has_ghost = |list: &kube::core::ObjectList<Pod>| {
        list.items
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("a-1"))
    };
    ensure!(
        has_ghost(&pods.list(&ListParams::default()).await?),
        "the watch cache should still serve a-1 in LISTs"
    );
    ensure!(
        pods.get_opt("a-1").await?.is_none(),
        "etcd should not have a-1"
    );
    let took = env
        .converge(
            &Expected::default().service("a", &["10.1.0.1"]),
            Duration::from_secs(300),
            "the ghost pod's address removed by the resync",
        )
        .await?;
    eprintln!(
        "ghost found by the resync {:.1}s after the delete; a consistent LIST still serves it: {}",
        deleted.elapsed().as_secs_f64(),
        has_ghost(&pods.list(&ListParams::default()).await?)
    );
    // With the scan off, only a list could make the ghost a candidate for
    // the guard's live read.
    ensure!(
        env.guard.metric("endpoints_guard_ghost_scan_reads_total") == 0.0,
        "the ghost scan was off"
    );
    ensure!(
        took <= Duration::from_secs(300),
        "finding the ghost took {took:?}"
    );
    env.assert_no_spurious_deletions();
    env.guard.stop().await;
    Ok(())
}

/// Endpoints writes are denied (a ValidatingAdmissionPolicy) longer than the
/// retry budget while a pod turns not ready; the key is dropped; once writes
/// are allowed again the Endpoints converge within one resync interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn work_dropped_after_its_retries_comes_back_with_the_resync() -> Result<()> {
    let env = Env::start(ControlPlaneOptions::default(), &["--max-retries", "3"]).await?;
    env.service_with_two_pods().await?;
    env.cp.deny_endpoints_writes(NS).await?;
    env.set_ready("a-1", "10.1.0.2", false).await?;
    eventually(
        Duration::from_secs(30),
        "the key to run out of retries",
        || async {
            Ok((env.guard.metric("endpoints_guard_queue_dropped_total") >= 1.0).then_some(()))
        },
    )
    .await?;
    env.cp.allow_endpoints_writes().await?;
    let took = env
        .converge(
            &Expected::default().service("a", &["10.1.0.1"]),
            RESYNC + Duration::from_secs(10),
            "the Endpoints after writes are allowed again",
        )
        .await?;
    eprintln!(
        "dropped key converged {:.1}s after writes were allowed again (resync interval {RESYNC:?})",
        took.as_secs_f64()
    );
    ensure!(took <= RESYNC + Duration::from_secs(3), "took {took:?}");
    env.guard.stop().await;
    Ok(())
}

/// Pods created, flipped and deleted without pause while resyncs run every
/// 3 s: the differences a resync finds are the watch being behind, and none
/// may count as drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_lag_under_churn_is_not_drift() -> Result<()> {
    // Every resync in full: the lists are what this holds to account.
    let env = Env::start(
        ControlPlaneOptions::default(),
        &["--resync-interval", "3s", "--full-resync-interval", "3s"],
    )
    .await?;
    env.service_with_pod("a", "10.1.0.1").await?;
    let until = Instant::now() + Duration::from_secs(30);
    let mut i = 0u32;
    while Instant::now() < until {
        let name = format!("churn-{i}");
        let ip = format!("10.2.{}.{}", (i / 250) % 250, i % 250 + 1);
        env.pod(&name, "a", &ip, i.is_multiple_of(2)).await?;
        if i.is_multiple_of(3) {
            env.set_ready(&name, &ip, !i.is_multiple_of(2)).await?;
        }
        if i >= 2 {
            env.cp
                .force_delete_pod(NS, &format!("churn-{}", i - 2))
                .await?;
        }
        i += 1;
    }
    // Let the last resync's differences settle.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let resyncs = env
        .guard
        .metric("endpoints_guard_resync_duration_seconds_count");
    let drift: f64 = ["services", "pods", "endpoints"]
        .iter()
        .flat_map(|r| {
            ["missed_add", "missed_update", "missed_delete"].map(|k| {
                env.guard.metric(&format!(
                    "endpoints_guard_resync_drift_total{{resource=\"{r}\",kind=\"{k}\"}}"
                ))
            })
        })
        .sum();
    eprintln!("{i} pods churned; {resyncs} resyncs; drift counted: {drift}");
    ensure!(resyncs >= 5.0, "only {resyncs} resyncs ran");
    ensure!(
        drift == 0.0,
        "watch lag was counted as drift:\n{}",
        env.guard.metrics_text()
    );
    env.guard.stop().await;
    Ok(())
}

/// Pods created and deleted without pause, some named by our Endpoints, some
/// by the user-made Endpoints of a selector-less Service (which are never
/// ours to change), some by nothing: tombstones must stay bounded and be gone
/// one resync after the churn stops. `EG_CHURN_SECONDS` sets how long (60 s
/// by default; `make chaos` runs 600).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tombstones_stay_bounded_under_pod_churn() -> Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    use kube::api::PostParams;
    let seconds: u64 = std::env::var("EG_CHURN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let env = Env::start(ControlPlaneOptions::default(), &[]).await?;
    env.service_with_pod("a", "10.1.0.1").await?;
    env.cp
        .create_service(ServiceBuilder::new(NS, "manual").port("http", 80, 8080, "TCP"))
        .await?;
    let tombstones = |resource: &str| {
        env.guard.metric(&format!(
            "endpoints_guard_cache_tombstones{{resource=\"{resource}\"}}"
        ))
    };
    let user_endpoints: Api<Endpoints> = Api::namespaced(env.cp.client(), NS);
    let until = Instant::now() + Duration::from_secs(seconds);
    let (mut i, mut max) = (0u32, 0.0f64);
    while Instant::now() < until {
        let (name, ip) = (
            format!("p-{i}"),
            format!("10.3.{}.{}", (i / 250) % 250, i % 250 + 1),
        );
        let app = if i.is_multiple_of(3) { "nobody" } else { "a" };
        env.pod(&name, app, &ip, true).await?;
        if i % 3 == 1 {
            // The user's own Endpoints of "manual" name this pod too.
            let uid = Api::<Pod>::namespaced(env.cp.client(), NS)
                .get(&name)
                .await?
                .metadata
                .uid
                .unwrap_or_default();
            let ep: Endpoints = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "manual"},
                "subsets": [{"addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "namespace": NS, "name": name, "uid": uid}}],
                             "ports": [{"port": 8080}]}],
            }))?;
            match user_endpoints.get_opt("manual").await? {
                Some(old) => {
                    let mut ep = ep;
                    ep.metadata.resource_version = old.metadata.resource_version;
                    user_endpoints
                        .replace("manual", &PostParams::default(), &ep)
                        .await?;
                }
                None => {
                    user_endpoints.create(&PostParams::default(), &ep).await?;
                }
            }
        }
        if i >= 3 {
            env.cp.force_delete_pod(NS, &format!("p-{}", i - 3)).await?;
        }
        let now = tombstones("pods");
        if now > max {
            max = now;
            eprintln!(
                "pod tombstones {now} after {i} pods; reconciles ok {} / error {}, queue depth {}",
                env.guard
                    .metric("endpoints_guard_reconciles_total{result=\"ok\"}"),
                env.guard
                    .metric("endpoints_guard_reconciles_total{result=\"error\"}"),
                env.guard
                    .metric("endpoints_guard_queue_depth{queue=\"services\"}"),
            );
        }
        i += 1;
    }
    // One resync after the churn stops, every tombstone is gone.
    let settled = eventually(
        RESYNC * 2 + Duration::from_secs(5),
        "tombstones released",
        || async {
            let left: f64 = ["pods", "services", "endpoints"]
                .iter()
                .map(|r| tombstones(r))
                .sum();
            Ok((left == 0.0).then_some(()))
        },
    )
    .await;
    eprintln!(
        "{i} pods created and deleted in {seconds}s: at most {max} pod tombstones; now {}",
        tombstones("pods")
    );
    settled.with_context(|| env.guard.metrics_text())?;
    ensure!(max <= 20.0, "pod tombstones grew to {max}");
    env.guard.stop().await;
    Ok(())
}
