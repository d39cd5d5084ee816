//! The event stream on the scripted peer: the `Init` sequence once the cache
//! is synced, `Apply` for changes, and deletion candidates settled by a GET
//! before anything is said about them.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use crate::driver::Watcher;
use crate::object::{Cached, ObjectKey};
use crate::testing::{Reply, ScriptedApi, event};

fn svc(name: &str, rv: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": rv}})
}

/// What an event says, in a line: kind, name, resourceVersion.
fn describe(event: &Event<Service>) -> String {
    let of = |svc: &Service| {
        format!(
            "{} {}",
            svc.metadata.name.as_deref().unwrap_or(""),
            svc.metadata.resource_version.as_deref().unwrap_or("")
        )
    };
    match event {
        Event::Init => "Init".to_owned(),
        Event::InitApply(svc) => format!("InitApply {}", of(svc)),
        Event::InitDone => "InitDone".to_owned(),
        Event::Apply(svc) => format!("Apply {}", of(svc)),
        Event::Delete(svc) => format!("Delete {}", of(svc)),
    }
}

async fn next_events(
    events: &mut (impl Stream<Item = Result<Event<Service>, kube::runtime::watcher::Error>> + Unpin),
    count: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    while seen.len() < count {
        match tokio::time::timeout(Duration::from_secs(20), events.next()).await {
            Ok(Some(Ok(event))) => seen.push(describe(&event)),
            Ok(Some(Err(err))) => panic!("the stream yields no errors: {err}"),
            Ok(None) => panic!("the stream ended after {seen:?}"),
            Err(_) => panic!("no event in time after {seen:?}"),
        }
    }
    seen
}

/// A list of a (rv 5) and b (rv 6) at rv 10, then a watch that modifies a
/// and deletes b; GETs of b answer `read_b`.
async fn scripted(read_b: Reply) -> ScriptedApi {
    let peer = ScriptedApi::start(vec![
        Reply::list(
            "ServiceList",
            vec![svc("a", "5"), svc("b", "6")],
            "10",
            None,
        ),
        Reply::Stream(vec![
            event("MODIFIED", svc("a", "11")),
            event("DELETED", svc("b", "12")),
        ]),
    ])
    .await
    .unwrap_or_else(|err| panic!("scripted peer: {err}"));
    peer.route("GET", "/api/v1/namespaces/ns/services/b", read_b);
    peer
}

#[tokio::test]
async fn a_deletion_is_told_once_a_read_finds_it_gone() {
    let peer = scripted(Reply::not_found("services", "b")).await;
    let watcher = Watcher::builder(Api::<Service>::all(peer.client(Duration::from_secs(30))))
        .resource("services")
        .build();
    let store = watcher.store();
    let mut events = Box::pin(watcher.into_event_stream());
    assert_eq!(
        next_events(&mut events, 6).await,
        [
            "Init",
            "InitApply a 5",
            "InitApply b 6",
            "InitDone",
            "Apply a 11",
            "Delete b 12"
        ]
    );
    let b = ObjectKey::new("ns", "b");
    assert!(
        peer.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/ns/services/b")),
        "the candidate was read: {:?}",
        peer.requests()
    );
    assert!(store.get(&b).is_none());
    assert!(
        store.read().tombstone(&b).is_none(),
        "the deletion is confirmed in the store"
    );
}

#[tokio::test]
async fn a_deletion_a_read_disproves_is_told_as_an_apply() {
    let peer = scripted(Reply::Body(svc("b", "13").to_string())).await;
    let watcher = Watcher::builder(Api::<Service>::all(peer.client(Duration::from_secs(30))))
        .resource("services")
        .build();
    let store = watcher.store();
    let mut events = Box::pin(watcher.into_event_stream());
    let seen = next_events(&mut events, 6).await;
    assert_eq!(seen[4..], ["Apply a 11", "Apply b 13"]);
    let b = store.get(&ObjectKey::new("ns", "b"));
    assert_eq!(
        b.map(|b| b.resource_version().to_owned()).as_deref(),
        Some("13")
    );
}

#[tokio::test]
async fn a_cache_that_starts_over_begins_a_new_sequence() {
    let peer = ScriptedApi::start(vec![
        Reply::list(
            "ServiceList",
            vec![svc("a", "5"), svc("b", "6")],
            "10",
            None,
        ),
        Reply::Hang,
        // The relist after the store was found rewound: b is missing.
        Reply::list("ServiceList", vec![svc("a", "5")], "20", None),
    ])
    .await
    .unwrap_or_else(|err| panic!("scripted peer: {err}"));
    peer.route(
        "GET",
        "/api/v1/namespaces/ns/services/b",
        Reply::not_found("services", "b"),
    );
    let watcher = Watcher::builder(Api::<Service>::all(peer.client(Duration::from_secs(30))))
        .resource("services")
        .build();
    let store = watcher.store();
    let mut events = Box::pin(watcher.into_event_stream());
    assert_eq!(
        next_events(&mut events, 4).await,
        ["Init", "InitApply a 5", "InitApply b 6", "InitDone"]
    );
    store.start_over();
    // b, a deletion candidate when the sequence begins, is still listed (a
    // reflector would otherwise drop it unread), then read and deleted.
    assert_eq!(
        next_events(&mut events, 5).await,
        [
            "Init",
            "InitApply a 5",
            "InitApply b 6",
            "InitDone",
            "Delete b 6"
        ]
    );
}
