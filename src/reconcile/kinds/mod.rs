//! Every kind the controller watches, one file each: its API type and
//! resource name, what its cache keeps of an object (the cached form and the
//! projection), what a change to it means (its change handler: the Services
//! to reconcile), and when a deletion of it is at stake. The wiring
//! (`controller.rs`), the resync and housekeeping (`resync.rs`), the
//! start-up checks (`startup.rs`) and the readiness handles all go through
//! [`for_each_kind`]: a new kind is one file here, one line there, and its
//! store in [`Stores`].

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, ObjectKey, Store};
use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use crate::reconcile::{Context, Stores};
use crate::settings::Controllers;

mod endpoints;
mod endpointslices;
mod nodes;
mod packed;
mod pods;
mod services;

pub use endpoints::{CachedEndpoints, EndpointsKind, managed_by, on_endpoints, pod_target_refs};
pub use endpointslices::{CachedSlice, EndpointSliceKind, on_slice, slice_pod_refs, slices_of};
pub use nodes::{CachedNode, NodeKind, on_node};
pub use pods::{PodKind, on_pod, pod_referenced, selected_pods};
pub use services::{CachedService, ServiceKind, on_service};

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
    /// Decodes an object's protobuf message, for kinds read as protobuf
    /// (`--wire protobuf`); `None`: JSON only.
    fn protobuf() -> Option<DecodeProtobuf<Self::Object>> {
        None
    }
    /// Where its cache lives.
    fn store(stores: &Stores) -> &Store<Self::Cached>;
    /// What a change to one of its objects means: the Services to reconcile.
    /// `received`: when what the change came from arrived.
    fn on_change(ctx: &Arc<Context>, change: &Change<Self::Cached>, received: Instant);
    /// Whether a deletion candidate (incarnation `uid` of `key`) still matters
    /// to something of ours: if not, housekeeping may let its tombstone go.
    fn at_stake(ctx: &Context, key: &ObjectKey, uid: &str) -> bool;
}

/// Decodes one object's protobuf message (the envelope removed) as `O`.
pub type DecodeProtobuf<O> = fn(&[u8]) -> Result<O, String>;

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

#[cfg(test)]
mod cached_tests;

#[cfg(test)]
mod handlers_tests;

#[cfg(test)]
mod tests {
    use super::{Kind, KindVisitor, for_each_kind};

    struct Names(Vec<&'static str>);

    impl KindVisitor for Names {
        fn visit<K: Kind>(&mut self) {
            self.0.push(K::RESOURCE);
        }
    }

    /// The metrics export every per-resource series at 0 from their own list
    /// (the metrics layer sits below the kinds): it must name every kind.
    #[test]
    fn the_metrics_name_every_watched_kind() {
        let mut names = Names(Vec::new());
        for_each_kind(&mut names);
        assert_eq!(names.0, crate::metrics::RESOURCES);
    }
}
