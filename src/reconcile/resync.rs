//! The periodic full resync diff and the start-up sweep.
//!
//! A watch can lose events for good (a lost DELETE leaves a ghost until a relist;
//! upstream informers relist every 12–24 h and their resync only replays the cache).
//! Every interval, a consistent paginated LIST of each resource is diffed against
//! the cache: what differs is counted by resource and kind, repaired, and the
//! affected Services are reconciled.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::Api;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::objects::{CachedEndpoints, without_managed_fields};
use super::{Context, Shared, handlers};
use crate::desired::{self, PodInfo};
use crate::error::Result;
use crate::watch::list::{ListFailed, list_into_cache};
use crate::watch::{Cached, Change, ListDiff};

/// Where to list from: the whole cluster or one namespace.
#[derive(Clone)]
pub struct Apis {
    pub services: Api<Service>,
    pub pods: Api<Pod>,
    pub endpoints: Api<Endpoints>,
    pub page_size: u32,
}

fn record<T: Cached>(ctx: &Context, resource: &str, diff: &ListDiff<T>) {
    let drift = &ctx.metrics.resync_drift;
    drift
        .with_label_values(&[resource, "missed_add"])
        .inc_by(diff.added as u64);
    drift
        .with_label_values(&[resource, "missed_update"])
        .inc_by(diff.updated as u64);
    drift
        .with_label_values(&[resource, "missed_delete"])
        .inc_by(diff.deletion_candidates as u64);
}

/// One full resync. Each resource is listed consistently and diffed into its
/// cache page by page ([`list_into_cache`]), so a resync holds one page of
/// objects on top of the caches, never a second copy of them. Errors are retried
/// at the next interval; a list that fails midway turns nothing into a deletion
/// candidate (the upserts of its pages so far stay: they passed the guard, and
/// are handled like any other change).
pub async fn resync_once(ctx: &Arc<Context>, apis: &Apis) -> Result<()> {
    let start = Instant::now();
    resync_resource(
        ctx,
        "services",
        &apis.services,
        apis.page_size,
        without_managed_fields,
        &ctx.stores.services,
        |change| handlers::on_service(ctx, change),
    )
    .await?;
    resync_resource(
        ctx,
        "pods",
        &apis.pods,
        apis.page_size,
        |p: Pod| PodInfo::from_pod(&p),
        &ctx.stores.pods,
        |change| handlers::on_pod(ctx, change),
    )
    .await?;
    resync_resource(
        ctx,
        "endpoints",
        &apis.endpoints,
        apis.page_size,
        CachedEndpoints::new,
        &ctx.stores.endpoints,
        |change| handlers::on_endpoints(ctx, change),
    )
    .await?;

    sweep(ctx, true);
    let elapsed = start.elapsed().as_secs_f64();
    ctx.metrics.resync_duration.observe(elapsed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    ctx.metrics.last_successful_resync.set(now);
    info!(seconds = elapsed, "full resync diff done");
    Ok(())
}

/// Diffs one resource into its cache, records the drift and hands every change
/// to `handle`, the changes of a list that failed midway included.
async fn resync_resource<K, T>(
    ctx: &Context,
    resource: &str,
    api: &Api<K>,
    page_size: u32,
    project: impl Fn(K) -> Option<T>,
    store: &Shared<T>,
    handle: impl Fn(&Change<T>),
) -> Result<()>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
    T: Cached,
{
    let (diff, failed) = match list_into_cache(api, page_size, project, store.inner()).await {
        Ok(diff) => (diff, None),
        Err(failed) => {
            let ListFailed { error, applied } = *failed;
            (applied, Some(error))
        }
    };
    record(ctx, resource, &diff);
    for change in &diff.changes {
        handle(change);
    }
    match failed {
        None => Ok(()),
        Some(error) => Err(error.into()),
    }
}

/// Compares Services with Endpoints in the caches: Endpoints we manage whose
/// Service is missing are queued (their reconcile confirms with a live read before
/// deleting anything); Endpoints we do not manage are only reported; selector
/// Services without Endpoints are queued. `count_drift` is false for the start-up
/// sweep, where nothing has drifted yet.
pub fn sweep(ctx: &Context, count_drift: bool) {
    let services = ctx.stores.services.read();
    let endpoints = ctx.stores.endpoints.read();
    let mut unmanaged = 0;
    let mut orphaned = 0;
    for ep in endpoints.iter() {
        let key = ep.key();
        if services.get(&key).is_some() {
            continue;
        }
        if ep.is_deletable() {
            orphaned += 1;
            ctx.queue.add(key);
        } else {
            unmanaged += 1;
            tracing::debug!(%key, managed_by = ?ep.managed_by(), "Endpoints without a Service, not managed by us: left alone");
        }
    }
    let mut missing = 0;
    for svc in services.iter() {
        if desired::managed_selector(svc).is_some() && endpoints.get(&svc.key()).is_none() {
            missing += 1;
            ctx.queue.add(svc.key());
        }
    }
    ctx.metrics
        .unmanaged_orphans
        .with_label_values(&["cluster"])
        .set(unmanaged);
    if unmanaged > 0 {
        warn!(
            count = unmanaged,
            "Endpoints without a Service that endpoints-guard does not manage; not deleting them"
        );
    }
    if count_drift {
        let drift = &ctx.metrics.resync_drift;
        drift
            .with_label_values(&["endpoints", "orphaned"])
            .inc_by(orphaned);
        drift
            .with_label_values(&["endpoints", "missing"])
            .inc_by(missing);
    }
}
