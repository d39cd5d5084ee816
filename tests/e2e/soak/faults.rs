//! The soak's fault schedule: each fault is set (through watch-chaos, etcd,
//! kube-apiserver or an admission policy, as the chaos matrix does), held for
//! its window while the workload keeps running (plus, where the fault needs
//! one, a change made on purpose so that it has something to bite), then
//! cleared. etcd compaction every 10 s and watch streams cut every 30 s run
//! beside all of them (tests/e2e/soak.rs), and kube-apiserver restarts every
//! 5 minutes.

use std::time::Duration;

use anyhow::Result;
use eg_soak::workload::STABLE;
use serde_json::json;

use super::{Ctx, NS};

/// The order the faults come in, over and over (most telling first, so the
/// 3-minute run gets them).
pub const ROTATION: [&str; 12] = [
    "failure-a-replay",
    "lost-pod-deletes",
    "lost-service-deletes",
    "prevkv-nil-500",
    "reordered-updates",
    "bare-404-on-get",
    "cut-mid-event",
    "endpoints-writes-denied",
    "etcd-dropped-pod-delete",
    "failure-a-old-delete-rv",
    "etcd-restore",
    "duplicated-events",
];

/// endpoints-guard's `--ghost-scan-qps` in the soak.
pub const GHOST_SCAN_QPS: f64 = 20.0;
/// The ghost scan's second read of a suspect comes this long after the first.
pub const GHOST_RECHECK: Duration = Duration::from_secs(10);

/// How long endpoints-guard's ghost scan may take to find a ghost among
/// `pods`: a pass reads its targets (every pod the Endpoints and slices
/// point at, and their Services) at --ghost-scan-qps, and its target list is
/// made when it starts; a pod created after that is read in the next pass.
/// So two passes, and the recheck of the suspect.
pub fn ghost_scan_bound(pods: usize) -> Duration {
    let pass = Duration::from_secs_f64((pods + 50) as f64 / GHOST_SCAN_QPS);
    pass * 2 + GHOST_RECHECK
}

/// Roughly how long `fault` takes from start to convergence: a fault is only
/// started when this fits in the time left, so the run ends near its length.
pub fn expected(ctx: &Ctx, fault: &str) -> Duration {
    match fault {
        "etcd-dropped-pod-delete" => {
            let pods = ctx.workload.try_lock().map_or(3000, |w| w.pod_count());
            ctx.window + ghost_scan_bound(pods)
        }
        "etcd-restore" | "apiserver-restart" => ctx.window + Duration::from_secs(30),
        "endpoints-writes-denied" => ctx.deny + Duration::from_secs(10),
        // Lost deletes wait for the next resync.
        "lost-pod-deletes" | "lost-service-deletes" => ctx.window + Duration::from_secs(15),
        _ => ctx.window + Duration::from_secs(2),
    }
}

/// Sets `fault`, holds it for its window, clears it. Returns the time the
/// controller gets to converge after it, when it is not the usual budget.
pub async fn apply(ctx: &mut Ctx, fault: &str) -> Result<Option<Duration>> {
    let proxy = ctx.proxy.clone();
    let window = ctx.window;
    match fault {
        // Failure A on command: an old DELETE of a live Service the workload
        // never touches is replayed to the guard's watch.
        "failure-a-replay" => {
            proxy
                .post(
                    "/actions/replay-old-delete",
                    json!({"resource": "services", "namespace": NS, "name": STABLE[0], "pace_ms": 400}),
                )
                .await?;
            tokio::time::sleep(window).await;
        }
        // Failure A end to end: DELETE events carry the old RV, so a delete
        // sends the watch back into history.
        "failure-a-old-delete-rv" => {
            proxy
                .fault("services", "old-delete-rv", json!({"pace_ms": 400}))
                .await?;
            delete_service(ctx).await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        "lost-service-deletes" => {
            proxy.fault("services", "drop-deletes", json!({})).await?;
            delete_service(ctx).await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        "lost-pod-deletes" => {
            proxy.fault("pods", "drop-deletes", json!({})).await?;
            delete_pod(ctx).await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        // Updates held back and sent after the next: a selector change and
        // its revert arrive swapped.
        "reordered-updates" => {
            proxy
                .fault("services", "reorder", json!({"hold_ms": 2000}))
                .await?;
            proxy
                .fault("pods", "reorder", json!({"hold_ms": 2000}))
                .await?;
            {
                let mut w = ctx.workload.lock().await;
                if let Some(name) = w.some_service()
                    && let Some(app) = w.selector_of(&name)
                {
                    let flipped = match w.set_selector(&name, "nothing").await {
                        Ok(()) => w.set_selector(&name, &app).await,
                        Err(err) => Err(err),
                    };
                    if let Err(err) = flipped {
                        eprintln!("soak: selector of {name}: {err:#}");
                    }
                }
            }
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        // DELETEs replaced by ERROR 500 "PrevKv=nil" (the stream ends).
        "prevkv-nil-500" => {
            proxy.fault("services", "prevkv-nil", json!({})).await?;
            proxy.fault("pods", "prevkv-nil", json!({})).await?;
            delete_service(ctx).await?;
            delete_pod(ctx).await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        "cut-mid-event" => {
            proxy
                .fault("*", "cut-mid-event", json!({"after": 1}))
                .await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        "duplicated-events" => {
            proxy.fault("*", "duplicate", json!({})).await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        // Failure A while every GET of a Service is a bare text 404.
        "bare-404-on-get" => {
            proxy.fault("services", "bare-404", json!({})).await?;
            proxy
                .post(
                    "/actions/replay-old-delete",
                    json!({"resource": "services", "namespace": NS, "name": STABLE[1], "pace_ms": 400}),
                )
                .await?;
            tokio::time::sleep(window).await;
            proxy.clear_faults().await?;
        }
        "endpoints-writes-denied" => {
            ctx.cp.read().await.deny_endpoints_writes(NS).await?;
            tokio::time::sleep(ctx.deny).await;
            ctx.cp.read().await.allow_endpoints_writes().await?;
        }
        // kube-apiserver's watch cache misses a pod's DELETE (etcd-fault-proxy
        // drops it): every LIST and watch keeps the pod until kube-apiserver
        // restarts; only a GET finds it gone. The pod is a fresh ready pod
        // of the stable Service (which nothing edits), so its address is in
        // the Endpoints until endpoints-guard's ghost scan finds it gone.
        // The budget is the ghost scan's bound ([`ghost_scan_bound`]) on
        // top of the usual one.
        "etcd-dropped-pod-delete" => {
            let mut w = ctx.workload.lock().await;
            let name = w.create_pod_ready(STABLE[0], true).await?;
            let pods = w.pod_count();
            drop(w);
            // The new address reaches the Endpoints first.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut w = ctx.workload.lock().await;
            let cp = ctx.cp.read().await;
            cp.etcd_drop_events(&format!("/registry/pods/{NS}/{name}"), &["PUT", "DELETE"])
                .await?;
            w.ghosts.insert(name.clone());
            ctx.ghosts.insert(name.clone());
            ctx.ghost_ips.extend(w.ip_of(&name));
            w.delete_pod(&name).await?;
            drop(cp);
            drop(w);
            tokio::time::sleep(window).await;
            ctx.cp.read().await.etcd_clear_drops().await?;
            return Ok(Some(ctx.budget + ghost_scan_bound(pods)));
        }
        "apiserver-restart" => {
            ctx.cp.write().await.restart_apiserver().await?;
        }
        // A backup, changes for one window, then the restore (plain and
        // bumped in turn), the workload paused across it.
        "etcd-restore" => {
            let backup = ctx.cp.write().await.backup_etcd().await?;
            tokio::time::sleep(window).await;
            let _w = ctx.workload.lock().await;
            ctx.observer.store_restoring();
            ctx.slice_observer.store_restoring();
            let result = if ctx.restores.is_multiple_of(2) {
                ctx.cp.write().await.restore_etcd_plain(&backup).await
            } else {
                ctx.cp
                    .write()
                    .await
                    .restore_etcd_bumped(&backup, 1_000_000)
                    .await
            };
            ctx.restores += 1;
            ctx.observer.store_restored();
            ctx.slice_observer.store_restored();
            result?;
        }
        other => anyhow::bail!("no fault {other}"),
    }
    Ok(None)
}

/// Deletes one churned Service now (so a delete happens under the fault).
/// A failure (the model behind the API) is logged, not fatal.
async fn delete_service(ctx: &Ctx) -> Result<()> {
    let mut w = ctx.workload.lock().await;
    if let Some(name) = w.some_service()
        && let Err(err) = w.delete_service(&name).await
    {
        eprintln!("soak: deleting service {name}: {err:#}");
    }
    Ok(())
}

/// Deletes one small pod now.
async fn delete_pod(ctx: &Ctx) -> Result<()> {
    let mut w = ctx.workload.lock().await;
    if let Some(name) = w.some_small_pod()
        && let Err(err) = w.delete_pod(&name).await
    {
        eprintln!("soak: deleting pod {name}: {err:#}");
    }
    Ok(())
}
