//! What the apply steps of both controllers share: the verbs, the gate every
//! write passes (audit mode counts instead, a replica that no longer leads
//! writes nothing), and the cache's repairs after a write.

use std::collections::HashSet;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use super::{Context, kinds};
use crate::error::{Error, Result};
use crate::settings::{Controller, Mode};
use hardened_watcher::{Cached, Confirmation, LiveRead, ObjectKey, Store, live};

/// A write to the Endpoints or EndpointSlice API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Create,
    Update,
    Delete,
}

impl Verb {
    pub const ALL: [Verb; 3] = [Verb::Create, Verb::Update, Verb::Delete];

    /// The bounded `verb`/`kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the writes a reconcile planned (`planned`: how many of each
/// verb, in [`Verb::ALL`]'s order) may go out. In audit mode they are counted
/// as divergences and logged instead; a replica that no longer leads writes
/// nothing.
pub(super) fn may_write(
    ctx: &Context,
    controller: Controller,
    key: &ObjectKey,
    planned: [usize; 3],
) -> bool {
    if ctx.policy.mode == Mode::Audit {
        for (verb, count) in Verb::ALL.into_iter().zip(planned) {
            ctx.metrics
                .audit_divergences
                .with_label_values(&[controller.metric_label(), verb.as_str()])
                .inc_by(count as u64);
        }
        let [creates, updates, deletes] = planned;
        info!(
            %key,
            creates,
            updates,
            deletes,
            "audit: {} differ from what the Service and pods call for",
            controller.objects()
        );
        return false;
    }
    if !ctx.writes_allowed() {
        debug!(%key, %controller, "not the leader (any more): not writing");
        return false;
    }
    true
}

/// `planned` for one write of `verb`.
pub(super) fn one(verb: Verb) -> [usize; 3] {
    Verb::ALL.map(|v| usize::from(v == verb))
}

/// Pods (name, uid) that the `current` targetRefs name and the `written`
/// ones no longer do.
pub(super) fn dropped_pods<'a>(
    current: impl Iterator<Item = &'a ObjectReference>,
    written: impl Iterator<Item = &'a ObjectReference>,
) -> Vec<(String, String)> {
    let kept: HashSet<&str> = written.filter_map(|r| r.uid.as_deref()).collect();
    current
        .filter_map(|r| Some((r.name.clone()?, r.uid.clone()?)))
        .filter(|(_, uid)| !kept.contains(uid.as_str()))
        .collect()
}

/// A pod whose address our write just dropped for a reason of its own (it
/// turned terminating, or not ready, before its DELETE arrived) has nothing
/// at stake any more: if its DELETE left a tombstone and nothing else of
/// ours names it, the tombstone goes. (The guard reads a tombstoned pod live
/// only while our Endpoints name it.)
pub(super) fn release_dropped_pods(ctx: &Context, namespace: &str, dropped: Vec<(String, String)>) {
    for (name, uid) in dropped {
        let key = ObjectKey::new(namespace, name);
        let tombstoned = ctx.stores.pods.with_cache(|pods| {
            pods.tombstone(&key)
                .is_some_and(|t| t.last_known.uid() == uid)
        });
        if tombstoned && !kinds::pod_referenced(ctx, namespace, &uid) {
            ctx.stores
                .pods
                .confirm_deleted(&key, &uid, Confirmation::Released);
        }
    }
}

/// After a conflict, reads object `key` live into `store` (`project` makes its
/// cached form; the store's read stamp is taken before the request), so the
/// retry starts from fresh state even when the watch is behind. A read older
/// than the cache asks for a relist: the store may have been rewound (see
/// [`hardened_watcher::Store::restore`]). The Endpoints and the EndpointSlice
/// reconciles both call it; `what` names the read in its error.
pub(super) async fn refresh_after_conflict<K, C>(
    ctx: &Context,
    store: &Store<C>,
    key: &ObjectKey,
    what: &'static str,
    project: fn(K) -> Option<C>,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
    C: Cached,
{
    let stamp = store.read_stamp();
    match live::get::<K>(&ctx.client, &(), key).await {
        Ok(LiveRead::Found(object)) => {
            match project(object) {
                Some(cached) => {
                    store.restore(cached, &stamp);
                }
                // Cannot happen for a decoded object; the watch brings it in anyway.
                None => warn!(%key, "{what}: not encodable for the cache; waiting for the watch"),
            }
            Ok(())
        }
        Ok(LiveRead::Gone) => Ok(()),
        Err(err) => Err(Error::kube(what, key.to_string(), err)),
    }
}

pub(super) fn is_namespace_terminating(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => {
            status.code == 403
                && status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
        }
        _ => false,
    }
}
