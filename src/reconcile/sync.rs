//! The reconcile of one Service key: observe the caches, compute the desired
//! Endpoints, pass deletions through the guard, then write only what changed.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::Request;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use std::collections::HashSet;

use super::decide::{Decision, Existing, Idle, Observed, Removal, Status, decide, opt_in_status};
use super::guard;
use super::kinds::{CachedEndpoints, CachedService, managed_by, pod_target_refs};
use super::latency::WriteTimer;
use super::opt_in::SELECTOR_RESTORED;
use super::{Context, kinds, orphans};
use crate::desired::scope::{ANNOTATION_SELECTOR, Handling, LABEL_OPT_IN, Managed, OptInState};
use crate::desired::{self, EndpointsMarks, PodInfo};
use crate::error::{Error, Result, api_code};
use crate::reconcile::kinds::{Kind, ServiceKind};
use crate::settings::{Controller, Mode};
use crate::wire::EndpointsWire;
use hardened_watcher::{Cached, Confirmation, LiveRead, ObjectKey, Store, live};

/// A write to the Endpoints API.
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

/// `timer` times the first write (see [`WriteTimer`]).
pub async fn reconcile(ctx: &Context, key: &ObjectKey, timer: &WriteTimer) -> Result<()> {
    // The Service as a live read found it, once one was made.
    let mut live: Option<Option<Arc<CachedService>>> = None;
    loop {
        let endpoints = ctx.stores.endpoints.get(key);
        let cached_service = ctx.stores.services.get(key);
        orphans::observe(ctx, key, cached_service.is_some(), endpoints.as_deref());
        let service = live.clone().unwrap_or(cached_service);
        let existing = existing(endpoints.as_deref());
        let misses_pods =
            takeover_misses_pods(
                ctx,
                key,
                service.as_deref(),
                existing,
                || match &endpoints {
                    Some(ep) => Ok(ready_target_refs(&ep.decode()?)),
                    None => Ok(Vec::new()),
                },
            )?;
        let decision = decide(&Observed {
            scope: ctx.scope,
            controller: Controller::Endpoints,
            service: service.as_deref(),
            read_live: live.is_some(),
            existing,
            covered: false,
            misses_pods,
        });
        follow_up(
            ctx,
            Controller::Endpoints,
            key,
            service.as_deref(),
            &decision,
        );
        match decision {
            Decision::ReadService(why) => {
                live = Some(guard::read_service(ctx, Controller::Endpoints, key, why).await?);
            }
            Decision::Idle(Idle::NoService) => {
                ctx.endpoints.trigger_times.forget(key);
                release_service_tombstone(ctx, key);
                return Ok(());
            }
            Decision::Idle(_) | Decision::Frozen(_) => return Ok(()),
            Decision::Remove { why, managers } => {
                return match endpoints {
                    Some(ep) if managers.endpoints(ep.managed_by()) => {
                        delete_endpoints(ctx, key, &ep, why, timer).await
                    }
                    _ => Ok(()),
                };
            }
            Decision::Reconcile(managed) => {
                let Some(service) = service.as_deref() else {
                    return Ok(());
                };
                return reconcile_content(ctx, key, service, endpoints, managed, timer).await;
            }
        }
    }
}

/// Which managed-by value the cached Endpoints carry.
fn existing(endpoints: Option<&CachedEndpoints>) -> Existing {
    let manager = endpoints.and_then(CachedEndpoints::managed_by);
    Existing {
        own: manager == Some(desired::MANAGER),
        upstream: manager == Some(desired::UPSTREAM_MANAGER),
    }
}

/// The targetRefs of the ready addresses of `ep`.
fn ready_target_refs(ep: &Endpoints) -> Vec<ObjectReference> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| a.target_ref.clone())
        .collect()
}

/// For both controllers: whether taking over upstream's objects of the
/// Service would drop ready endpoints of live pods its opt-in's selector
/// misses ([`guard::selector_misses_pods`]). `upstream_ready` gives the
/// targetRefs of upstream's ready endpoints; it is asked only when a
/// takeover is pending.
pub(super) fn takeover_misses_pods(
    ctx: &Context,
    key: &ObjectKey,
    service: Option<&CachedService>,
    existing: Existing,
    upstream_ready: impl FnOnce() -> Result<Vec<ObjectReference>>,
) -> Result<bool> {
    let Some(Handling::Managed(managed)) = service.map(|s| s.handling(ctx.scope)) else {
        return Ok(false);
    };
    if !(managed.takes_over() && existing.upstream) {
        return Ok(false);
    }
    Ok(guard::selector_misses_pods(
        ctx,
        key,
        managed.selector,
        &upstream_ready()?,
    ))
}

/// What a decision means besides its action, for both controllers: where
/// the opted-in Service stands (gauges, and a Warning Event when it enters
/// a state that needs a person), and the opt-out clock.
pub(super) fn follow_up(
    ctx: &Context,
    controller: Controller,
    key: &ObjectKey,
    service: Option<&CachedService>,
    decision: &Decision<'_>,
) {
    let status = opt_in_status(service, ctx.scope, decision);
    if let Some(entered) = ctx
        .opt_in_states
        .record(key, controller, status, &ctx.opt_in_gauges())
    {
        report_opt_in(ctx, key, entered);
    }
    let work = ctx.work(controller);
    if status.map(Status::state) != Some(OptInState::OptingOut) {
        work.opt_outs.forget(key);
        return;
    }
    let now = Instant::now();
    if work.opt_outs.start(key, now) {
        // Back when the grace is over, to report a stalled opt-out.
        work.queue.add_after(key.clone(), ctx.opt_out_grace);
    } else if work.opt_outs.waited(key, now) >= ctx.opt_out_grace && work.opt_outs.report(key) {
        warn!(%key, %controller, "opt-out stalled: kube-controller-manager does not publish the ready endpoints ours do");
        guard::warn_event(
            ctx,
            key,
            "OptOutStalled",
            &format!(
                "Opted out, but kube-controller-manager has not published the same ready endpoints within {:?}: endpoints-guard keeps its {} current and removes them once it does (is kube-controller-manager's {} controller running?)",
                ctx.opt_out_grace,
                controller.objects(),
                controller.objects(),
            ),
        );
    }
}

/// The Warning Event of an opted-in Service that entered `status`.
fn report_opt_in(ctx: &Context, key: &ObjectKey, status: Status) {
    let (reason, note) = match status {
        Status::Frozen(why) => (
            "OptInInvalid",
            format!(
                "Opted in, but {}: endpoints-guard leaves what is published as it is until this is fixed",
                why.explain()
            ),
        ),
        Status::State(OptInState::SelectorRestored) => (
            SELECTOR_RESTORED,
            "spec.selector is back on this opted-in Service (a re-applied manifest?): kube-controller-manager publishes beside endpoints-guard, and protection is off until spec.selector is removed again where the manifest lives, or the Service opts out".to_string(),
        ),
        Status::State(OptInState::BesideUpstream) => (
            "ProtectionOff",
            "Opted in, but spec.selector is still there: kube-controller-manager publishes beside endpoints-guard, and protection is off until spec.selector is removed".to_string(),
        ),
        Status::State(OptInState::LabelRemoved) => (
            "OptInLabelRemoved",
            format!(
                "Label {LABEL_OPT_IN} is gone, but the Service has no spec.selector: endpoints-guard keeps publishing from annotation {ANNOTATION_SELECTOR}. Put spec.selector back to opt out, or the label back; removing the annotation too removes these endpoints"
            ),
        ),
        Status::State(OptInState::Protecting | OptInState::OptingOut | OptInState::Frozen) => {
            info!(%key, state = status.state().metric_label(), "opt-in state");
            return;
        }
    };
    warn!(%key, reason, "{note}");
    guard::warn_event(ctx, key, reason, &note);
}

/// The Endpoints of a handled Service: the guard holds the addresses of
/// pods whose deletion only the watch reported, then the content is
/// computed and written if it differs.
async fn reconcile_content(
    ctx: &Context,
    key: &ObjectKey,
    service: &CachedService,
    endpoints: Option<Arc<CachedEndpoints>>,
    managed: Managed<'_>,
    timer: &WriteTimer,
) -> Result<()> {
    let selector = managed.selector;
    let endpoints = endpoints
        .as_deref()
        .map(CachedEndpoints::decode)
        .transpose()?;
    let mut pods = selected_pods(ctx, &key.namespace, selector);
    if let Some(ep) = &endpoints {
        guard::hold_unconfirmed_pod_deletions(
            ctx,
            Controller::Endpoints,
            &key.namespace,
            pod_target_refs(ep),
            selector,
            &mut pods,
        )
        .await?;
    }
    let pod_refs: Vec<&PodInfo> = pods.iter().map(AsRef::as_ref).collect();
    let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let trigger = ctx.endpoints.trigger_times.compute(key, created, &pod_refs);
    let computed = desired::compute_subsets(service, &pod_refs, ctx.rules);
    let marks = EndpointsMarks {
        managed_by: compare_as(ctx, endpoints.as_ref()),
        skip_mirror: managed.opt_in.is_some(),
    };
    if !desired::needs_write(service, &computed, endpoints.as_ref(), marks, ctx.rules) {
        return Ok(());
    }
    let wanted = desired::build_endpoints(
        service,
        computed,
        endpoints.as_ref(),
        trigger,
        EndpointsMarks {
            managed_by: ctx.managed_by.endpoints(),
            ..marks
        },
    );
    apply(ctx, key, endpoints.as_ref(), wanted, timer).await
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

/// A Service gone from the cache with nothing of ours at stake (no Endpoints
/// or slices, or only ones we never delete): its tombstone goes without a
/// live read (any later deletion reads live anyway).
pub(super) fn release_service_tombstone(ctx: &Context, key: &ObjectKey) {
    // The other controller may still have something of ours for it.
    if <ServiceKind as Kind>::at_stake(ctx, key, "") {
        return;
    }
    let store = &ctx.stores.services;
    let uid = store.with_cache(|services| {
        services
            .tombstone(key)
            .map(|t| t.last_known.uid().to_string())
    });
    if let Some(uid) = uid {
        store.confirm_deleted(key, &uid, Confirmation::Released);
    }
}

/// The managed-by value a write would carry. In audit mode beside the upstream
/// controller (with `--managed-by own`) its Endpoints differ from ours only by
/// that label; counting that as a divergence would hide the real ones.
fn compare_as(ctx: &Context, current: Option<&Endpoints>) -> &'static str {
    let upstream_wrote = current.and_then(managed_by) == Some(desired::UPSTREAM_MANAGER);
    if ctx.mode == Mode::Audit && upstream_wrote {
        desired::UPSTREAM_MANAGER
    } else {
        ctx.managed_by.endpoints()
    }
}

async fn apply(
    ctx: &Context,
    key: &ObjectKey,
    current: Option<&Endpoints>,
    wanted: Endpoints,
    timer: &WriteTimer,
) -> Result<()> {
    let verb = if current.is_some() {
        Verb::Update
    } else {
        Verb::Create
    };
    if ctx.mode == Mode::Audit {
        ctx.metrics
            .audit_divergences
            .with_label_values(&[Controller::Endpoints.metric_label(), verb.as_str()])
            .inc();
        info!(%key, would = verb.as_str(), "audit: Endpoints differ from what the Service and pods call for");
        return Ok(());
    }
    if !ctx.writes_allowed() {
        debug!(%key, "not the leader (any more): not writing");
        return Ok(());
    }
    let stamp = ctx.stores.endpoints.read_stamp();
    match write_endpoints(ctx, key, verb, &wanted, timer).await {
        Ok(written) => {
            ctx.metrics
                .endpoints_writes
                .with_label_values(&[verb.as_str()])
                .inc();
            debug!(%key, %verb, "wrote Endpoints");
            if verb == Verb::Create && ctx.endpoints.restores.take(key) {
                ctx.metrics.endpoints_restored.inc();
                info!(%key, "restored Endpoints that someone else deleted while their Service was handled");
            }
            // The pods our write dropped, by what we sent (the cache's copy of
            // what was written decides, in `release_dropped_pods`, whether
            // anything still names them).
            let dropped = current
                .map(|current| dropped_pods(pod_target_refs(current), pod_target_refs(&wanted)))
                .unwrap_or_default();
            // The cache learns our own write now, so the next reconcile compares
            // against it rather than writing again before the watch catches up.
            match CachedEndpoints::from_wire(written) {
                Some(cached) => {
                    ctx.stores.endpoints.restore(cached, &stamp);
                }
                None => {
                    warn!(%key, "the Endpoints written could not be read for the cache; waiting for the watch")
                }
            }
            release_dropped_pods(ctx, &key.namespace, dropped);
            Ok(())
        }
        Err(err) if api_code(&err) == Some(409) => {
            refresh_endpoints(ctx, key).await?;
            Err(Error::kube("writing endpoints", key.to_string(), err))
        }
        Err(err) if verb == Verb::Update && live::is_gone(&err, &key.name, "endpoints") => {
            // The cached Endpoints no longer exist (a DELETE the watch never
            // delivered): forget them; the retry creates them.
            if let Some(ep) = ctx.stores.endpoints.get(key) {
                ctx.stores.endpoints.evict_ghost(key, ep.uid());
            }
            warn!(%key, "the Endpoints to update were gone; creating them on retry");
            Err(Error::kube("writing endpoints", key.to_string(), err))
        }
        Err(err) if verb == Verb::Create && is_namespace_terminating(&err) => {
            debug!(%key, "namespace is terminating; not creating Endpoints");
            Ok(())
        }
        Err(err) => {
            guard::warn_event(
                ctx,
                key,
                "FailedToUpdateEndpoint",
                &format!("Failed to {verb} endpoint {key}: {err}"),
            );
            Err(Error::kube("writing endpoints", key.to_string(), err))
        }
    }
}

/// Creates (`Verb::Create`) or replaces Endpoints: what `Api::create` and
/// `Api::replace` do, but the answer is decoded as [`EndpointsWire`], its
/// subsets kept as text for the cache instead of decoded address by address
/// only to be encoded again. The write counts as sent once its body is
/// encoded, when the request is handed to the client.
async fn write_endpoints(
    ctx: &Context,
    key: &ObjectKey,
    verb: Verb,
    wanted: &Endpoints,
    timer: &WriteTimer,
) -> std::result::Result<EndpointsWire, kube::Error> {
    let request = Request::new(Endpoints::url_path(&(), Some(&key.namespace)));
    let mut body = Vec::with_capacity(body_capacity(wanted));
    serde_json::to_writer(&mut body, wanted).map_err(kube::Error::SerdeError)?;
    let params = PostParams::default();
    let (built, name) = match verb {
        Verb::Create => (request.create(&params, body), "create"),
        _ => (request.replace(&key.name, &params, body), "replace"),
    };
    let mut req = built.map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert(name);
    timer.write(ctx.client.request::<EndpointsWire>(req)).await
}

/// Room for an Endpoints' JSON, so encoding it fills one buffer instead of
/// growing one from 128 bytes through every power of two: about 200 bytes an
/// address (IP, nodeName, targetRef) on top of the metadata.
fn body_capacity(endpoints: &Endpoints) -> usize {
    let addresses: usize = endpoints
        .subsets
        .iter()
        .flatten()
        .map(|s| {
            s.addresses.as_ref().map_or(0, Vec::len)
                + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
        })
        .sum();
    1024 + 200 * addresses
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

/// [`refresh_after_conflict`] for Endpoints.
async fn refresh_endpoints(ctx: &Context, key: &ObjectKey) -> Result<()> {
    refresh_after_conflict::<Endpoints, _>(
        ctx,
        &ctx.stores.endpoints,
        key,
        "reading endpoints after a conflict",
        CachedEndpoints::new,
    )
    .await
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

/// Deletes Endpoints of ours the decision removes (after a live read of
/// their Service). The precondition on UID and resourceVersion makes the API
/// refuse if the Endpoints were re-created or changed since we read them.
async fn delete_endpoints(
    ctx: &Context,
    key: &ObjectKey,
    ep: &CachedEndpoints,
    why: Removal,
    timer: &WriteTimer,
) -> Result<()> {
    if ctx.mode == Mode::Audit {
        ctx.metrics
            .audit_divergences
            .with_label_values(&[Controller::Endpoints.metric_label(), Verb::Delete.as_str()])
            .inc();
        info!(%key, why = ?why, "audit: Endpoints would be deleted");
        return Ok(());
    }
    if !ctx.writes_allowed() {
        debug!(%key, "not the leader (any more): not deleting");
        return Ok(());
    }
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(ep.uid().to_string()),
            resource_version: Some(ep.resource_version().to_string()),
        }),
        ..DeleteParams::default()
    };
    match timer.write(api.delete(&key.name, &params)).await {
        Ok(_) => {
            ctx.metrics
                .endpoints_writes
                .with_label_values(&[Verb::Delete.as_str()])
                .inc();
            info!(%key, why = ?why, "deleted Endpoints");
            ctx.endpoints.trigger_times.forget(key);
            Ok(())
        }
        Err(err) if api_code(&err) == Some(404) => Ok(()),
        Err(err) if api_code(&err) == Some(409) => {
            warn!(%key, "Endpoints changed since read; not deleting, will look again");
            refresh_endpoints(ctx, key).await?;
            Err(Error::kube("deleting endpoints", key.to_string(), err))
        }
        Err(err) => Err(Error::kube("deleting endpoints", key.to_string(), err)),
    }
}
