//! The deletion guard against a scripted API peer: only a NotFound Status
//! naming the object is "gone"; a bare 404, a 403 or a timeout is an error
//! that deletes and confirms nothing; an object found is restored and the
//! prevention counted.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hardened_watcher::testing::Reply;
use hardened_watcher::{ObjectKey, WatchEventKind};
use serde_json::json;

use super::{
    DeletionSource, MAX_NOTE_BYTES, STALE_OPT_OUT, STALE_TAKEOVER, hold_unconfirmed_pod_deletions,
    prevention_reason, read_service, truncate_note,
};
use crate::desired::PodInfo;
use crate::error::Result;
use crate::reconcile::Context;
use crate::reconcile::decide::Read;
use crate::reconcile::effects::{Effects, Outcome};
use crate::reconcile::kinds::CachedService;
use crate::reconcile::kinds::pod_target_refs;
use crate::reconcile::publish::{Action, Job};
use crate::reconcile::testkit::{endpoints, event_posted, pod, scripted, service, untimed};
use crate::settings::Controller;

const NS: &str = "ns";

fn metric(ctx: &Context, series: &str) -> f64 {
    let text = ctx.metrics.render().unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// Service `web` cached, then deleted by a watch event: a tombstone.
fn tombstoned_web(ctx: &Context) {
    let services = &ctx.stores.services;
    services.apply_watch_event(
        WatchEventKind::Added,
        CachedService::new(service(NS, "web", "web")),
    );
    let mut deleted = service(NS, "web", "web");
    deleted.metadata.resource_version = Some("2".into());
    services.apply_watch_event(WatchEventKind::Deleted, CachedService::new(deleted));
}

fn web() -> ObjectKey {
    ObjectKey::new(NS, "web")
}

/// The Endpoints controller's live read of Service `web`, missing from the
/// cache, its effects settled as the worker settles them.
async fn read_web(ctx: &Context) -> Result<Option<Arc<CachedService>>> {
    let (controller, key, timer) = (Controller::Endpoints, web(), untimed(ctx));
    let effects = Effects::default();
    let job = Job {
        ctx,
        controller,
        key: &key,
        timer: &timer,
        effects: &effects,
    };
    let found = read_service(&job, Read::ServiceMissing).await;
    Outcome::new(Ok(Action::Done), effects).settle(ctx, controller, &key)?;
    found
}

fn bare_404() -> Reply {
    Reply::Text(404, "404 page not found".into())
}

fn forbidden() -> Reply {
    Reply::status(403, "Forbidden", "services \"web\" is forbidden", None)
}

#[tokio::test]
async fn a_not_found_status_naming_the_service_is_gone_and_confirms_the_tombstone() {
    let (peer, ctx) = scripted(vec![Reply::not_found("services", "web")]).await;
    tombstoned_web(&ctx);
    let found = read_web(&ctx).await;
    assert!(matches!(found, Ok(None)));
    assert!(
        ctx.stores
            .services
            .with_cache(|cache| cache.tombstone(&web()).is_none())
    );
    assert_eq!(
        peer.requests()[0],
        "GET /api/v1/namespaces/ns/services/web HTTP/1.1"
    );
}

#[tokio::test]
async fn a_service_found_is_restored_and_the_prevention_counted() {
    let live = serde_json::to_string(&service(NS, "web", "web")).unwrap_or_default();
    let (peer, ctx) = scripted(vec![Reply::Body(live)]).await;
    tombstoned_web(&ctx);
    let found = read_web(&ctx).await;
    assert!(matches!(found, Ok(Some(_))));
    assert!(ctx.stores.services.get(&web()).is_some(), "cache repaired");
    assert_eq!(
        metric(
            &ctx,
            "endpoints_guard_spurious_deletions_prevented_total{controller=\"endpoints\",reason=\"watch_delete\"}"
        ),
        1.0
    );
    assert!(
        event_posted(&peer, Duration::from_secs(5)).await,
        "a Warning Event: {:?}",
        peer.requests()
    );
}

#[tokio::test]
async fn a_bare_404_a_403_or_a_timeout_is_an_error_that_confirms_nothing() {
    for (case, reply) in [
        ("bare 404", bare_404()),
        ("403", forbidden()),
        ("timeout", Reply::Hang),
        (
            "NotFound for another Service",
            Reply::not_found("services", "other"),
        ),
    ] {
        let (_peer, ctx) = scripted(vec![reply]).await;
        tombstoned_web(&ctx);
        let found = read_web(&ctx).await;
        assert!(found.is_err(), "{case}: {:?}", found.map(|_| ()));
        assert!(
            ctx.stores
                .services
                .with_cache(|cache| cache.tombstone(&web()).is_some()),
            "{case}: the tombstone stays"
        );
    }
}

/// Pods a-0 (cached) and a-1 (its DELETE seen), both in the Endpoints.
fn pods_with_a_deleted_one(ctx: &Context) -> Vec<Arc<PodInfo>> {
    let cache = &ctx.stores.pods;
    cache.apply_watch_event(WatchEventKind::Added, pod(NS, "a-0", "a", "10.0.0.1", "1"));
    cache.apply_watch_event(WatchEventKind::Added, pod(NS, "a-1", "a", "10.0.0.2", "2"));
    cache.apply_watch_event(
        WatchEventKind::Deleted,
        pod(NS, "a-1", "a", "10.0.0.2", "3"),
    );
    cache.get(&ObjectKey::new(NS, "a-0")).into_iter().collect()
}

fn pod_json(name: &str, uid: &str) -> String {
    json!({
        "metadata": {"namespace": NS, "name": name, "uid": uid, "resourceVersion": "9",
                     "labels": {"app": "a"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
    .to_string()
}

async fn hold(reply: Reply) -> (Context, Result<Vec<String>, crate::error::Error>) {
    let (_peer, ctx) = scripted(vec![reply]).await;
    let mut pods = pods_with_a_deleted_one(&ctx);
    let current = endpoints(NS, "a", &[("a-0", "10.0.0.1"), ("a-1", "10.0.0.2")]);
    let selector = BTreeMap::from([("app".to_string(), "a".to_string())]);
    let result = hold_unconfirmed_pod_deletions(
        &ctx,
        Controller::Endpoints,
        NS,
        pod_target_refs(&current),
        &selector,
        &mut pods,
    )
    .await
    .map(|()| pods.iter().map(|p| p.name().to_owned()).collect());
    (ctx, result)
}

#[tokio::test]
async fn a_pod_read_gone_is_confirmed_and_its_address_goes() {
    let (ctx, pods) = hold(Reply::not_found("pods", "a-1")).await;
    assert_eq!(pods.ok(), Some(vec!["a-0".to_owned()]));
    assert!(
        ctx.stores
            .pods
            .with_cache(|pods| pods.tombstone(&ObjectKey::new(NS, "a-1")).is_none())
    );
    assert_eq!(
        metric(
            &ctx,
            "endpoints_guard_pod_deletions_held_total{controller=\"endpoints\"}"
        ),
        0.0
    );
}

#[tokio::test]
async fn a_pod_still_there_is_held_and_one_replaced_by_another_incarnation_goes() {
    let (ctx, pods) = hold(Reply::Body(pod_json("a-1", "a-1-uid"))).await;
    assert_eq!(pods.ok(), Some(vec!["a-0".to_owned(), "a-1".to_owned()]));
    assert_eq!(
        metric(
            &ctx,
            "endpoints_guard_pod_deletions_held_total{controller=\"endpoints\"}"
        ),
        1.0
    );
    assert!(ctx.stores.pods.get(&ObjectKey::new(NS, "a-1")).is_some());

    let (ctx, pods) = hold(Reply::Body(pod_json("a-1", "another-uid"))).await;
    assert_eq!(pods.ok(), Some(vec!["a-0".to_owned()]));
    assert!(
        ctx.stores
            .pods
            .with_cache(|pods| pods.tombstone(&ObjectKey::new(NS, "a-1")).is_none())
    );
}

#[tokio::test]
async fn a_pod_read_that_fails_keeps_its_tombstone() {
    for (case, reply) in [
        ("bare 404", bare_404()),
        ("403", Reply::status(403, "Forbidden", "no", None)),
        ("timeout", Reply::Hang),
    ] {
        let (ctx, pods) = hold(reply).await;
        assert!(pods.is_err(), "{case}");
        let tomb = ctx.stores.pods.with_cache(|pods| {
            pods.tombstone(&ObjectKey::new(NS, "a-1"))
                .map(|t| t.last_known.uid().to_owned())
        });
        assert_eq!(tomb.as_deref(), Some("a-1-uid"), "{case}");
    }
}

#[test]
fn prevention_reasons_are_all_listed() {
    let produced: HashSet<_> = DeletionSource::ALL
        .iter()
        .map(|s| prevention_reason(Some(*s)))
        .chain([prevention_reason(None), STALE_OPT_OUT, STALE_TAKEOVER])
        .collect();
    let listed: HashSet<_> = crate::metrics::prevention::ALL.iter().copied().collect();
    assert_eq!(produced, listed);
    assert_eq!(listed.len(), crate::metrics::prevention::ALL.len());
}

#[test]
fn notes_fit_the_api_limit_on_a_char_boundary() {
    assert_eq!(truncate_note("short".into()), "short");
    let cut = truncate_note("é".repeat(800));
    assert!(cut.len() <= MAX_NOTE_BYTES);
    assert!(cut.ends_with("..."));
}
