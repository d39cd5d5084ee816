//! From cache changes to queue keys: which Services a change concerns. The
//! watchers call these as their sinks, for watch events, list diffs and
//! repairs alike, with the instant the change arrived (`received`), which
//! goes into the queue with the keys.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use tracing::warn;

use super::Context;
use super::cached::{CachedEndpoints, CachedNode, CachedService, CachedSlice, TargetRefUid};
use crate::config::Controller;
use crate::desired::slices::{HintMode, hint_mode};
use crate::desired::{self, PodInfo};
use hardened_watcher::{Cached, Change, Confirmation, LiveRead, ObjectKey, live};

/// A Service change that arrived at `received` (a watch event, or the answer
/// to the ghost scan's read; `None` in tests): its write is timed from then.
pub fn on_service(ctx: &Context, change: &Change<CachedService>, received: Option<Instant>) {
    let svc = match change {
        Change::Added(s) | Change::DeletionCandidate(s) => s,
        Change::Updated { new, .. } => new,
    };
    ctx.enqueue(svc.key(), received);
}

/// A pod change concerns the Services selecting it before and after; a change to
/// nothing Endpoints are made of (for example a new annotation) concerns none.
/// `received`: when it arrived, as for [`on_service`].
pub fn on_pod(ctx: &Context, change: &Change<PodInfo>, received: Option<Instant>) {
    let (old, new) = match change {
        Change::DeletionCandidate(p) => {
            release_if_unreferenced(ctx, p);
            (None, p)
        }
        Change::Added(p) => (None, p),
        Change::Updated { old, new } => {
            if old.same_endpoint_inputs(new) {
                return;
            }
            (Some(old), new)
        }
    };
    let services = ctx.stores.services.read();
    for svc in services.in_namespace(new.namespace()) {
        let Some(selector) = desired::managed_selector(svc) else {
            continue;
        };
        let selects_new = desired::selector_matches(selector, new.as_ref());
        let selects_old = old.is_some_and(|o| desired::selector_matches(selector, o.as_ref()));
        if selects_new || selects_old {
            ctx.enqueue(svc.key(), received);
        }
    }
}

/// A deleted pod that nothing of ours names has no address to guard: its
/// tombstone goes now. One that is named waits for the reconcile of its
/// Service, which reads the pod live before dropping the address.
fn release_if_unreferenced(ctx: &Context, pod: &PodInfo) {
    if !pod_referenced(ctx, pod.namespace(), pod.uid()) {
        ctx.stores
            .pods
            .confirm_deleted(&pod.key(), pod.uid(), Confirmation::Released);
    }
}

/// Whether an address of Endpoints we manage, or an endpoint of a slice we
/// manage, names the pod `uid`. Objects of others (users' Endpoints of
/// selector-less Services, mirrored slices) do not count: we never drop
/// their addresses, so nothing of theirs is at stake.
pub fn pod_referenced(ctx: &Context, namespace: &str, uid: &str) -> bool {
    let uid = TargetRefUid::new(uid);
    ctx.stores
        .endpoints
        .read()
        .in_namespace(namespace)
        .any(|ep| ep.is_deletable() && ep.references(&uid))
        || ctx
            .stores
            .slices
            .read()
            .in_namespace(namespace)
            .any(|slice| slice.is_adoptable() && slice.references(&uid))
}

/// The cached slices labelled for the Service `key` that we may change
/// (ours, or upstream's to adopt).
pub fn slices_of(ctx: &Context, key: &ObjectKey) -> Vec<std::sync::Arc<CachedSlice>> {
    let selector = std::collections::BTreeMap::from([(
        desired::slices::LABEL_SERVICE_NAME.to_string(),
        key.name.clone(),
    )]);
    ctx.stores
        .slices
        .read()
        .selector_candidates(&key.namespace, &selector)
        .into_iter()
        .filter(|s| s.is_adoptable() && s.service_key().as_ref() == Some(key))
        .cloned()
        .collect()
}

/// A slice changed by someone else (our own writes reach the cache first,
/// and their watch event then changes nothing), or deleted: its Service is
/// reconciled again. Slices of other managers concern nobody.
pub fn on_slice(ctx: &Context, change: &Change<CachedSlice>, received: Option<Instant>) {
    let concerned =
        |slice: &CachedSlice| slice.is_adoptable().then(|| slice.service_key()).flatten();
    match change {
        Change::Added(slice) => {
            if let Some(key) = concerned(slice) {
                ctx.enqueue_for(Controller::Endpointslices, key, received);
            }
        }
        Change::Updated { old, new } => {
            for key in [concerned(old), concerned(new)].into_iter().flatten() {
                ctx.enqueue_for(Controller::Endpointslices, key, received);
            }
        }
        Change::DeletionCandidate(slice) => {
            ctx.stores
                .slices
                .confirm_deleted(&slice.key(), slice.uid(), Confirmation::Released);
            if let Some(key) = concerned(slice) {
                ctx.enqueue_for(Controller::Endpointslices, key, received);
            }
        }
    }
}

/// A Node's zone goes into every endpoint on it, and Nodes' readiness and
/// CPU into the `Auto` hints. A Node added, deleted or moved to another zone
/// queues every Service for the slice controller (Node changes are rare; a
/// reconcile that changes nothing writes nothing); a change of readiness,
/// role or CPU queues the Services with `Auto` hints. A deleted Node's
/// tombstone goes at once: the slice reconcile reads a Node live before
/// dropping the endpoints of pods on it (see `slice_sync.rs`).
pub fn on_node(ctx: &Context, change: &Change<CachedNode>, received: Option<Instant>) {
    let every_service = match change {
        Change::Added(_) => true,
        Change::DeletionCandidate(node) => {
            ctx.stores
                .nodes
                .confirm_deleted(&node.key(), node.uid(), Confirmation::Released);
            true
        }
        Change::Updated { old, new } => {
            if old.info == new.info {
                return;
            }
            old.info.zone != new.info.zone
        }
    };
    let keys: Vec<ObjectKey> = ctx
        .stores
        .services
        .read()
        .iter()
        .filter(|svc| every_service || hint_mode(svc) == HintMode::Auto)
        .map(|svc| svc.key())
        .collect();
    for key in keys {
        ctx.enqueue_for(Controller::Endpointslices, key, received);
    }
}

/// Endpoints changed by someone else (our own writes reach the cache before
/// their watch event, which then changes nothing) or deleted: look again.
/// A deletion while the Service exists is what upstream does on a stale cache;
/// it is counted whoever did it.
pub fn on_endpoints(
    ctx: &Arc<Context>,
    change: &Change<CachedEndpoints>,
    received: Option<Instant>,
) {
    match change {
        Change::Added(ep) | Change::Updated { new: ep, .. } => {
            ctx.enqueue_for(Controller::Endpoints, ep.key(), received)
        }
        Change::DeletionCandidate(ep) => {
            let key = ep.key();
            ctx.stores
                .endpoints
                .confirm_deleted(&key, ep.uid(), Confirmation::Released);
            ctx.enqueue_for(Controller::Endpoints, key.clone(), received);
            if ep.is_deletable() || ctx.stores.services.read().get(&key).is_some() {
                let ctx = ctx.clone();
                tokio::spawn(async move { check_deletion_was_spurious(&ctx, key).await });
            }
        }
    }
}

async fn check_deletion_was_spurious(ctx: &Context, key: ObjectKey) {
    match live::get::<Service>(&ctx.client, &(), &key).await {
        Ok(LiveRead::Found(svc)) if desired::managed_selector(&svc).is_some() => {
            ctx.metrics.observed_spurious_deletions.inc();
            warn!(%key, "Endpoints were deleted while their Service exists");
        }
        Ok(_) => {}
        Err(err) => {
            warn!(%key, error = %err, "could not check whether an Endpoints deletion was spurious")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Service;

    use super::*;
    use crate::desired::PodFields;
    use hardened_watcher::{WatchEventKind, Whole};

    use crate::reconcile::testkit::context;

    fn service(ns: &str, name: &str, app: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": name, "resourceVersion": "1"},
            "spec": {"selector": {"app": app}},
        }))
        .expect("service")
    }

    fn pod(ns: &str, app: &str, rv: &str) -> PodInfo {
        PodFields {
            namespace: ns.into(),
            name: "p".into(),
            uid: "p-uid".into(),
            resource_version: rv.into(),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            ..PodFields::default()
        }
        .pack()
    }

    fn queued(ctx: &Context) -> Vec<String> {
        let queue = &ctx.endpoints.queue;
        let mut keys = Vec::new();
        while !queue.is_empty() {
            let Some(taken) = futures::executor::block_on(queue.next()) else {
                break;
            };
            keys.push(taken.key.to_string());
            queue.done(&taken.key);
        }
        keys.sort();
        keys
    }

    #[tokio::test]
    async fn relabelled_pod_queues_old_and_new_services_of_its_namespace_only() {
        let ctx = context();
        {
            let services = &ctx.stores.services;
            for svc in [
                service("ns", "a", "a"),
                service("ns", "b", "b"),
                service("ns", "c", "c"),
                service("other", "a", "a"),
            ] {
                services.apply_watch_event(WatchEventKind::Added, Whole(svc));
            }
        }
        let change = Change::Updated {
            old: Arc::new(pod("ns", "a", "1")),
            new: Arc::new(pod("ns", "b", "2")),
        };
        on_pod(&ctx, &change, None);
        assert_eq!(queued(&ctx), vec!["ns/a", "ns/b"]);
    }

    #[tokio::test]
    async fn pod_change_that_endpoints_do_not_depend_on_queues_nothing() {
        let ctx = context();
        ctx.stores
            .services
            .apply_watch_event(WatchEventKind::Added, Whole(service("ns", "a", "a")));
        // Only the resourceVersion moved (say, an annotation was added).
        let change = Change::Updated {
            old: Arc::new(pod("ns", "a", "1")),
            new: Arc::new(pod("ns", "a", "2")),
        };
        on_pod(&ctx, &change, None);
        assert!(queued(&ctx).is_empty());
    }

    #[tokio::test]
    async fn deleted_pod_named_by_no_endpoints_is_released_at_once() {
        let ctx = context();
        let p = pod("ns", "a", "1");
        let pods = &ctx.stores.pods;
        pods.apply_watch_event(WatchEventKind::Added, p.clone());
        pods.apply_watch_event(WatchEventKind::Deleted, pod("ns", "a", "2"));
        assert_eq!(pods.read().tombstone_count(), 1);
        on_pod(&ctx, &Change::DeletionCandidate(Arc::new(p)), None);
        assert_eq!(ctx.stores.pods.read().tombstone_count(), 0);
    }
}
