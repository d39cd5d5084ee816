//! Every kind the controller watches, described once: its API type and
//! resource name, what its cache keeps of an object, where that cache lives,
//! and what a change to it means. The wiring (`controller.rs`), the resync
//! and housekeeping (`reconcile/resync.rs`) and the start-up checks
//! (`startup.rs`) all go through [`for_each_kind`]; a new kind is one more
//! implementation of [`Kind`], one line there and its store in `Stores`.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, ObjectKey, Store, Whole};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use crate::config::{Controller, Controllers};
use crate::desired::PodInfo;
use crate::reconcile::cached::{
    CachedEndpoints, CachedNode, CachedService, CachedSlice, strip_managed_fields,
};
use crate::reconcile::{Context, Stores, handlers};
use crate::wire::{EndpointsWire, PodWire};

/// One watched kind.
pub trait Kind: 'static {
    /// The API type.
    type Object: kube::Resource<DynamicType = ()>
        + DeserializeOwned
        + Clone
        + Debug
        + Send
        + Sync
        + 'static;
    /// What the cache keeps of an object.
    type Cached: Cached;
    /// The resource's plural name: the `resource` label of metrics and logs.
    const RESOURCE: &'static str;
    /// Whether the running controllers need this kind watched.
    fn needed(controllers: Controllers) -> bool;
    /// Its API, in `namespace` (when the kind is namespaced) or cluster-wide.
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self::Object>;
    /// An object as the cache keeps it; `None` if it cannot be represented
    /// (counted as undecodable, never used to filter).
    fn project(object: Self::Object) -> Option<Self::Cached>;
    /// Where its cache lives.
    fn store(stores: &Stores) -> &Store<Self::Cached>;
    /// What a change to one of its objects means: the Services to reconcile.
    /// `received`: when what the change came from arrived.
    fn on_change(ctx: &Arc<Context>, change: &Change<Self::Cached>, received: Instant);
    /// Whether a deletion candidate (incarnation `uid` of `key`) still matters
    /// to something of ours: if not, housekeeping may let its tombstone go.
    fn at_stake(ctx: &Context, key: &ObjectKey, uid: &str) -> bool;
}

/// Something done once for every watched kind (see [`for_each_kind`]).
pub trait KindVisitor {
    /// Called once for each kind, in [`for_each_kind`]'s order.
    fn visit<K: Kind>(&mut self);
}

/// Every watched kind, in the order their watchers start (Services first:
/// everything else is reconciled on their behalf). The one list of kinds.
pub fn for_each_kind(visitor: &mut impl KindVisitor) {
    visitor.visit::<ServiceKind>();
    visitor.visit::<PodKind>();
    visitor.visit::<EndpointsKind>();
    visitor.visit::<EndpointSliceKind>();
    visitor.visit::<NodeKind>();
}

/// The API of a namespaced kind in `namespace`, or cluster-wide.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
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
        Some(Whole(strip_managed_fields(object)))
    }
    fn store(stores: &Stores) -> &Store<CachedService> {
        &stores.services
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedService>, received: Instant) {
        handlers::on_service(ctx, change, Some(received));
    }
    /// Endpoints of ours under its name, or slices of ours labelled for it.
    fn at_stake(ctx: &Context, key: &ObjectKey, _uid: &str) -> bool {
        ctx.stores
            .endpoints
            .get(key)
            .is_some_and(|ep| ep.is_deletable())
            || !handlers::slices_of(ctx, key).is_empty()
    }
}

/// Pods, projected to what Endpoints are made of ([`PodInfo`]).
pub struct PodKind;

impl Kind for PodKind {
    /// Decoded slim: only what [`PodInfo`] is made of (see [`crate::wire`]).
    type Object = PodWire;
    type Cached = PodInfo;
    const RESOURCE: &'static str = "pods";
    fn needed(_: Controllers) -> bool {
        true
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<PodWire> {
        scoped(client, namespace)
    }
    fn project(object: PodWire) -> Option<PodInfo> {
        object.project()
    }
    fn store(stores: &Stores) -> &Store<PodInfo> {
        &stores.pods
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<PodInfo>, received: Instant) {
        handlers::on_pod(ctx, change, Some(received));
    }
    /// An address of our Endpoints, or an endpoint of our slices, names it.
    fn at_stake(ctx: &Context, key: &ObjectKey, uid: &str) -> bool {
        handlers::pod_referenced(ctx, &key.namespace, uid)
    }
}

/// Endpoints, kept as compact JSON ([`CachedEndpoints`]).
pub struct EndpointsKind;

impl Kind for EndpointsKind {
    /// Decoded with the subsets left as text (see [`crate::wire`]).
    type Object = EndpointsWire;
    type Cached = CachedEndpoints;
    const RESOURCE: &'static str = "endpoints";
    fn needed(controllers: Controllers) -> bool {
        controllers.contains(Controller::Endpoints)
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<EndpointsWire> {
        scoped(client, namespace)
    }
    fn project(object: EndpointsWire) -> Option<CachedEndpoints> {
        CachedEndpoints::from_wire(object)
    }
    fn store(stores: &Stores) -> &Store<CachedEndpoints> {
        &stores.endpoints
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedEndpoints>, received: Instant) {
        handlers::on_endpoints(ctx, change, Some(received));
    }
    /// Endpoints themselves are never at stake: a deleted Endpoints is made
    /// again by its Service's reconcile.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
    }
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
        handlers::on_slice(ctx, change, Some(received));
    }
    /// A deleted slice is made again by its Service's reconcile.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
    }
}

/// Nodes, projected to what EndpointSlices need ([`CachedNode`]); always
/// cluster-wide, whatever `--namespace` says.
pub struct NodeKind;

impl Kind for NodeKind {
    type Object = Node;
    type Cached = CachedNode;
    const RESOURCE: &'static str = "nodes";
    fn needed(controllers: Controllers) -> bool {
        controllers.contains(Controller::Endpointslices)
    }
    fn api(client: &Client, _namespace: Option<&str>) -> Api<Node> {
        Api::all(client.clone())
    }
    fn project(object: Node) -> Option<CachedNode> {
        CachedNode::new(&object)
    }
    fn store(stores: &Stores) -> &Store<CachedNode> {
        &stores.nodes
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<CachedNode>, received: Instant) {
        handlers::on_node(ctx, change, Some(received));
    }
    /// A Node missing from the cache is read live by the reconcile of any
    /// Service whose slices have endpoints on it (see
    /// `hold_unconfirmed_nodes` in `reconcile/guard.rs`), tombstone or not.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
    }
}
