//! Pods: projected to what Endpoints and slices are made of ([`PodInfo`]).

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{Cached, Change, Confirmation, ObjectKey, Store};
use kube::{Api, Client};

use super::packed::TargetRefUid;
use super::{DecodeProtobuf, Kind, ServiceKind, scoped};
use crate::desired::scope::Handling;
use crate::desired::{self, PodInfo};
use crate::reconcile::{Context, Stores};
use crate::settings::Controllers;
use crate::wire::PodWire;

impl Cached for PodInfo {
    fn key(&self) -> ObjectKey {
        ObjectKey::new(self.namespace(), self.name())
    }
    fn uid(&self) -> &str {
        PodInfo::uid(self)
    }
    fn resource_version(&self) -> &str {
        PodInfo::resource_version(self)
    }
    const LABEL_INDEXED: bool = true;
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        PodInfo::labels(self)
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
    /// Pods change most: every flip brings a pod event, whose decode reads a
    /// few fields of a binary message instead of scanning a JSON line.
    fn protobuf() -> Option<DecodeProtobuf<PodWire>> {
        Some(PodWire::from_protobuf)
    }
    fn store(stores: &Stores) -> &Store<PodInfo> {
        &stores.pods
    }
    fn on_change(ctx: &Arc<Context>, change: &Change<PodInfo>, received: Instant) {
        super::on_pod(ctx, change, Some(received));
    }
    /// An address of our Endpoints, or an endpoint of our slices, names it.
    fn at_stake(ctx: &Context, key: &ObjectKey, uid: &str) -> bool {
        super::pod_referenced(ctx, &key.namespace, uid)
    }
}

/// A pod change concerns the Services selecting it before and after; a change to
/// nothing Endpoints are made of (for example a new annotation) concerns none.
/// `received`: when it arrived, as for [`on_service`](super::on_service).
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
    ctx.stores.services.with_cache(|services| {
        for svc in services.in_namespace(new.namespace()) {
            let handling = svc.handling(ctx.policy.scope);
            let Some(selector) = handling.selector() else {
                continue;
            };
            let selects_new = desired::selector_matches(selector, new.as_ref());
            let selects_old = old.is_some_and(|o| desired::selector_matches(selector, o.as_ref()));
            // An opted-out Service concerns us only while objects of ours are
            // left for it.
            let ours = || {
                !matches!(handling, Handling::OptedOut(_))
                    || <ServiceKind as Kind>::at_stake(ctx, &svc.key(), "")
            };
            if (selects_new || selects_old) && ours() {
                ctx.enqueue(svc.key(), received);
            }
        }
    });
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
    let managers = ctx.policy.scope.managers();
    ctx.stores.endpoints.with_cache(|endpoints| {
        endpoints
            .in_namespace(namespace)
            .any(|ep| managers.endpoints(ep.managed_by()) && ep.references(&uid))
    }) || ctx.stores.slices.with_cache(|slices| {
        slices
            .in_namespace(namespace)
            .any(|slice| slice.is_ours(managers) && slice.references(&uid))
    })
}

/// The cached pods of `namespace` that `selector` selects.
pub fn selected_pods(
    ctx: &Context,
    namespace: &str,
    selector: &std::collections::BTreeMap<String, String>,
) -> Vec<Arc<PodInfo>> {
    ctx.stores.pods.with_cache(|pods| {
        pods.selector_candidates(namespace, selector)
            .into_iter()
            .filter(|p| desired::selector_matches(selector, p.as_ref()))
            .cloned()
            .collect()
    })
}
