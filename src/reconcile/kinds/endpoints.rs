//! Endpoints: kept as compact JSON ([`CachedEndpoints`]).

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, Confirmation, ObjectKey, Store};
use kube::{Api, Client};

use super::{Kind, scoped};
use crate::reconcile::{Context, Stores};
use crate::settings::{Controller, Controllers};
use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, ObjectReference, Service};

use super::CachedService;
use tracing::warn;

use super::packed::{PackedObject, TargetRefUid};
use crate::desired::scope::{self, EndpointsRole, Handling, Managers};
use crate::error::Result;
use crate::wire::EndpointsWire;
use hardened_watcher::{LiveRead, live};

/// An Endpoints object as the cache keeps it: packed (`PackedObject`, the
/// list field being `subsets`), and its managed-by label.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedEndpoints {
    pub(super) packed: PackedObject,
    managed_by: Option<Box<str>>,
}

impl CachedEndpoints {
    /// `None` only if the object cannot be encoded, which a decoded object can.
    pub fn new(ep: Endpoints) -> Option<Self> {
        let (packed, ep) = PackedObject::new(ep, |ep| ep.subsets.take())?;
        Some(Self {
            packed,
            managed_by: managed_by(&ep).map(Into::into),
        })
    }

    /// Endpoints as read from the API ([`EndpointsWire`]: the subsets left
    /// as JSON text; see `PackedObject::from_wire`). `None` if the subsets
    /// do not decode or the object cannot be encoded.
    pub fn from_wire(wire: EndpointsWire) -> Option<Self> {
        let EndpointsWire { metadata, subsets } = wire;
        let ep = Endpoints {
            metadata,
            subsets: None,
        };
        let (packed, ep) =
            PackedObject::from_wire::<_, Option<Vec<EndpointSubset>>>(ep, subsets.as_deref())?;
        Some(Self {
            packed,
            managed_by: managed_by(&ep).map(Into::into),
        })
    }

    /// The whole object back.
    pub fn decode(&self) -> Result<Endpoints> {
        self.packed
            .decode("cached Endpoints", |ep: &mut Endpoints, subsets| {
                ep.subsets = subsets;
            })
    }

    /// The `endpoints.kubernetes.io/managed-by` label.
    pub fn managed_by(&self) -> Option<&str> {
        self.managed_by.as_deref()
    }

    /// Whether an address (ready or not) has a targetRef with this UID.
    pub fn references(&self, uid: &TargetRefUid) -> bool {
        self.packed.references(uid)
    }
}

/// The pods the addresses of `ep` name (ready and not ready alike).
pub fn pod_target_refs(ep: &Endpoints) -> impl Iterator<Item = &ObjectReference> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .filter_map(|a| a.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
}

impl Cached for CachedEndpoints {
    fn key(&self) -> ObjectKey {
        self.packed.key.clone()
    }
    fn uid(&self) -> &str {
        &self.packed.uid
    }
    fn resource_version(&self) -> &str {
        &self.packed.resource_version
    }
}

pub fn managed_by(ep: &Endpoints) -> Option<&str> {
    ep.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::desired::LABEL_MANAGED_BY))
        .map(String::as_str)
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
        super::on_endpoints(ctx, change, Some(received));
    }
    /// Endpoints themselves are never at stake: a deleted Endpoints is made
    /// again by its Service's reconcile.
    fn at_stake(_ctx: &Context, _key: &ObjectKey, _uid: &str) -> bool {
        false
    }
}

/// Endpoints changed by someone else (our own writes reach the cache before
/// their watch event, which then changes nothing) or deleted: look again.
/// A deletion while the Service exists is what upstream does on a stale cache;
/// it is counted whoever did it, and when the Endpoints were ours and their
/// Service is handled, the create that follows counts as a restore.
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
            let service = ctx.stores.services.get(&key);
            let ours = ctx.policy.scope.managers().endpoints(ep.managed_by());
            if ours
                && service
                    .as_deref()
                    .is_some_and(|svc| writes_endpoints(ctx, svc))
            {
                ctx.endpoints.restores.note(key.clone());
            }
            ctx.enqueue_for(Controller::Endpoints, key.clone(), received);
            if Managers::OWN_AND_UPSTREAM.endpoints(ep.managed_by()) || service.is_some() {
                let ctx = ctx.clone();
                tokio::spawn(async move { check_deletion_was_spurious(&ctx, key).await });
            }
        }
    }
}

/// Whether the Endpoints reconcile writes the Endpoints of `svc`.
fn writes_endpoints(ctx: &Context, svc: &CachedService) -> bool {
    matches!(svc.handling(ctx.policy.scope), Handling::Managed(m) if m.endpoints == EndpointsRole::Write)
}

/// How many deletion checks read the API at once: a namespace deletion
/// removes thousands of Endpoints within a second, and each check waits for
/// its turn rather than adding to the burst.
static DELETION_CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(8);

/// Counts a deletion of the Endpoints of a Service that exists and has them
/// written by a controller: upstream's (it has a selector) or ours.
async fn check_deletion_was_spurious(ctx: &Context, key: ObjectKey) {
    let _turn = match DELETION_CHECKS.acquire().await {
        Ok(turn) => turn,
        Err(err) => {
            warn!(%key, error = %err, "could not check whether an Endpoints deletion was spurious");
            return;
        }
    };
    match live::get::<Service>(&ctx.client, &(), &key).await {
        Ok(LiveRead::Found(svc)) => {
            let svc = CachedService::new(svc);
            if scope::spec_selector(&svc).is_some() || writes_endpoints(ctx, &svc) {
                ctx.metrics.observed_spurious_deletions.inc();
                warn!(%key, "Endpoints were deleted while their Service exists");
            }
        }
        Ok(LiveRead::Gone) => {}
        Err(err) => {
            warn!(%key, error = %err, "could not check whether an Endpoints deletion was spurious")
        }
    }
}
