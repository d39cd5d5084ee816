//! Services: kept whole, less their managedFields, with their opt-in read
//! once.

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, ObjectKey, Store};
use kube::{Api, Client};

use super::{Kind, scoped};
use crate::desired::scope::{self, Handling, OptIn, Scope};
use crate::reconcile::{Context, Stores};
use crate::settings::Controllers;
use k8s_openapi::api::core::v1::Service;

use super::packed::strip_managed_fields;

/// A Service as the cache keeps it: whole, less its managedFields, and what
/// its labels and annotations say about opting in (parsed once here rather
/// than on every pod event that looks for the Services selecting a pod).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedService {
    service: Service,
    opt_in: OptIn,
}

impl CachedService {
    pub fn new(service: Service) -> Self {
        let service = strip_managed_fields(service);
        let opt_in = OptIn::of(&service);
        Self { service, opt_in }
    }

    /// How the controllers handle this Service in `scope`.
    pub fn handling(&self, scope: Scope) -> Handling<'_> {
        scope::handling(scope, &self.service, &self.opt_in)
    }
}

impl std::ops::Deref for CachedService {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

impl Cached for CachedService {
    fn key(&self) -> ObjectKey {
        let meta = &self.service.metadata;
        ObjectKey::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
    fn uid(&self) -> &str {
        self.service.metadata.uid.as_deref().unwrap_or("")
    }
    fn resource_version(&self) -> &str {
        self.service
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or("")
    }
}

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
        Some(CachedService::new(object))
    }
    fn store(stores: &Stores) -> &Store<CachedService> {
        &stores.services
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedService>, received: Instant) {
        super::on_service(ctx, change, Some(received));
    }
    /// Endpoints of ours under its name, or slices of ours labelled for it.
    fn at_stake(ctx: &Context, key: &ObjectKey, _uid: &str) -> bool {
        let managers = ctx.policy.scope.managers();
        ctx.stores
            .endpoints
            .get(key)
            .is_some_and(|ep| managers.endpoints(ep.managed_by()))
            || !super::slices_of(ctx, key, managers).is_empty()
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
