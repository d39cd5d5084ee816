//! Endpoints without a Service that endpoints-guard does not manage (a user's
//! leftovers): never deleted, only reported, as the gauge
//! `endpoints_guard_unmanaged_orphan_endpoints{scope="cluster"}`.
//!
//! The gauge follows the reconcile of each key, not one comparison of two
//! caches. The Services and Endpoints caches are filled by two watches, each
//! at its own point in time: Endpoints created just after their Service can be
//! in the Endpoints cache before the Service is in its own. Counting from one
//! snapshot of both (what the start-up sweep did) then reports an orphan that
//! is not one, and nothing corrects it until the next sweep. Here every change
//! to either object queues its key, and the key's reconcile records what the
//! caches say at that moment, so the count converges once both watches have
//! caught up.

use std::collections::HashSet;
use std::sync::Mutex;

use tracing::warn;

use super::Context;
use super::effects::Effect;
use super::kinds::CachedEndpoints;
use crate::desired::scope::Managers;
use crate::locks::lock;
use hardened_watcher::ObjectKey;

/// The keys of the unmanaged orphan Endpoints, as last reconciled.
#[derive(Default)]
pub struct UnmanagedOrphans {
    keys: Mutex<HashSet<ObjectKey>>,
}

impl UnmanagedOrphans {
    /// Records whether `key` is an unmanaged orphan now and hands the new
    /// count to `report` while the record is held, so two workers cannot
    /// report their counts out of order. Returns true if `key` just became one.
    pub fn record(&self, key: &ObjectKey, orphan: bool, report: impl FnOnce(usize)) -> bool {
        let mut keys = lock(&self.keys);
        let became = if orphan {
            keys.insert(key.clone())
        } else {
            keys.remove(key);
            false
        };
        report(keys.len());
        became
    }
}

/// Whether the Endpoints reconcile of a key finds an unmanaged orphan:
/// Endpoints that we would not delete, and no Service in the cache. Left to
/// the worker as an [`Effect::Orphan`], which [`record`]s it.
pub(crate) fn observe(service_cached: bool, endpoints: Option<&CachedEndpoints>) -> Effect {
    // Upstream's Endpoints are upstream's to delete in opt-in scope, and ours
    // to delete in all scope: an orphan is anybody else's.
    let managed_by = endpoints.and_then(|ep| ep.managed_by());
    let orphan =
        !service_cached && endpoints.is_some() && !Managers::OWN_AND_UPSTREAM.endpoints(managed_by);
    Effect::Orphan {
        orphan,
        // Only logged when the key becomes an orphan: not copied otherwise,
        // as this runs in every Endpoints reconcile.
        managed_by: managed_by.filter(|_| orphan).map(str::to_owned),
    }
}

/// Records whether `key` is an unmanaged orphan now, moves the gauge, and
/// logs one that just became one.
pub(crate) fn record(ctx: &Context, key: &ObjectKey, orphan: bool, managed_by: Option<&str>) {
    let gauge = ctx
        .metrics
        .unmanaged_orphans
        .with_label_values(&["cluster"]);
    let became = ctx
        .endpoints
        .unmanaged_orphans
        .record(key, orphan, |count| {
            gauge.set(i64::try_from(count).unwrap_or(i64::MAX))
        });
    if became {
        warn!(%key, ?managed_by, "Endpoints without a Service that endpoints-guard does not manage; not deleting them");
    }
}

#[cfg(test)]
mod tests {
    use crate::reconcile::kinds::CachedService;
    use hardened_watcher::{ObjectKey, WatchEventKind};
    use serde_json::json;

    use super::UnmanagedOrphans;
    use crate::reconcile::Context;
    use crate::reconcile::kinds::CachedEndpoints;
    use crate::reconcile::publish::reconcile;
    use crate::reconcile::testkit::{context, settled, untimed};
    use crate::settings::Controller;

    fn gauge(ctx: &Context) -> i64 {
        ctx.metrics
            .unmanaged_orphans
            .with_label_values(&["cluster"])
            .get()
    }

    /// Endpoints with no managed-by label, as a user makes them.
    fn user_endpoints(ctx: &Context, name: &str) {
        let ep = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": format!("{name}-ep-uid"), "resourceVersion": "7"},
            "subsets": [{"addresses": [{"ip": "192.0.2.1"}], "ports": [{"port": 80}]}],
        }))
        .unwrap_or_else(|err| panic!("endpoints: {err}"));
        if let Some(cached) = CachedEndpoints::new(ep) {
            ctx.stores
                .endpoints
                .apply_watch_event(WatchEventKind::Added, cached);
        }
    }

    /// A selector-less Service, whose Endpoints belong to its user.
    fn selectorless_service(ctx: &Context, name: &str) {
        let svc = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": format!("{name}-uid"), "resourceVersion": "6"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
        }))
        .unwrap_or_else(|err| panic!("service: {err}"));
        ctx.stores
            .services
            .apply_watch_event(WatchEventKind::Added, CachedService::new(svc));
    }

    #[test]
    fn a_key_counts_once_however_often_it_is_recorded() {
        let orphans = UnmanagedOrphans::default();
        let mut reported = Vec::new();
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        assert!(orphans.record(&a, true, |n| reported.push(n)));
        assert!(!orphans.record(&a, true, |n| reported.push(n)));
        assert!(orphans.record(&b, true, |n| reported.push(n)));
        assert!(!orphans.record(&a, false, |n| reported.push(n)));
        assert!(!orphans.record(&a, false, |n| reported.push(n)));
        assert_eq!(reported, [1, 1, 2, 1, 1]);
    }

    /// The flake of `e2e_rows`: a user's Endpoints of a selector-less Service
    /// reached the Endpoints cache before their Service reached the Services
    /// cache, and the start-up sweep counted them as a second orphan for
    /// good. The Service's arrival queues the key; its reconcile takes the
    /// key off the count.
    #[tokio::test]
    async fn endpoints_cached_before_their_service_stop_counting_when_it_arrives() {
        let ctx = context();
        let (manual, orphan) = (
            ObjectKey::new("ns", "manual"),
            ObjectKey::new("ns", "orphan"),
        );
        user_endpoints(&ctx, "orphan");
        user_endpoints(&ctx, "manual");
        for key in [&orphan, &manual] {
            settled(&ctx, Controller::Endpoints, key)
                .await
                .unwrap_or_else(|err| panic!("reconcile {key}: {err}"));
        }
        assert_eq!(
            gauge(&ctx),
            2,
            "both look orphaned while the Service is not cached"
        );

        selectorless_service(&ctx, "manual");
        settled(&ctx, Controller::Endpoints, &manual)
            .await
            .unwrap_or_else(|err| panic!("reconcile {manual}: {err}"));
        assert_eq!(gauge(&ctx), 1, "only the real orphan is counted");

        ctx.stores
            .endpoints
            .apply_watch_event(WatchEventKind::Deleted, {
                let ep = serde_json::from_value(json!({
                    "metadata": {"namespace": "ns", "name": "orphan", "uid": "orphan-ep-uid", "resourceVersion": "9"},
                }))
                .unwrap_or_else(|err| panic!("endpoints: {err}"));
                CachedEndpoints::new(ep).unwrap_or_else(|| panic!("cached endpoints"))
            });
        settled(&ctx, Controller::Endpoints, &orphan)
            .await
            .unwrap_or_else(|err| panic!("reconcile {orphan}: {err}"));
        assert_eq!(gauge(&ctx), 0, "a deleted orphan is no longer counted");
    }

    /// The count is the worker's to move: a reconcile only returns what it
    /// found, and nothing is counted until its outcome is settled.
    #[tokio::test]
    async fn a_reconcile_leaves_the_count_to_its_worker() {
        let ctx = context();
        let orphan = ObjectKey::new("ns", "orphan");
        user_endpoints(&ctx, "orphan");
        let outcome = reconcile(&ctx, Controller::Endpoints, &orphan, &untimed(&ctx)).await;
        assert_eq!(gauge(&ctx), 0, "counted before the worker settled");
        outcome
            .settle(&ctx, Controller::Endpoints, &orphan)
            .unwrap_or_else(|err| panic!("reconcile {orphan}: {err}"));
        assert_eq!(gauge(&ctx), 1, "counted once settled");
    }
}
