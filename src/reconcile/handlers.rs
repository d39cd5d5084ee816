//! From cache changes to queue keys: which Services a change concerns.

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::Api;
use tracing::warn;

use super::Context;
use super::sync::is_deletable;
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
        Change::Added(p) | Change::DeletionCandidate(p) => (None, p),
        Change::Updated { old, new } => {
            if same_endpoints_inputs(old, new) {
                return;
            }
            (Some(old), new)
        }
    };
    let services = ctx.stores.services.read();
    for svc in services.in_namespace(&new.namespace) {
        let Some(selector) = desired::managed_selector(svc) else {
            continue;
        };
        let selects_new = desired::selector_matches(selector, &new.labels);
        let selects_old = old.is_some_and(|o| desired::selector_matches(selector, &o.labels));
        if selects_new || selects_old {
            ctx.queue.add(svc.key());
        }
    }
}

fn same_endpoints_inputs(a: &PodInfo, b: &PodInfo) -> bool {
    // PodInfo holds only what Endpoints are computed from, plus the version.
    PodInfo {
        resource_version: String::new(),
        ..a.clone()
    } == PodInfo {
        resource_version: String::new(),
        ..b.clone()
    }
}

/// Endpoints changed by someone else (our own writes reach the cache before
/// their watch event, which then changes nothing) or deleted: look again.
/// A deletion while the Service exists is what upstream does on a stale cache;
/// it is counted whoever did it.
pub fn on_endpoints(ctx: &std::sync::Arc<Context>, change: &Change<Endpoints>) {
    match change {
        Change::Added(ep) | Change::Updated { new: ep, .. } => ctx.queue.add(ep.key()),
        Change::DeletionCandidate(ep) => {
            let key = ep.key();
            ctx.stores.endpoints.write().confirm_deleted(&key, ep.uid());
            ctx.queue.add(key.clone());
            if is_deletable(ep) || ctx.stores.services.read().get(&key).is_some() {
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
