//! From cache changes to queue keys: which Services a change concerns.

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use tracing::warn;

use super::Context;
use super::objects::{CachedEndpoints, TargetRefUid};
use crate::desired::{self, PodInfo};
use crate::watch::{Cached, Change, ObjectKey};

pub fn on_service(ctx: &Context, change: &Change<Service>) {
    let svc = match change {
        Change::Added(s) | Change::DeletionCandidate(s) => s,
        Change::Updated { new, .. } => new,
    };
    ctx.queue.add(svc.key());
}

/// A pod change concerns the Services selecting it before and after; a change to
/// nothing Endpoints are made of (for example a new annotation) concerns none.
pub fn on_pod(ctx: &Context, change: &Change<PodInfo>) {
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
            ctx.queue.add(svc.key());
        }
    }
}

/// A deleted pod that no cached Endpoints names has no address to guard: its
/// tombstone goes now. One that is named waits for the reconcile of its
/// Service, which reads the pod live before dropping the address.
fn release_if_unreferenced(ctx: &Context, pod: &PodInfo) {
    let uid = TargetRefUid::new(pod.uid());
    let referenced = ctx
        .stores
        .endpoints
        .read()
        .in_namespace(pod.namespace())
        .any(|ep| ep.references(&uid));
    if !referenced {
        ctx.stores
            .pods
            .write()
            .confirm_deleted(&pod.key(), pod.uid());
    }
}

/// Endpoints changed by someone else (our own writes reach the cache before
/// their watch event, which then changes nothing) or deleted: look again.
/// A deletion while the Service exists is what upstream does on a stale cache;
/// it is counted whoever did it.
pub fn on_endpoints(ctx: &std::sync::Arc<Context>, change: &Change<CachedEndpoints>) {
    match change {
        Change::Added(ep) | Change::Updated { new: ep, .. } => ctx.queue.add(ep.key()),
        Change::DeletionCandidate(ep) => {
            let key = ep.key();
            ctx.stores.endpoints.write().confirm_deleted(&key, ep.uid());
            ctx.queue.add(key.clone());
            if ep.is_deletable() || ctx.stores.services.read().get(&key).is_some() {
                let ctx = ctx.clone();
                tokio::spawn(async move { check_deletion_was_spurious(&ctx, key).await });
            }
        }
    }
}

async fn check_deletion_was_spurious(ctx: &Context, key: ObjectKey) {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.namespace);
    match api.get_opt(&key.name).await {
        Ok(Some(svc)) if desired::managed_selector(&svc).is_some() => {
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
    use kube::runtime::events::{Recorder, Reporter};

    use super::*;
    use crate::config::Mode;
    use crate::desired::PodFields;
    use crate::metrics::Metrics;
    use crate::reconcile::{Stores, WorkQueue};
    use crate::watch::WatchEventKind;

    /// A context whose client points nowhere: the handlers only route keys and
    /// never call the API.
    fn context() -> Context {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let client = kube::Client::try_from(config).expect("client");
        Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "test".into(),
                    instance: None,
                },
            ),
            client,
            metrics: Arc::new(Metrics::new().expect("metrics")),
            mode: Mode::Enforce,
            stores: Stores::new(),
            queue: WorkQueue::new(),
            trigger_times: Default::default(),
            leader: tokio::sync::watch::channel(true).1,
        }
    }

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
        let mut keys = Vec::new();
        while !ctx.queue.is_empty() {
            let Some(key) = futures::executor::block_on(ctx.queue.next()) else {
                break;
            };
            keys.push(key.to_string());
            ctx.queue.done(&key);
        }
        keys.sort();
        keys
    }

    #[tokio::test]
    async fn relabelled_pod_queues_old_and_new_services_of_its_namespace_only() {
        let ctx = context();
        {
            let mut services = ctx.stores.services.write();
            for svc in [
                service("ns", "a", "a"),
                service("ns", "b", "b"),
                service("ns", "c", "c"),
                service("other", "a", "a"),
            ] {
                services.apply_event(WatchEventKind::Added, svc);
            }
        }
        let change = Change::Updated {
            old: Arc::new(pod("ns", "a", "1")),
            new: Arc::new(pod("ns", "b", "2")),
        };
        on_pod(&ctx, &change);
        assert_eq!(queued(&ctx), vec!["ns/a", "ns/b"]);
    }

    #[tokio::test]
    async fn pod_change_that_endpoints_do_not_depend_on_queues_nothing() {
        let ctx = context();
        ctx.stores
            .services
            .write()
            .apply_event(WatchEventKind::Added, service("ns", "a", "a"));
        // Only the resourceVersion moved (say, an annotation was added).
        let change = Change::Updated {
            old: Arc::new(pod("ns", "a", "1")),
            new: Arc::new(pod("ns", "a", "2")),
        };
        on_pod(&ctx, &change);
        assert!(queued(&ctx).is_empty());
    }

    #[tokio::test]
    async fn deleted_pod_named_by_no_endpoints_is_released_at_once() {
        let ctx = context();
        let p = pod("ns", "a", "1");
        let mut pods = ctx.stores.pods.write();
        pods.apply_event(WatchEventKind::Added, p.clone());
        pods.apply_event(WatchEventKind::Deleted, pod("ns", "a", "2"));
        assert_eq!(pods.tombstone_count(), 1);
        drop(pods);
        on_pod(&ctx, &Change::DeletionCandidate(Arc::new(p)));
        assert_eq!(ctx.stores.pods.read().tombstone_count(), 0);
    }
}
