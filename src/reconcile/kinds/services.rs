//! Services: kept whole, less their managedFields.

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, ObjectKey, Store, Whole};
use kube::{Api, Client};

use super::{Kind, scoped};
use crate::config::Controllers;
use crate::reconcile::{Context, Stores};
use k8s_openapi::api::core::v1::Service;

use super::packed::strip_managed_fields;

/// A Service as the cache keeps it: whole, less its managedFields.
pub type CachedService = Whole<k8s_openapi::api::core::v1::Service>;

/// Services, kept whole (less their managedFields).
pub struct ServiceKind;

impl Kind for ServiceKind {
    type Object = Service;
    type Cached = CachedService;
    const RESOURCE: &'static str = "services";
    fn needed(_: Controllers) -> bool {
        true
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Service> {
        scoped(client, namespace)
    }
    fn project(object: Service) -> Option<CachedService> {
        Some(Whole(strip_managed_fields(object)))
    }
    fn store(stores: &Stores) -> &Store<CachedService> {
        &stores.services
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedService>, received: Instant) {
        super::on_service(ctx, change, Some(received));
    }
    /// Endpoints of ours under its name, or slices of ours labelled for it.
    fn at_stake(ctx: &Context, key: &ObjectKey, _uid: &str) -> bool {
        ctx.stores
            .endpoints
            .get(key)
            .is_some_and(|ep| ep.is_deletable())
            || !super::slices_of(ctx, key).is_empty()
    }
}

/// A Service change that arrived at `received` (a watch event, or the answer
/// to the ghost scan's read; `None` in tests): its write is timed from then.
pub fn on_service(ctx: &Context, change: &Change<CachedService>, received: Option<Instant>) {
    let svc = match change {
        Change::Added(s) | Change::DeletionCandidate(s) => s,
        Change::Updated { new, .. } => new,
    };
    ctx.enqueue(svc.key(), received);
}
