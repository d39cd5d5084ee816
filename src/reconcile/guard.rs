//! The deletion guard: nothing is taken away on the word of the cache alone.
//! Before Endpoints are deleted the Service is read live; before a pod's address is
//! dropped after a watch DELETE, the pod is read live. A live read that finds the
//! object repairs the cache, and the prevention is counted, logged and reported
//! as a Kubernetes Event.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Pod, Service};
use kube::Api;
use kube::runtime::events::{Event, EventType};
use tracing::{info, warn};

use super::Context;
use super::objects::strip_managed_fields;
use crate::desired::{self, PodInfo};
use crate::error::{Error, Result};
use crate::watch::{DeletionSource, ObjectKey};

pub enum ServiceLookup {
    Exists(Arc<Service>),
    Gone,
}

/// Why the cache lacked a Service that a live read found: the bounded `reason`
/// label of `endpoints_guard_spurious_deletions_prevented_total`.
fn prevention_reason(source: Option<DeletionSource>) -> &'static str {
    match source {
        Some(DeletionSource::WatchDelete) => "watch_delete",
        Some(DeletionSource::MissingFromList) => "missing_from_list",
        None => "not_in_cache",
    }
}

/// Reads the Service live (a GET is served from etcd, so it is current).
pub async fn lookup_service(ctx: &Context, key: &ObjectKey) -> Result<ServiceLookup> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let live = api
        .get_opt(&key.name)
        .await
        .map_err(|e| Error::kube("confirming the Service is gone", key.to_string(), e))?;
    let tombstone = ctx.stores.services.read().tombstone(key).map(|t| {
        (
            t.source,
            t.last_known.metadata.uid.clone().unwrap_or_default(),
        )
    });
    let source = tombstone.as_ref().map(|(source, _)| *source);
    match live {
        None => {
            if let Some((_, uid)) = tombstone {
                ctx.stores.services.write().confirm_deleted(key, &uid);
            }
            Ok(ServiceLookup::Gone)
        }
        Some(svc) => {
            let reason = prevention_reason(source);
            ctx.metrics
                .spurious_deletions_prevented
                .with_label_values(&[reason])
                .inc();
            warn!(
                %key,
                reason,
                "spurious Endpoints deletion prevented: the cache lacked the Service but the API has it"
            );
            ctx.stores
                .services
                .write()
                .restore(strip_managed_fields(svc.clone()));
            let note = format!(
                "Endpoints deletion prevented: the watch cache lacked this Service ({reason}) but a live read found it; cache repaired"
            );
            publish(
                ctx,
                &svc_reference(key, svc.metadata.uid.clone()),
                EventType::Warning,
                "SpuriousDeletionPrevented",
                "Guard",
                note,
            )
            .await;
            Ok(ServiceLookup::Exists(Arc::new(svc)))
        }
    }
}

/// Pods named by the current Endpoints but missing from the pod cache after a
/// watch DELETE are read live; if the same pod (same UID) is still there, it goes
/// back into the cache and into `pods`.
pub async fn hold_unconfirmed_pod_deletions(
    ctx: &Context,
    current: &Endpoints,
    selector: &BTreeMap<String, String>,
    pods: &mut Vec<Arc<PodInfo>>,
) -> Result<()> {
    let namespace = current.metadata.namespace.clone().unwrap_or_default();
    let referenced = current
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .filter_map(|a| a.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"));
    let selected: HashSet<&str> = pods.iter().map(|p| p.name()).collect();
    let mut suspects: Vec<(ObjectKey, String)> = Vec::new();
    for target in referenced {
        let (Some(name), Some(uid)) = (&target.name, &target.uid) else {
            continue;
        };
        if selected.contains(name.as_str()) {
            continue;
        }
        let key = ObjectKey {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let cache = ctx.stores.pods.read();
        let tombstoned_same_pod = cache
            .tombstone(&key)
            .is_some_and(|t| t.last_known.uid() == uid);
        if tombstoned_same_pod && !suspects.iter().any(|(k, _)| k == &key) {
            suspects.push((key, uid.clone()));
        }
    }
    for (key, uid) in suspects {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let live = api
            .get_opt(&key.name)
            .await
            .map_err(|e| Error::kube("confirming a pod is gone", key.to_string(), e))?;
        let still_there = live
            .as_ref()
            .and_then(PodInfo::from_pod)
            .filter(|p| p.uid() == uid);
        match still_there {
            Some(info) => {
                ctx.metrics.pod_deletions_held.inc();
                info!(pod = %key, "pod still exists after a watch DELETE; keeping its address");
                ctx.stores.pods.write().restore(info.clone());
                if desired::selector_matches(selector, &info) {
                    pods.push(Arc::new(info));
                }
            }
            None => {
                ctx.stores.pods.write().confirm_deleted(&key, &uid);
            }
        }
    }
    Ok(())
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

/// A Warning Event on the Service named by `key` (for failed writes).
pub async fn warn_event(ctx: &Context, key: &ObjectKey, reason: &str, note: &str) {
    let uid = ctx
        .stores
        .services
        .read()
        .get(key)
        .and_then(|s| s.metadata.uid.clone());
    publish(
        ctx,
        &svc_reference(key, uid),
        EventType::Warning,
        reason,
        "Sync",
        note.to_string(),
    )
    .await;
}

async fn publish(
    ctx: &Context,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    // The API refuses an Event whose note exceeds 1 KiB (API errors quoted in
    // a note can be longer).
    let note = truncate_note(note);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    // Events are a report, not part of the reconcile: a failure to publish one is
    // logged and the reconcile goes on.
    if let Err(err) = ctx.recorder.publish(&event, regarding).await {
        warn!(error = %err, reason, "could not publish a Kubernetes Event");
    }
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
mod tests {
    use super::*;

    #[test]
    fn notes_fit_the_api_limit_on_a_char_boundary() {
        assert_eq!(truncate_note("short".into()), "short");
        let cut = truncate_note("é".repeat(800));
        assert!(cut.len() <= MAX_NOTE_BYTES);
        assert!(cut.ends_with("..."));
    }
}
