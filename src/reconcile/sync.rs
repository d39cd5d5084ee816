//! The Endpoints controller's side of the reconcile ([`Publisher`]): what is
//! cached for a Service, the guard over its addresses, the write of what
//! differs, and the guarded deletion. The loop is `publish.rs`'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::Request;
use kube::{Api, Resource};
use tracing::{debug, info, warn};

use super::apply::{self, Verb, may_write, one};
use super::decide::{Existing, Removal};
use super::effects::Effect;
use super::guard;
use super::kinds::{CachedEndpoints, CachedService, managed_by, pod_target_refs, selected_pods};
use super::latency::WriteTimer;
use super::publish::{Act, Job, Publisher};
use super::{Context, orphans};
use crate::desired::scope::Managed;
use crate::desired::{self, EndpointsMarks, PodInfo};
use crate::error::{Error, Result, api_code};
use crate::settings::{Controller, Mode};
use crate::wire::EndpointsWire;
use hardened_watcher::{Cached, ObjectKey, live};

/// The Endpoints controller: one Endpoints object per Service.
pub(crate) struct EndpointsPublisher;

impl Publisher for EndpointsPublisher {
    const CONTROLLER: Controller = Controller::Endpoints;
    type Found = Option<Arc<CachedEndpoints>>;

    fn find(ctx: &Context, key: &ObjectKey) -> Self::Found {
        ctx.stores.endpoints.get(key)
    }

    fn note_found(job: &Job<'_>, service_cached: bool, found: &Self::Found) {
        job.then(orphans::observe(service_cached, found.as_deref()));
    }

    fn existing(found: &Self::Found) -> Existing {
        let manager = found.as_deref().and_then(CachedEndpoints::managed_by);
        Existing {
            own: manager == Some(desired::MANAGER),
            upstream: manager == Some(desired::UPSTREAM_MANAGER),
        }
    }

    fn upstream_ready(found: &Self::Found) -> Result<Vec<ObjectReference>> {
        match found {
            Some(ep) => Ok(ready_target_refs(&ep.decode()?)),
            None => Ok(Vec::new()),
        }
    }

    /// One object per Service: ours and upstream's never stand side by side.
    fn upstream_covers_ours(_found: &Self::Found) -> Result<bool> {
        Ok(false)
    }

    async fn apply(job: &Job<'_>, found: Self::Found, act: Act<'_>) -> Result<()> {
        match (act, found) {
            (Act::Remove { why, managers }, Some(ep)) if managers.endpoints(ep.managed_by()) => {
                delete_endpoints(job, &ep, why).await
            }
            (Act::Remove { .. }, _) => Ok(()),
            (Act::Publish { service, managed }, found) => {
                reconcile_content(job, service, found, managed).await
            }
        }
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

/// The Endpoints of a handled Service: the guard holds the addresses of
/// pods whose deletion only the watch reported, then the content is
/// computed and written if it differs.
async fn reconcile_content(
    job: &Job<'_>,
    service: &CachedService,
    endpoints: Option<Arc<CachedEndpoints>>,
    managed: Managed<'_>,
) -> Result<()> {
    let Job { ctx, key, .. } = *job;
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
    let (trigger, seen) = ctx.endpoints.trigger_times.compute(key, created, &pod_refs);
    job.then(Effect::TriggerSeen(seen));
    let computed = desired::compute_subsets(service, &pod_refs, ctx.policy.rules);
    let marks = EndpointsMarks {
        managed_by: compare_as(ctx, endpoints.as_ref()),
        skip_mirror: managed.opt_in.is_some(),
    };
    if !desired::needs_write(
        service,
        &computed,
        endpoints.as_ref(),
        marks,
        ctx.policy.rules,
    ) {
        return Ok(());
    }
    let wanted = desired::build_endpoints(
        service,
        computed,
        endpoints.as_ref(),
        trigger,
        EndpointsMarks {
            managed_by: ctx.policy.managed_by.endpoints(),
            ..marks
        },
    );
    apply(job, endpoints.as_ref(), wanted).await
}

/// The managed-by value a write would carry. In audit mode beside the upstream
/// controller (with `--managed-by own`) its Endpoints differ from ours only by
/// that label; counting that as a divergence would hide the real ones.
fn compare_as(ctx: &Context, current: Option<&Endpoints>) -> &'static str {
    let upstream_wrote = current.and_then(managed_by) == Some(desired::UPSTREAM_MANAGER);
    if ctx.policy.mode == Mode::Audit && upstream_wrote {
        desired::UPSTREAM_MANAGER
    } else {
        ctx.policy.managed_by.endpoints()
    }
}

async fn apply(job: &Job<'_>, current: Option<&Endpoints>, wanted: Endpoints) -> Result<()> {
    let Job {
        ctx, key, timer, ..
    } = *job;
    let verb = if current.is_some() {
        Verb::Update
    } else {
        Verb::Create
    };
    if !may_write(ctx, Controller::Endpoints, key, one(verb)) {
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
            if verb == Verb::Create {
                job.then(Effect::EndpointsCreated);
            }
            // The pods our write dropped, by what we sent (the cache's copy of
            // what was written decides, in `release_dropped_pods`, whether
            // anything still names them).
            let dropped = current
                .map(|current| {
                    apply::dropped_pods(pod_target_refs(current), pod_target_refs(&wanted))
                })
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
            apply::release_dropped_pods(ctx, &key.namespace, dropped);
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
        Err(err) if verb == Verb::Create && apply::is_namespace_terminating(&err) => {
            debug!(%key, "namespace is terminating; not creating Endpoints");
            Ok(())
        }
        Err(err) => {
            job.warn(
                "FailedToUpdateEndpoint",
                format!("Failed to {verb} endpoint {key}: {err}"),
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

/// [`refresh_after_conflict`] for Endpoints.
async fn refresh_endpoints(ctx: &Context, key: &ObjectKey) -> Result<()> {
    apply::refresh_after_conflict::<Endpoints, _>(
        ctx,
        &ctx.stores.endpoints,
        key,
        "reading endpoints after a conflict",
        CachedEndpoints::new,
    )
    .await
}

/// Deletes Endpoints of ours the decision removes (after a live read of
/// their Service). The precondition on UID and resourceVersion makes the API
/// refuse if the Endpoints were re-created or changed since we read them.
async fn delete_endpoints(job: &Job<'_>, ep: &CachedEndpoints, why: Removal) -> Result<()> {
    let Job {
        ctx, key, timer, ..
    } = *job;
    if !may_write(ctx, Controller::Endpoints, key, one(Verb::Delete)) {
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
            job.then(Effect::TriggerForgotten);
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

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
