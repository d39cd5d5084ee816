//! EndpointSlices: kept as compact JSON ([`CachedSlice`]), indexed by the
//! Service they are labelled for.

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, Confirmation, ObjectKey, Store};
use kube::{Api, Client};

use super::{Kind, scoped};
use crate::reconcile::{Context, Stores};
use crate::settings::{Controller, Controllers};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::packed::{PackedObject, TargetRefUid};
use crate::desired::scope::Managers;
use crate::desired::{self, slices};
use crate::error::Result;

/// An EndpointSlice as the cache keeps it: packed (`PackedObject`, the
/// list field being `endpoints`), its service-name and managed-by labels.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedSlice {
    pub(super) packed: PackedObject,
    /// `kubernetes.io/service-name`: the one label indexed.
    service_name: Option<Box<str>>,
    /// `endpointslice.kubernetes.io/managed-by`: whose it is.
    manager: Option<Box<str>>,
}

impl CachedSlice {
    /// `None` only if the object cannot be encoded, which a decoded object can.
    pub fn new(slice: EndpointSlice) -> Option<Self> {
        let (packed, slice) =
            PackedObject::new(slice, |slice| std::mem::take(&mut slice.endpoints))?;
        Some(Self {
            packed,
            service_name: slices::slice_service_name(&slice).map(Into::into),
            manager: slices::slice_manager(&slice).map(Into::into),
        })
    }

    /// The whole object back.
    pub fn decode(&self) -> Result<EndpointSlice> {
        self.packed.decode(
            "cached EndpointSlice",
            |slice: &mut EndpointSlice, endpoints| {
                slice.endpoints = endpoints;
            },
        )
    }

    /// The Service this slice is labelled for.
    pub fn service_key(&self) -> Option<ObjectKey> {
        let name = self.service_name.as_deref()?;
        Some(ObjectKey::new(self.packed.key.namespace.clone(), name))
    }

    /// Whether it is ours to change or delete, by its managed-by label.
    pub fn is_ours(&self, managers: Managers) -> bool {
        managers.slices(self.manager.as_deref())
    }

    /// Whether an endpoint has a targetRef with this UID.
    pub fn references(&self, uid: &TargetRefUid) -> bool {
        self.packed.references(uid)
    }
}

impl Cached for CachedSlice {
    fn key(&self) -> ObjectKey {
        self.packed.key.clone()
    }
    fn uid(&self) -> &str {
        &self.packed.uid
    }
    fn resource_version(&self) -> &str {
        &self.packed.resource_version
    }
    /// Indexed by the service-name label only: the reconcile of a Service
    /// finds its slices through the index.
    const LABEL_INDEXED: bool = true;
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.service_name
            .as_deref()
            .map(|name| (slices::LABEL_SERVICE_NAME, name))
            .into_iter()
    }
}

/// The pods the endpoints of `slice` name.
pub fn slice_pod_refs(slice: &EndpointSlice) -> impl Iterator<Item = &ObjectReference> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
}

/// EndpointSlices, kept as compact JSON ([`CachedSlice`]), indexed by the
/// Service they are labelled for.
pub struct EndpointSliceKind;

impl Kind for EndpointSliceKind {
    type Object = EndpointSlice;
    type Cached = CachedSlice;
    const RESOURCE: &'static str = "endpointslices";
    fn needed(controllers: Controllers) -> bool {
        controllers.contains(Controller::Endpointslices)
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<EndpointSlice> {
        scoped(client, namespace)
    }
    fn project(object: EndpointSlice) -> Option<CachedSlice> {
        CachedSlice::new(object)
    }
    fn store(stores: &Stores) -> &Store<CachedSlice> {
        &stores.slices
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedSlice>, received: Instant) {
        super::on_slice(ctx, change, Some(received));
    }
    /// A deleted slice is made again by its Service's reconcile.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
    }
}

/// The cached slices labelled for the Service `key` whose managed-by
/// `managers` takes as ours.
pub fn slices_of(
    ctx: &Context,
    key: &ObjectKey,
    managers: Managers,
) -> Vec<std::sync::Arc<CachedSlice>> {
    let selector = std::collections::BTreeMap::from([(
        desired::slices::LABEL_SERVICE_NAME.to_string(),
        key.name.clone(),
    )]);
    ctx.stores.slices.with_cache(|slices| {
        slices
            .selector_candidates(&key.namespace, &selector)
            .into_iter()
            .filter(|s| s.is_ours(managers) && s.service_key().as_ref() == Some(key))
            .cloned()
            .collect()
    })
}

/// A slice changed by someone else (our own writes reach the cache first,
/// and their watch event then changes nothing), or deleted: its Service is
/// reconciled again. Upstream's slices concern us in `all` scope (we take
/// them over), and in `opt-in` scope only for a Service that still has
/// slices of ours (an opt-out waits for upstream's to cover them). Slices of
/// other managers concern nobody.
pub fn on_slice(ctx: &Context, change: &Change<CachedSlice>, received: Option<Instant>) {
    let managers = ctx.policy.scope.managers();
    let concerned = |slice: &CachedSlice| {
        let key = slice.service_key()?;
        let ours = slice.is_ours(managers)
            || (slice.is_ours(Managers::OWN_AND_UPSTREAM)
                && !slices_of(ctx, &key, managers).is_empty());
        ours.then_some(key)
    };
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
