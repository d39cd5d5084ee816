//! The EndpointSlice controller's side of the reconcile ([`Publisher`]): the
//! slices cached for a Service, the desired slices and the plan that reaches
//! them, every removal passed through the guard, then only what the plan
//! holds written. The loop is `publish.rs`'s.
//!
//! What the guard covers here, as for Endpoints: slices are deleted for a
//! Service missing from the cache only after a live read shows it gone; an
//! endpoint whose pod left the cache through a watch DELETE stays until a
//! live read confirms that pod is gone; and the endpoints of pods on a Node
//! the cache lacks stay when a live read finds the Node (upstream drops them
//! on its cache's word).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tracing::{debug, info, warn};

use super::apply::{self, Verb};
use super::decide::{Existing, Removal, nodes_to_confirm};
use super::effects::Effect;
use super::guard;
use super::kinds::{CachedService, CachedSlice, selected_pods, slice_pod_refs};
use super::publish::{Act, Job, Publisher};
use super::{Context, kinds};
use crate::desired::PodInfo;
use crate::desired::scope::{Managed, Managers};
use crate::desired::slices::{
    self, DesiredSlices, HintMode, NodeInfo, PlanOptions, SlicePlan, UPSTREAM_SLICE_MANAGER,
    ZoneCapacity,
};
use crate::error::{Error, Result, api_code};
use crate::settings::{Controller, Mode};
use hardened_watcher::{Cached, ObjectKey, ReadStamp, live};

const CONTROLLER: Controller = Controller::Endpointslices;

/// The EndpointSlice controller: the slices labelled for a Service.
pub(crate) struct SlicesPublisher;

impl Publisher for SlicesPublisher {
    const CONTROLLER: Controller = CONTROLLER;
    /// Ours and upstream's: which of them are ours is the decision's.
    type Found = Vec<Arc<CachedSlice>>;

    fn find(ctx: &Context, key: &ObjectKey) -> Self::Found {
        kinds::slices_of(ctx, key, Managers::OWN_AND_UPSTREAM)
    }

    fn existing(found: &Self::Found) -> Existing {
        Existing {
            own: found.iter().any(|s| s.is_ours(Managers::OWN)),
            upstream: found.iter().any(|s| !s.is_ours(Managers::OWN)),
        }
    }

    /// The targetRefs of the ready endpoints of upstream's slices.
    fn upstream_ready(found: &Self::Found) -> Result<Vec<ObjectReference>> {
        let mut refs = Vec::new();
        for slice in found.iter().filter(|s| !s.is_ours(Managers::OWN)) {
            let slice = slice.decode()?;
            refs.extend(
                slice
                    .endpoints
                    .into_iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                    .filter_map(|e| e.target_ref)
                    .filter(|r| r.kind.as_deref() == Some("Pod")),
            );
        }
        Ok(refs)
    }

    /// Whether upstream's slices publish every ready address ours do: then
    /// an opted-out Service loses nothing when ours go.
    fn upstream_covers_ours(found: &Self::Found) -> Result<bool> {
        let (own, upstream): (Vec<_>, Vec<_>) =
            found.iter().partition(|s| s.is_ours(Managers::OWN));
        let decode = |of: Vec<&Arc<CachedSlice>>| -> Result<Vec<EndpointSlice>> {
            of.into_iter().map(|s| s.decode()).collect()
        };
        let (own, upstream) = (decode(own)?, decode(upstream)?);
        Ok(slices::ready_addresses(&own).is_subset(&slices::ready_addresses(&upstream)))
    }

    async fn apply(job: &Job<'_>, found: Self::Found, act: Act<'_>) -> Result<()> {
        let ours = |managers: Managers| -> Vec<_> {
            found.into_iter().filter(|s| s.is_ours(managers)).collect()
        };
        match act {
            Act::Remove { why, managers } => delete_all(job, &ours(managers), why).await,
            Act::Publish { service, managed } => {
                let ours = ours(managed.managers);
                reconcile_content(job, service, &ours, managed).await
            }
        }
    }
}

/// The slices of a handled Service (`existing`: those whose managed-by the
/// handling takes as ours): the guard holds the endpoints of pods whose
/// deletion only the watch reported, and of pods on Nodes only the cache
/// lacks; then the plan is made and written.
async fn reconcile_content(
    job: &Job<'_>,
    service: &CachedService,
    existing: &[Arc<CachedSlice>],
    managed: Managed<'_>,
) -> Result<()> {
    let Job { ctx, key, .. } = *job;
    let selector = managed.selector;
    let current: Vec<EndpointSlice> = existing.iter().map(|s| s.decode()).collect::<Result<_>>()?;
    let mut pods = selected_pods(ctx, &key.namespace, selector);
    guard::hold_unconfirmed_pod_deletions(
        ctx,
        CONTROLLER,
        &key.namespace,
        current.iter().flat_map(slice_pod_refs),
        selector,
        &mut pods,
    )
    .await?;
    let pod_refs: Vec<&PodInfo> = pods.iter().map(AsRef::as_ref).collect();
    let manager = compare_as(ctx, &current);
    let mut wanted = desire(ctx, service, &pod_refs, manager);
    let unknown_at_stake = nodes_at_stake(&wanted, &pod_refs, &current);
    if !unknown_at_stake.is_empty()
        && guard::hold_unconfirmed_nodes(ctx, &unknown_at_stake).await? > 0
    {
        wanted = desire(ctx, service, &pod_refs, manager);
    }
    let zones = if wanted.hints == HintMode::Auto {
        ctx.stores
            .nodes
            .with_cache(|nodes| ZoneCapacity::from_nodes(nodes.iter().map(|n| &n.info)))
    } else {
        ZoneCapacity::default()
    };
    let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let (trigger, seen) = ctx.slices.trigger_times.compute(key, created, &pod_refs);
    job.then(Effect::TriggerSeen(seen));
    let options = PlanOptions {
        max_endpoints_per_slice: ctx.policy.max_endpoints_per_slice,
        trigger_time: trigger,
        managers: managed.managers,
        replaced: if managed.takes_over() {
            Managers::UPSTREAM
        } else {
            Managers::NONE
        },
    };
    let plan = slices::plan_slices(&wanted, &current, &zones, &options);
    if !plan.is_empty() {
        apply(job, &current, &wanted, plan).await?;
    }
    // As upstream: what could be written was; the Service comes back with
    // backoff until its pods' Nodes are known.
    if !wanted.pods_on_unknown_nodes.is_empty() {
        return Err(Error::UnknownNodes {
            service: key.to_string(),
            pods: wanted.pods_on_unknown_nodes.len(),
        });
    }
    Ok(())
}

/// The desired slices, with the Nodes of the pods looked up in the cache.
fn desire(
    ctx: &Context,
    service: &CachedService,
    pods: &[&PodInfo],
    manager: &str,
) -> DesiredSlices {
    let nodes: HashMap<String, NodeInfo> = ctx.stores.nodes.with_cache(|cache| {
        pods.iter()
            .filter_map(|p| p.node_name())
            .filter_map(|name| cache.get(&ObjectKey::new("", name)))
            .map(|node| (node.info.name.clone(), node.info.clone()))
            .collect()
    });
    slices::desired_slices(service, pods, &nodes, manager, ctx.policy.rules)
}

/// The Nodes, unknown to the cache, of pods whose endpoints the current
/// slices hold ([`nodes_to_confirm`]).
fn nodes_at_stake(
    wanted: &DesiredSlices,
    pods: &[&PodInfo],
    current: &[EndpointSlice],
) -> Vec<String> {
    if wanted.pods_on_unknown_nodes.is_empty() {
        return Vec::new();
    }
    let published: BTreeSet<&str> = current
        .iter()
        .flat_map(slice_pod_refs)
        .filter_map(|r| r.name.as_deref())
        .collect();
    let unknown: BTreeSet<&str> = wanted
        .pods_on_unknown_nodes
        .iter()
        .map(String::as_str)
        .collect();
    nodes_to_confirm(&unknown, &published, pods.iter().copied())
}

/// The managed-by value to plan with. In audit mode beside the upstream
/// controller (with `--managed-by own`) its slices differ from ours only by
/// that label; planning with it makes identical slices an empty plan, so only
/// real differences count.
fn compare_as(ctx: &Context, current: &[EndpointSlice]) -> &'static str {
    let upstream_wrote = current.iter().any(|s| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(slices::LABEL_SLICE_MANAGED_BY))
            .is_some_and(|m| m == UPSTREAM_SLICE_MANAGER)
    });
    if ctx.policy.mode == Mode::Audit && upstream_wrote {
        UPSTREAM_SLICE_MANAGER
    } else {
        ctx.policy.managed_by.slices()
    }
}

/// Counts the plan's writes in audit mode; `true` when they may go ahead.
fn may_write(ctx: &Context, key: &ObjectKey, plan: &SlicePlan) -> bool {
    let planned = [plan.creates.len(), plan.updates.len(), plan.deletes.len()];
    apply::may_write(ctx, CONTROLLER, key, planned)
}

/// Creates first, then updates, then deletes, as upstream orders them: the
/// Service is never left with fewer endpoints than before in between.
async fn apply(
    job: &Job<'_>,
    current: &[EndpointSlice],
    wanted: &DesiredSlices,
    plan: SlicePlan,
) -> Result<()> {
    let Job {
        ctx, key, timer, ..
    } = *job;
    if !may_write(ctx, key, &plan) {
        return Ok(());
    }
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &key.namespace);
    for slice in &plan.creates {
        let stamp = ctx.stores.slices.read_stamp();
        match timer.write(api.create(&PostParams::default(), slice)).await {
            Ok(written) => {
                count_write(ctx, Verb::Create);
                remember(ctx, key, written, &stamp);
            }
            Err(err) if apply::is_namespace_terminating(&err) => {
                debug!(%key, "namespace is terminating; not creating EndpointSlices");
                return Ok(());
            }
            Err(err) => return Err(failed(job, Verb::Create, err)),
        }
    }
    for slice in &plan.updates {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let stamp = ctx.stores.slices.read_stamp();
        match timer
            .write(api.replace(&name, &PostParams::default(), slice))
            .await
        {
            Ok(written) => {
                count_write(ctx, Verb::Update);
                remember(ctx, key, written, &stamp);
            }
            Err(err) => return Err(conflict_or_gone(job, &name, Verb::Update, err).await),
        }
    }
    for slice in &plan.deletes {
        delete_one(job, &api, slice).await?;
    }
    release_dropped(ctx, key, current, wanted);
    Ok(())
}

/// Pods the current slices named that the desired ones do not: their
/// tombstones, if nothing else of ours names them, go (as for Endpoints).
fn release_dropped(
    ctx: &Context,
    key: &ObjectKey,
    current: &[EndpointSlice],
    wanted: &DesiredSlices,
) {
    let kept: Vec<&ObjectReference> = wanted
        .address_types
        .iter()
        .flat_map(|a| &a.groups)
        .flat_map(|g| &g.endpoints)
        .filter_map(|e| e.target_ref.as_ref())
        .collect();
    let dropped = apply::dropped_pods(current.iter().flat_map(slice_pod_refs), kept.into_iter());
    apply::release_dropped_pods(ctx, &key.namespace, dropped);
}

/// Deletes the slices the decision removes (after a live read of their
/// Service). Each delete carries the UID and resourceVersion read, so a
/// slice changed or re-created since is not deleted.
async fn delete_all(job: &Job<'_>, existing: &[Arc<CachedSlice>], why: Removal) -> Result<()> {
    let Job { ctx, key, .. } = *job;
    let plan = SlicePlan {
        deletes: existing.iter().map(|s| s.decode()).collect::<Result<_>>()?,
        ..SlicePlan::default()
    };
    if !may_write(ctx, key, &plan) {
        return Ok(());
    }
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &key.namespace);
    for slice in &plan.deletes {
        delete_one(job, &api, slice).await?;
    }
    info!(%key, slices = plan.deletes.len(), why = ?why, "deleted EndpointSlices");
    job.then(Effect::TriggerForgotten);
    Ok(())
}

async fn delete_one(job: &Job<'_>, api: &Api<EndpointSlice>, slice: &EndpointSlice) -> Result<()> {
    let Job { ctx, timer, .. } = *job;
    let name = slice.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: slice.metadata.uid.clone(),
            resource_version: slice.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match timer.write(api.delete(&name, &params)).await {
        Ok(_) => {
            count_write(ctx, Verb::Delete);
            Ok(())
        }
        Err(err) if live::is_gone(&err, &name, "endpointslices") => Ok(()),
        Err(err) => Err(conflict_or_gone(job, &name, Verb::Delete, err).await),
    }
}

fn count_write(ctx: &Context, verb: Verb) {
    ctx.metrics
        .endpointslice_writes
        .with_label_values(&[verb.as_str()])
        .inc();
}

/// The error of a failed update or delete of slice `name`, after repairing
/// the cache: a conflict reads the slice live so the retry starts from fresh
/// state; a slice found gone (a DELETE the watch never delivered) leaves the
/// cache, and the retry plans without it.
async fn conflict_or_gone(job: &Job<'_>, name: &str, verb: Verb, err: kube::Error) -> Error {
    let Job { ctx, key, .. } = *job;
    let slice_key = ObjectKey::new(key.namespace.as_str(), name);
    if api_code(&err) == Some(409) {
        if let Err(read) = apply::refresh_after_conflict::<EndpointSlice, _>(
            ctx,
            &ctx.stores.slices,
            &slice_key,
            "reading an EndpointSlice after a conflict",
            CachedSlice::new,
        )
        .await
        {
            return read;
        }
        warn!(%key, slice = name, %verb, "EndpointSlice changed since read; will look again");
        return Error::kube("writing an EndpointSlice", slice_key.to_string(), err);
    }
    if live::is_gone(&err, name, "endpointslices") {
        if let Some(cached) = ctx.stores.slices.get(&slice_key) {
            ctx.stores.slices.evict_ghost(&slice_key, cached.uid());
        }
        warn!(%key, slice = name, "the EndpointSlice to update was gone; planning again");
        return Error::kube("writing an EndpointSlice", slice_key.to_string(), err);
    }
    failed(job, verb, err)
}

/// A write the API refused: a Warning Event on the Service, as upstream's
/// `FailedToUpdateEndpointSlices`, and the error.
fn failed(job: &Job<'_>, verb: Verb, err: kube::Error) -> Error {
    let key = job.key;
    job.warn(
        "FailedToUpdateEndpointSlices",
        format!("Error updating Endpoint Slices for Service {key} ({verb}): {err}"),
    );
    Error::kube("writing an EndpointSlice", key.to_string(), err)
}

/// Puts a slice just written into the cache (`stamp` taken before the
/// request), so the next reconcile plans against it; `key` is its Service.
fn remember(ctx: &Context, key: &ObjectKey, slice: EndpointSlice, stamp: &ReadStamp) {
    match CachedSlice::new(slice) {
        Some(cached) => {
            ctx.stores.slices.restore(cached, stamp);
        }
        None => warn!(
            %key,
            "an EndpointSlice written could not be encoded for the cache; waiting for the watch"
        ),
    }
}
