//! The reconcile of one Service against a scripted API peer: what it reads
//! and writes, in order, for a gone Service, a 404 that is not a NotFound, a
//! conflict, a terminating namespace, a refused write and a timeout.

use crate::reconcile::kinds::CachedService;
use std::time::Duration;

use hardened_watcher::testing::{Reply, ScriptedApi};
use hardened_watcher::{ObjectKey, WatchEventKind};
use serde_json::json;

use crate::reconcile::Context;
use crate::reconcile::kinds::CachedEndpoints;
use crate::reconcile::testkit::{endpoints, event_posted, pod, scripted, service, settled};
use crate::settings::Controller;

const NS: &str = "ns";

fn web() -> ObjectKey {
    ObjectKey::new(NS, "web")
}

/// The requests to the API (Event posts aside).
fn api_requests(peer: &ScriptedApi) -> Vec<String> {
    peer.requests()
        .into_iter()
        .filter(|r| !r.contains("events.k8s.io"))
        .map(|r| {
            r.trim_end_matches(" HTTP/1.1")
                .trim_end_matches('?')
                .to_owned()
        })
        .collect()
}

fn cache_endpoints(ctx: &Context, addresses: &[(&str, &str)]) {
    let cached = CachedEndpoints::new(endpoints(NS, "web", addresses));
    if let Some(cached) = cached {
        ctx.stores
            .endpoints
            .apply_watch_event(WatchEventKind::Added, cached);
    }
}

/// Service `web` selecting pod web-0 (10.0.0.1), both cached.
fn cache_service_and_pod(ctx: &Context) {
    ctx.stores.services.apply_watch_event(
        WatchEventKind::Added,
        CachedService::new(service(NS, "web", "web")),
    );
    ctx.stores.pods.apply_watch_event(
        WatchEventKind::Added,
        pod(NS, "web-0", "web", "10.0.0.1", "3"),
    );
}

fn writes(ctx: &Context, verb: &str) -> String {
    let text = ctx.metrics.render().unwrap_or_default();
    let series = format!("endpoints_guard_endpoints_writes_total{{verb=\"{verb}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series).map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test]
async fn endpoints_of_a_service_read_gone_are_deleted_with_preconditions() {
    let success = json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}).to_string();
    let (peer, ctx) = scripted(vec![
        Reply::not_found("services", "web"),
        Reply::Body(success),
    ])
    .await;
    cache_endpoints(&ctx, &[("web-0", "10.0.0.1")]);
    let result = settled(&ctx, Controller::Endpoints, &web()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        api_requests(&peer),
        [
            "GET /api/v1/namespaces/ns/services/web",
            "DELETE /api/v1/namespaces/ns/endpoints/web",
        ]
    );
    assert_eq!(writes(&ctx, "delete"), "1");
}

#[tokio::test]
async fn a_404_that_is_not_a_not_found_of_the_service_deletes_nothing() {
    for reply in [
        Reply::Text(404, "404 page not found".into()),
        Reply::not_found("namespaces", "ns"),
        Reply::status(403, "Forbidden", "no", None),
        Reply::Hang,
    ] {
        let (peer, ctx) = scripted(vec![reply.clone()]).await;
        cache_endpoints(&ctx, &[("web-0", "10.0.0.1")]);
        let result = settled(&ctx, Controller::Endpoints, &web()).await;
        assert!(result.is_err(), "{reply:?}");
        assert_eq!(
            api_requests(&peer),
            ["GET /api/v1/namespaces/ns/services/web"],
            "{reply:?}: nothing but the read"
        );
        assert_eq!(writes(&ctx, "delete"), "0");
    }
}

#[tokio::test]
async fn a_conflict_reads_the_endpoints_again_and_fails_for_a_retry() {
    // What someone else wrote meanwhile: a newer version.
    let mut newer = endpoints(NS, "web", &[("web-0", "10.0.0.1")]);
    newer.metadata.resource_version = Some("6".into());
    let fresh = serde_json::to_string(&newer).unwrap_or_default();
    let (peer, ctx) = scripted(vec![
        Reply::status(409, "Conflict", "the object has been modified", None),
        Reply::Body(fresh),
    ])
    .await;
    cache_service_and_pod(&ctx);
    cache_endpoints(&ctx, &[]);
    let result = settled(&ctx, Controller::Endpoints, &web()).await;
    let err = result.err().map(|e| e.metric_label());
    assert_eq!(err, Some("conflict"));
    assert_eq!(
        api_requests(&peer),
        [
            "PUT /api/v1/namespaces/ns/endpoints/web",
            "GET /api/v1/namespaces/ns/endpoints/web",
        ]
    );
    // The retry starts from what the read returned: nothing left to write.
    let result = settled(&ctx, Controller::Endpoints, &web()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(api_requests(&peer).len(), 2, "no second write");
}

#[tokio::test]
async fn a_create_refused_for_a_terminating_namespace_is_dropped_quietly() {
    let terminating = Reply::status(
        403,
        "Forbidden",
        "unable to create new content in namespace ns because it is being terminated",
        Some(json!({"name": "web", "kind": "endpoints",
                    "causes": [{"reason": "NamespaceTerminating", "message": "ns is terminating"}]})),
    );
    let (peer, ctx) = scripted(vec![terminating]).await;
    cache_service_and_pod(&ctx);
    let result = settled(&ctx, Controller::Endpoints, &web()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        api_requests(&peer),
        ["POST /api/v1/namespaces/ns/endpoints"]
    );
    assert!(
        !event_posted(&peer, Duration::from_millis(300)).await,
        "no Warning Event for it"
    );
}

#[tokio::test]
async fn a_refused_or_timed_out_write_is_an_error_reported_as_an_event() {
    for (reply, label) in [
        (Reply::status(403, "Forbidden", "no", None), "forbidden"),
        (Reply::Hang, "transport"),
    ] {
        let (peer, ctx) = scripted(vec![reply]).await;
        cache_service_and_pod(&ctx);
        let result = settled(&ctx, Controller::Endpoints, &web()).await;
        assert_eq!(result.err().map(|e| e.metric_label()), Some(label));
        assert!(
            event_posted(&peer, Duration::from_secs(5)).await,
            "{label}: a FailedToUpdateEndpoint Event: {:?}",
            peer.requests()
        );
        assert_eq!(writes(&ctx, "create"), "0");
    }
}
