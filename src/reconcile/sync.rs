//! The reconcile of one Service key: observe the caches, compute the desired
//! Endpoints, pass deletions through the guard, then write only what changed.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Endpoints;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tracing::{debug, info, warn};

use super::Context;
use super::guard::{self, ServiceLookup};
use super::objects::{CachedEndpoints, managed_by};
use crate::config::Mode;
use crate::desired::{self, PodInfo};
use crate::error::{Error, Result, api_code};
use crate::watch::{Cached, ObjectKey};

pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<()> {
    let service = ctx.stores.services.read().get(key);
    let endpoints = ctx.stores.endpoints.read().get(key);

    let service = match service {
        Some(svc) => svc,
        None => match &endpoints {
            // Nothing exists for this key: nothing to write, nothing at stake.
            None => {
                ctx.trigger_times.forget(key);
                // No Endpoints, nothing at stake: the tombstone can go without a
                // live read (any later deletion of Endpoints reads live anyway).
                let uid = ctx
                    .stores
                    .services
                    .read()
                    .tombstone(key)
                    .map(|t| t.last_known.uid().to_string());
                if let Some(uid) = uid {
                    ctx.stores.services.write().confirm_deleted(key, &uid);
                }
                return Ok(());
            }
            Some(ep) if !ep.is_deletable() => {
                debug!(%key, managed_by = ?ep.managed_by(), "Endpoints without a Service are not ours to delete");
                return Ok(());
            }
            Some(ep) => match guard::lookup_service(ctx, key).await? {
                ServiceLookup::Gone => return delete_endpoints(ctx, key, ep).await,
                ServiceLookup::Exists(svc) => svc,
            },
        },
    };

    // ExternalName and selector-less Services: their Endpoints belong to users.
    let Some(selector) = desired::managed_selector(&service) else {
        return Ok(());
    };
    let endpoints = endpoints
        .as_deref()
        .map(CachedEndpoints::decode)
        .transpose()?;
    let mut pods: Vec<Arc<PodInfo>> = {
        let cache = ctx.stores.pods.read();
        cache
            .selector_candidates(&key.namespace, selector)
            .into_iter()
            .filter(|p| desired::selector_matches(selector, p.as_ref()))
            .cloned()
            .collect()
    };
    if let Some(ep) = &endpoints {
        guard::hold_unconfirmed_pod_deletions(ctx, ep, selector, &mut pods).await?;
    }
    let pod_refs: Vec<&PodInfo> = pods.iter().map(AsRef::as_ref).collect();
    let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let trigger = ctx.trigger_times.compute(key, created, &pod_refs);
    let computed = desired::compute_subsets(&service, &pod_refs);
    if !desired::needs_write(
        &service,
        &computed,
        endpoints.as_ref(),
        compare_as(ctx, endpoints.as_ref()),
    ) {
        return Ok(());
    }
    let wanted = desired::build_endpoints(
        &service,
        computed,
        endpoints.as_ref(),
        trigger,
        desired::MANAGER,
    );
    apply(ctx, key, endpoints.as_ref(), wanted).await
}

/// The managed-by value a write would carry. In audit mode beside the upstream
/// controller its Endpoints differ from ours only by that label; counting that as
/// a divergence would hide the real ones.
fn compare_as(ctx: &Context, current: Option<&Endpoints>) -> &'static str {
    let upstream_wrote = current.and_then(managed_by) == Some(desired::UPSTREAM_MANAGER);
    if ctx.mode == Mode::Audit && upstream_wrote {
        desired::UPSTREAM_MANAGER
    } else {
        desired::MANAGER
    }
}

async fn apply(
    ctx: &Context,
    key: &ObjectKey,
    current: Option<&Endpoints>,
    wanted: Endpoints,
) -> Result<()> {
    let verb = if current.is_some() {
        "update"
    } else {
        "create"
    };
    if ctx.mode == Mode::Audit {
        ctx.metrics
            .audit_divergences
            .with_label_values(&[verb])
            .inc();
        info!(%key, would = verb, "audit: Endpoints differ from what the Service and pods call for");
        return Ok(());
    }
    if !ctx.writes_allowed() {
        debug!(%key, "not the leader (any more): not writing");
        return Ok(());
    }
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let result = match current {
        None => api.create(&PostParams::default(), &wanted).await,
        Some(_) => {
            api.replace(&key.name, &PostParams::default(), &wanted)
                .await
        }
    };
    match result {
        Ok(written) => {
            ctx.metrics
                .endpoints_writes
                .with_label_values(&[verb])
                .inc();
            debug!(%key, verb, "wrote Endpoints");
            // The cache learns our own write now, so the next reconcile compares
            // against it rather than writing again before the watch catches up.
            remember(ctx, key, written);
            Ok(())
        }
        Err(err) if api_code(&err) == Some(409) => {
            refresh_endpoints(ctx, key).await?;
            Err(Error::kube("writing endpoints", key.to_string(), err))
        }
        Err(err) if verb == "create" && is_namespace_terminating(&err) => {
            debug!(%key, "namespace is terminating; not creating Endpoints");
            Ok(())
        }
        Err(err) => {
            guard::warn_event(
                ctx,
                key,
                "FailedToUpdateEndpoint",
                &format!("Failed to {verb} endpoint {key}: {err}"),
            )
            .await;
            Err(Error::kube("writing endpoints", key.to_string(), err))
        }
    }
}

/// After a conflict, read the Endpoints live so the retry starts from fresh state
/// even when the watch is behind.
async fn refresh_endpoints(ctx: &Context, key: &ObjectKey) -> Result<()> {
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &key.namespace);
    match api.get_opt(&key.name).await {
        Ok(Some(ep)) => {
            remember(ctx, key, ep);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(err) => Err(Error::kube(
            "reading endpoints after a conflict",
            key.to_string(),
            err,
        )),
    }
}

/// Puts Endpoints just written or read live into the cache.
fn remember(ctx: &Context, key: &ObjectKey, ep: Endpoints) {
    match CachedEndpoints::new(ep) {
        Some(cached) => {
            ctx.stores.endpoints.write().restore(cached);
        }
        // Cannot happen for a decoded object; the watch brings it in anyway.
        None => warn!(%key, "Endpoints could not be encoded for the cache; waiting for the watch"),
    }
}

fn is_namespace_terminating(err: &kube::Error) -> bool {
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

/// Deletes Endpoints whose Service a live read showed gone. The precondition on
/// UID and resourceVersion makes the API refuse if the Endpoints were re-created
/// or changed since we read them.
async fn delete_endpoints(ctx: &Context, key: &ObjectKey, ep: &CachedEndpoints) -> Result<()> {
    if ctx.mode == Mode::Audit {
        ctx.metrics
            .audit_divergences
            .with_label_values(&["delete"])
            .inc();
        info!(%key, "audit: Endpoints of a deleted Service would be deleted");
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
    match api.delete(&key.name, &params).await {
        Ok(_) => {
            ctx.metrics
                .endpoints_writes
                .with_label_values(&["delete"])
                .inc();
            info!(%key, "deleted Endpoints of a Service confirmed gone");
            ctx.trigger_times.forget(key);
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
