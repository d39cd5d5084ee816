//! Nodes: what EndpointSlices need of them ([`CachedNode`]).

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, Confirmation, ObjectKey, Store};
use kube::{Api, Client};

use super::Kind;
use crate::reconcile::{Context, Stores};
use crate::settings::{Controller, Controllers};
use k8s_openapi::api::core::v1::Node;

use super::packed::meta_str;
use crate::desired::slices::{HintMode, NodeInfo, hint_mode};

/// A Node as the cache keeps it: what EndpointSlices need ([`NodeInfo`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedNode {
    uid: Box<str>,
    resource_version: Box<str>,
    pub info: NodeInfo,
}

impl CachedNode {
    /// `None` for a Node without a name.
    pub fn new(node: &Node) -> Option<Self> {
        Some(Self {
            uid: meta_str(&node.metadata.uid).into(),
            resource_version: meta_str(&node.metadata.resource_version).into(),
            info: NodeInfo::from_node(node)?,
        })
    }
}

impl Cached for CachedNode {
    fn key(&self) -> ObjectKey {
        ObjectKey::new("", self.info.name.as_str())
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.resource_version
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
        super::on_node(ctx, change, Some(received));
    }
    /// A Node missing from the cache is read live by the reconcile of any
    /// Service whose slices have endpoints on it (see
    /// `hold_unconfirmed_nodes` in `reconcile/guard.rs`), tombstone or not.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
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
    let keys: Vec<ObjectKey> = ctx.stores.services.with_cache(|services| {
        services
            .iter()
            .filter(|svc| every_service || hint_mode(svc, ctx.policy.rules) == HintMode::Auto)
            .map(|svc| svc.key())
            .collect()
    });
    for key in keys {
        ctx.enqueue_for(Controller::Endpointslices, key, received);
    }
}
