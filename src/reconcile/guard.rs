//! The deletion guard, for both controllers: nothing is taken away on the word
//! of the cache alone. Before Endpoints or EndpointSlices are deleted the
//! Service is read live; before a pod's address is dropped after a watch
//! DELETE, the pod is read live; before the endpoints of pods on a Node the
//! cache lacks are dropped, the Node is read live. A live read that finds the
//! object repairs the cache, and the prevention is counted (labelled by
//! controller), logged and, for a Service, reported as a Kubernetes Event.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service};
use kube::runtime::events::{Event, EventType};
use tracing::{info, warn};

use super::Context;
use super::decide::{NamedPod, PodVerdict, Read, pod_verdict, pods_missed, pods_to_confirm};
use super::effects::{Effect, Warning};
use super::kinds::{CachedNode, CachedService};
use super::publish::Job;
use crate::desired::PodInfo;
use crate::desired::scope::Handling;
use crate::error::{Error, Result};
use crate::settings::Controller;
use hardened_watcher::{Cached, Confirmation, DeletionSource, LiveRead, ObjectKey, live};

use crate::metrics::prevention::{
    MISSING_FROM_LIST, NOT_IN_CACHE, STALE_OPT_OUT, STALE_TAKEOVER, WATCH_DELETE,
};

/// Why the cache lacked a Service that a live read found: the bounded `reason`
/// label of `endpoints_guard_spurious_deletions_prevented_total`.
fn prevention_reason(source: Option<DeletionSource>) -> &'static str {
    match source {
        Some(DeletionSource::WatchDelete) => WATCH_DELETE,
        Some(DeletionSource::MissingFromList) => MISSING_FROM_LIST,
        None => NOT_IN_CACHE,
    }
}

/// Reads the Service live for `controller`, which is about to remove what
/// it made for the Service (`why`; a GET is served from etcd, so it is
/// current), and puts what it found into the cache. Only a NotFound naming
/// this Service is "gone" (see `hardened_watcher::live`). A read that
/// contradicts the cache where it mattered (the Service exists after all;
/// it is opted in after all; it has its selector after all) counts as a
/// prevented deletion, with a Warning Event.
pub(crate) async fn read_service(job: &Job<'_>, why: Read) -> Result<Option<Arc<CachedService>>> {
    let Job { ctx, key, .. } = *job;
    let store = &ctx.stores.services;
    let stamp = store.read_stamp();
    let read = live::get::<Service>(&ctx.client, &(), key)
        .await
        .map_err(|e| Error::kube("reading the Service live", key.to_string(), e))?;
    let tombstone = store.with_cache(|services| {
        services
            .tombstone(key)
            .map(|t| (t.source, t.last_known.uid().to_owned()))
    });
    let svc = match read {
        LiveRead::Gone => {
            if let Some((_, uid)) = tombstone {
                store.confirm_deleted(key, &uid, Confirmation::LiveRead);
            }
            return Ok(None);
        }
        LiveRead::Found(svc) => CachedService::new(svc),
    };
    store.restore(svc.clone(), &stamp);
    let contradicted = match why {
        Read::ServiceMissing => Some(prevention_reason(tombstone.map(|(source, _)| source))),
        Read::OptOut => (!matches!(svc.handling(ctx.policy.scope), Handling::OptedOut(_)))
            .then_some(STALE_OPT_OUT),
        Read::Abandoned => {
            (svc.handling(ctx.policy.scope) != Handling::Abandoned).then_some(STALE_OPT_OUT)
        }
        Read::Takeover => {
            let takes_over = matches!(
                svc.handling(ctx.policy.scope),
                Handling::Managed(m) if m.managers.upstream()
            );
            (!takes_over).then_some(STALE_TAKEOVER)
        }
    };
    if let Some(reason) = contradicted {
        report_prevention(job, &svc, reason);
    }
    Ok(Some(Arc::new(svc)))
}

/// Counts and logs a prevented deletion; its Warning Event is left to the
/// worker.
fn report_prevention(job: &Job<'_>, svc: &CachedService, reason: &'static str) {
    let Job {
        ctx,
        controller,
        key,
        ..
    } = *job;
    ctx.metrics
        .spurious_deletions_prevented
        .with_label_values(&[controller.metric_label(), reason])
        .inc();
    let what = controller.objects();
    let cause = match reason {
        STALE_OPT_OUT => "the watch cache showed this Service opted out or abandoned",
        STALE_TAKEOVER => "the watch cache showed this Service opted in without its selector",
        _ => "the watch cache lacked this Service",
    };
    warn!(
        %key,
        %controller,
        reason,
        "spurious {what} deletion prevented: {cause}, but a live read disagrees"
    );
    let note = format!(
        "{what} deletion prevented: {cause} ({reason}) but a live read disagrees; cache repaired"
    );
    job.then(Effect::Warning(Warning {
        reason: "SpuriousDeletionPrevented",
        action: "Guard",
        note,
        uid: svc.metadata.uid.clone(),
    }));
}

/// Pods named by what `controller` wrote (`referenced`: the targetRefs of
/// the current Endpoints or slices, in `namespace`) but missing from the pod
/// cache after a watch DELETE are read live; if the same pod (same UID) is
/// still there, it goes back into the cache and into `pods`.
pub async fn hold_unconfirmed_pod_deletions<'r>(
    ctx: &Context,
    controller: Controller,
    namespace: &str,
    referenced: impl IntoIterator<Item = &'r ObjectReference>,
    selector: &BTreeMap<String, String>,
    pods: &mut Vec<Arc<PodInfo>>,
) -> Result<()> {
    let named = referenced.into_iter().filter_map(|target| {
        Some(NamedPod {
            name: target.name.as_deref()?,
            uid: target.uid.as_deref()?,
        })
    });
    let suspects = {
        let selected: HashSet<&str> = pods.iter().map(|p| p.name()).collect();
        ctx.stores.pods.with_cache(|cache| {
            pods_to_confirm(named, &selected, |name| {
                cache
                    .tombstone(&ObjectKey::new(namespace, name))
                    .map(|t| t.last_known.uid().to_owned())
            })
            .into_iter()
            .map(|p| (ObjectKey::new(namespace, p.name), p.uid.to_owned()))
            .collect::<Vec<_>>()
        })
    };
    let store = &ctx.stores.pods;
    for (key, uid) in suspects {
        let stamp = store.read_stamp();
        let read = live::get::<Pod>(&ctx.client, &(), &key)
            .await
            .map_err(|e| Error::kube("confirming a pod is gone", key.to_string(), e))?;
        let found = match &read {
            LiveRead::Found(pod) => PodInfo::from_pod(pod),
            LiveRead::Gone => None,
        };
        match (pod_verdict(found.as_ref(), &uid, selector), found) {
            (verdict @ (PodVerdict::Keep | PodVerdict::Unselected), Some(info)) => {
                ctx.metrics
                    .pod_deletions_held
                    .with_label_values(&[controller.metric_label()])
                    .inc();
                info!(pod = %key, %controller, "pod still exists after a watch DELETE; keeping its address");
                store.restore(info.clone(), &stamp);
                if verdict == PodVerdict::Keep {
                    pods.push(Arc::new(info));
                }
            }
            _ => {
                store.confirm_deleted(&key, &uid, Confirmation::LiveRead);
            }
        }
    }
    Ok(())
}

/// Whether taking over upstream's objects of Service `key` would drop ready
/// endpoints of live pods (`published`: the targetRefs of upstream's ready
/// endpoints) that the opt-in's `selector` does not select. Logs them.
pub fn selector_misses_pods<'r>(
    ctx: &Context,
    key: &ObjectKey,
    selector: &BTreeMap<String, String>,
    published: impl IntoIterator<Item = &'r ObjectReference>,
) -> bool {
    let named = published.into_iter().filter_map(|target| {
        Some(NamedPod {
            name: target.name.as_deref()?,
            uid: target.uid.as_deref()?,
        })
    });
    let missed = {
        let pods = &ctx.stores.pods;
        pods_missed(named, selector, |pod| {
            pods.get(&ObjectKey::new(key.namespace.as_str(), pod.name))
                .filter(|p| p.uid() == pod.uid)
        })
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    if !missed.is_empty() {
        warn!(%key, ?missed, "not taking over: the opt-in's selector misses pods kube-controller-manager publishes as ready");
    }
    !missed.is_empty()
}

/// The Nodes among `names` that the cache lacks are read live; one found
/// goes back into the cache (its pods' endpoints stay), one gone is left out
/// as upstream leaves it. Returns how many were found.
pub async fn hold_unconfirmed_nodes(ctx: &Context, names: &[String]) -> Result<usize> {
    let store = &ctx.stores.nodes;
    let mut found = 0;
    for name in names {
        let key = ObjectKey::new("", name.as_str());
        if store.get(&key).is_some() {
            continue;
        }
        let stamp = store.read_stamp();
        let read = live::get::<Node>(&ctx.client, &(), &key)
            .await
            .map_err(|e| Error::kube("confirming a Node is gone", name.clone(), e))?;
        let LiveRead::Found(node) = read else {
            continue;
        };
        if let Some(cached) = CachedNode::new(&node) {
            ctx.metrics.node_deletions_held.inc();
            info!(node = %name, "Node missing from the cache exists; keeping the endpoints on it");
            store.restore(cached, &stamp);
            found += 1;
        }
    }
    Ok(found)
}

fn svc_reference(key: &ObjectKey, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid,
        ..ObjectReference::default()
    }
}

/// Publishes a Warning Event on Service `key`. Events are a report, not
/// part of the reconcile: handed to the publisher, never waited for.
pub(super) fn publish_warning(ctx: &Context, key: &ObjectKey, warning: Warning) {
    let Warning {
        reason,
        action,
        note,
        uid,
    } = warning;
    // The API refuses an Event whose note exceeds 1 KiB (API errors quoted in
    // a note can be longer).
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(truncate_note(note)),
        action: action.into(),
        secondary: None,
    };
    ctx.events.send(event, svc_reference(key, uid));
}

const MAX_NOTE_BYTES: usize = 1024;

fn truncate_note(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut cut = MAX_NOTE_BYTES - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
