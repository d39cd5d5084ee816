//! The async driver against a scripted peer on loopback (raw HTTP/1.1 over
//! tokio, no Kubernetes: it only feeds bytes to the decoder): checks the
//! requests it sends (no RV on lists, resume RVs, bookmarks, live reads)
//! and that it survives a bad object, an old DELETE RV, a stream end, a 410,
//! an expired continue token, and settles a disputed list item by a GET.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::count::CountCheck;
use crate::driver::Watcher;
use crate::object::{Change, Identity, ObjectKey};
use crate::observer::CountingObserver;
use crate::selectors::Selectors;
use crate::store::Store;
use crate::testing::{Reply, ScriptedApi, event as ev};

type Svc = Identity;

fn project(svc: Service) -> Option<Svc> {
    Identity::of(&svc)
}

fn svc(name: &str, rv: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": rv},
           "spec": {"ports": [{"port": 80}]}})
}

fn bad_svc(name: &str, rv: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": rv},
           "spec": {"ports": "eighty"}})
}

fn list(items: Vec<Value>, rv: &str, cont: Option<&str>) -> Reply {
    Reply::list("ServiceList", items, rv, cont)
}

/// A running driver on the scripted peer.
struct Running {
    store: Store<Svc>,
    delivered: Arc<Mutex<Vec<Change<Svc>>>>,
    observer: Arc<CountingObserver>,
    peer: ScriptedApi,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), crate::error::WatchError>>,
}

impl Running {
    async fn start(script: Vec<Reply>, page_limit: u32) -> Self {
        Self::start_with(script, page_limit, &Selectors::default()).await
    }

    async fn start_with(script: Vec<Reply>, page_limit: u32, selectors: &Selectors) -> Self {
        let peer = ScriptedApi::start(script)
            .await
            .unwrap_or_else(|err| panic!("scripted peer: {err}"));
        let api: Api<Service> = Api::all(peer.client(Duration::from_secs(30)));
        let store = Store::new("services");
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let sink_log = delivered.clone();
        let sink = move |change: &Change<Svc>, _arrived| {
            sink_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(change.clone());
        };
        let observer = Arc::new(CountingObserver::default());
        let (stop, stop_rx) = watch::channel(false);
        let mut builder = Watcher::builder(api)
            .project(project)
            .store(store.clone())
            .on_change(sink)
            .observer(observer.clone())
            .page_limit(page_limit);
        if let Some(labels) = &selectors.labels {
            builder = builder.labels(labels);
        }
        if let Some(fields) = &selectors.fields {
            builder = builder.fields(fields);
        }
        let task = tokio::spawn(builder.build().run(stop_rx));
        Self {
            store,
            delivered,
            observer,
            peer,
            stop,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.peer.requests()
    }

    /// Waits until a request containing `needle` was made.
    async fn wait_for_request(&self, needle: &str) {
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            while !self.requests().iter().any(|r| r.contains(needle)) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "no request with {needle:?}; requests: {:?}",
            self.requests()
        );
    }

    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(true);
        let ended = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(())))),
            "run must stop cleanly on shutdown"
        );
        self.peer.requests()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<_> = self
            .store
            .read()
            .iter()
            .map(|s| s.key.name.clone())
            .collect();
        names.sort();
        names
    }

    fn candidates(&self) -> Vec<String> {
        self.delivered
            .lock()
            .map(|d| {
                d.iter()
                    .filter_map(|c| match c {
                        Change::DeletionCandidate(s) => Some(s.key.name.clone()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn driver_survives_bad_objects_old_delete_rv_stream_end_and_410() {
    let script = vec![
        list(vec![svc("a", "100"), svc("b", "110")], "200", Some("c1")),
        list(vec![svc("c", "120"), bad_svc("bad", "130")], "200", None),
        Reply::Stream(vec![
            ev("MODIFIED", svc("a", "210")),
            ev("ADDED", bad_svc("bad2", "220")),
            json!({"type": "BOOKMARK", "object": {"kind": "Service", "apiVersion": "v1",
                   "metadata": {"resourceVersion": "260"}}})
            .to_string(),
            // Pre-#58547 DELETE: carries b's old RV.
            ev("DELETED", svc("b", "110")),
        ]),
        Reply::Stream(vec![ev(
            "ERROR",
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                   "reason": "Expired", "message": "too old resource version: 260 (280)"}),
        )]),
        list(vec![svc("a", "210"), svc("c", "120")], "300", None),
        Reply::Hang,
    ];
    let running = Running::start(script, 2).await;
    // Wait until the final watch (from the relist's RV) is open.
    running.wait_for_request("resourceVersion=300").await;
    assert!(running.store.is_synced());
    let names = running.names();
    let candidates = running.candidates();
    let counts = running.observer.snapshot();
    let tombstones = running.store.read().tombstone_count();
    let requests = running.stop().await;

    let lists: Vec<_> = requests
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .collect();
    let watches: Vec<_> = requests
        .iter()
        .filter(|r| r.contains("watch=true"))
        .collect();
    assert_eq!(lists.len(), 3, "{requests:?}");
    for list in &lists {
        assert!(
            !list.contains("resourceVersion"),
            "lists are consistent reads: {list}"
        );
        assert!(list.contains("limit=2"), "{list}");
    }
    assert!(lists[1].contains("continue=c1"));
    for (watch, rv) in watches.iter().zip(["200", "260", "300"]) {
        // Resumes from the highest RV (bookmark 260), not b's old DELETE RV 110.
        assert!(watch.contains(&format!("resourceVersion={rv} ")), "{watch}");
        assert!(watch.contains("allowWatchBookmarks=true"), "{watch}");
    }
    assert_eq!(watches.len(), 3, "{requests:?}");

    assert_eq!(names, ["a", "c"]);
    assert_eq!(candidates, ["b"]);
    assert_eq!(tombstones, 0, "the relist proved b gone: released");
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    assert_eq!(get("services/undecodable"), 2, "{counts:?}");
    assert_eq!(get("services/rv_regression"), 1, "{counts:?}");
    assert_eq!(get("services/restart/stream_ended"), 1, "{counts:?}");
    assert_eq!(get("services/restart/expired"), 1, "{counts:?}");
    assert_eq!(get("services/relist"), 2, "{counts:?}");
    assert_eq!(get("services/synced/true"), 1, "{counts:?}");
}

fn expired() -> Reply {
    Reply::status(
        410,
        "Expired",
        "The provided continue parameter is too old",
        None,
    )
}

#[tokio::test]
async fn an_expired_continue_token_restarts_the_list_from_scratch() {
    let running = Running::start(
        vec![
            list(vec![svc("a", "100")], "200", Some("c1")),
            expired(),
            list(vec![svc("a", "100")], "300", Some("c2")),
            list(vec![svc("b", "150")], "300", None),
            Reply::Hang,
        ],
        1,
    )
    .await;
    running.wait_for_request("resourceVersion=300").await;
    assert_eq!(running.names(), ["a", "b"]);
    assert!(running.candidates().is_empty());
    let counts = running.observer.snapshot();
    let requests = running.stop().await;
    assert!(
        requests
            .iter()
            .filter(|r| !r.contains("watch=true"))
            .all(|r| !r.contains("resourceVersion")),
        "{requests:?}"
    );
    assert!(
        !requests[2].contains("continue="),
        "restarted from scratch: {requests:?}"
    );
    assert_eq!(
        counts.get("services/restart/continue_expired").copied(),
        Some(1),
        "{counts:?}"
    );
}

/// A relist shows `a` at an RV below the one the watch delivered: a disputed
/// item. The driver reads it by GET; a NotFound for `a` settles it as a
/// ghost (evicted, counted), a bare text 404 settles nothing.
/// A script in which a relist (after a 410) lists `a` at an older RV than
/// the watch brought it to: disputed, so `a` is read live, and `answer` is
/// what that read gets; then a watch that stays open.
fn disputed_after_a_relist(answer: Reply) -> Vec<Reply> {
    vec![
        list(vec![svc("a", "100")], "200", None),
        Reply::Stream(vec![
            ev("MODIFIED", svc("a", "500")),
            ev(
                "ERROR",
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "code": 410, "reason": "Expired"}),
            ),
        ]),
        list(vec![svc("a", "100")], "900", None),
        answer,
        Reply::Hang,
    ]
}

#[tokio::test]
async fn a_disputed_item_is_read_live_and_only_a_not_found_status_is_gone() {
    for (answer, gone) in [
        (Reply::not_found("services", "a"), true),
        (Reply::Text(404, "404 page not found".into()), false),
    ] {
        let running = Running::start(disputed_after_a_relist(answer), 500).await;
        running.wait_for_request("resourceVersion=900").await;
        let requests = running.requests();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("GET /api/v1/namespaces/ns/services/a ")),
            "{requests:?}"
        );
        let cached = running.store.get(&ObjectKey::new("ns", "a"));
        let ghosts = running.observer.get("services/ghost");
        running.stop().await;
        if gone {
            assert!(cached.is_none(), "a ghost leaves the cache");
            assert_eq!(ghosts, 1);
        } else {
            assert_eq!(
                cached.map(|a| a.resource_version.clone()).as_deref(),
                Some("500")
            );
            assert_eq!(ghosts, 0, "a bare 404 proves nothing");
        }
    }
}

/// `run` must be spawnable on a multi-threaded runtime.
fn _run_future_is_send(
    api: Api<Service>,
    store: Store<Svc>,
    sink: impl Fn(&Change<Svc>, std::time::Instant) + Send + Sync + 'static,
    observer: Arc<CountingObserver>,
    stop: watch::Receiver<bool>,
) {
    fn assert_send<F: Send>(_: F) {}
    assert_send(
        Watcher::builder(api)
            .project(project)
            .store(store)
            .on_change(sink)
            .observer(observer)
            .build()
            .run(stop),
    );
}

/// A half-open watch is found by its silence: within two and a half
/// bookmark periods from the first watch on, as kube-apiserver sends
/// bookmarks on every watch from its cache; past the timeout and a grace
/// once two watches in a row went silent with no bookmark ever seen.
#[test]
fn a_watch_is_dead_after_150_s_of_silence_unless_the_server_sends_no_bookmarks() {
    use crate::driver::Bookmarks;
    let mut bookmarks = Bookmarks::default();
    assert_eq!(bookmarks.idle_limit(290), Duration::from_secs(150));
    assert_eq!(bookmarks.idle_limit(60), Duration::from_secs(90));
    bookmarks.on_silent_watch();
    assert_eq!(bookmarks.idle_limit(290), Duration::from_secs(150));
    bookmarks.on_silent_watch();
    assert_eq!(bookmarks.idle_limit(290), Duration::from_secs(320));
    // One bookmark, and silence means death again, however long after.
    bookmarks.on_bookmark();
    bookmarks.on_silent_watch();
    bookmarks.on_silent_watch();
    bookmarks.on_silent_watch();
    assert_eq!(bookmarks.idle_limit(290), Duration::from_secs(150));
}

/// A one-item list answer counting `total` objects at `rv`.
fn counted(total: u64, rv: &str) -> Reply {
    Reply::Body(
        json!({"kind": "ServiceList", "apiVersion": "v1",
               "metadata": {"resourceVersion": rv, "continue": "more", "remainingItemCount": total - 1},
               "items": [svc("a", "100")]})
        .to_string(),
    )
}

#[tokio::test]
async fn a_count_check_lists_one_item_at_the_stores_resourceversion_and_keeps_the_watch() {
    let probe = |rv: &str| list(vec![svc("a", "100")], rv, Some("more"));
    let script = vec![
        // One object it cannot decode: the store holds it, the cache cannot.
        list(
            vec![svc("a", "100"), svc("b", "110"), bad_svc("bad", "120")],
            "200",
            None,
        ),
        Reply::Hang,
        // The cache's two objects and the one it skipped, then one more (an
        // ADD the watch has not delivered, or lost), then an error.
        probe("230"),
        counted(3, "230"),
        probe("240"),
        counted(4, "240"),
        probe("250"),
        Reply::status(410, "Expired", "too old resource version", None),
    ];
    let running = Running::start(script, 500).await;
    running.wait_for_request("watch=true").await;
    let first = running.store.count_check().await;
    let second = running.store.count_check().await;
    let third = running.store.count_check().await;
    let requests = running.stop().await;
    assert_eq!(first.ok(), Some(CountCheck::Matches));
    assert_eq!(
        second.ok(),
        Some(CountCheck::Differs {
            rv: "240".into(),
            cached: 3,
            listed: 4
        })
    );
    assert!(
        matches!(&third, Ok(CountCheck::Unknown(why)) if why.contains("250")),
        "{third:?}"
    );
    let checks: Vec<_> = requests.iter().filter(|r| r.contains("limit=1")).collect();
    assert_eq!(checks.len(), 6, "{requests:?}");
    for (pair, rv) in checks.chunks(2).zip(["230", "240", "250"]) {
        assert!(
            !pair[0].contains("resourceVersion"),
            "the probe is consistent: {}",
            pair[0]
        );
        assert!(
            pair[1].contains(&format!("resourceVersion={rv}"))
                && pair[1].contains("resourceVersionMatch=Exact"),
            "{}",
            pair[1]
        );
    }
    // One watch for the whole test: the checks did not close it.
    let watches = requests.iter().filter(|r| r.contains("watch=true")).count();
    assert_eq!(watches, 1, "{requests:?}");
}

#[tokio::test]
async fn a_resync_lists_beside_the_open_watch() {
    let script = vec![
        list(vec![svc("a", "100"), svc("ghost", "110")], "200", None),
        Reply::Hang,
        // The probe, then two pages at exactly its revision: the ghost's
        // DELETE never reached the watch.
        list(vec![svc("a", "100")], "300", Some("more")),
        list(vec![svc("a", "100")], "300", Some("c1")),
        list(vec![], "300", None),
    ];
    let running = Running::start(script, 1).await;
    running.wait_for_request("watch=true").await;
    let report = running.store.resync().await;
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(running.candidates(), vec!["ghost".to_string()]);
    let requests = running.stop().await;
    let lists: Vec<_> = requests
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .collect();
    assert_eq!(lists.len(), 4, "{requests:?}");
    assert!(
        lists[2].contains("resourceVersion=300") && lists[2].contains("resourceVersionMatch=Exact"),
        "{}",
        lists[2]
    );
    assert!(lists[3].contains("continue=c1"), "{}", lists[3]);
    // One watch for the whole test: the resync did not close it.
    let watches = requests.iter().filter(|r| r.contains("watch=true")).count();
    assert_eq!(watches, 1, "{requests:?}");
}

#[tokio::test]
async fn selectors_go_with_every_list_watch_and_live_read() {
    let selectors = Selectors {
        labels: Some("app=web".into()),
        fields: Some("spec.type=ClusterIP".into()),
    };
    let running = Running::start_with(
        // The live read lists the one object through the selectors, which
        // it no longer matches.
        disputed_after_a_relist(list(vec![], "900", None)),
        500,
        &selectors,
    )
    .await;
    running.wait_for_request("resourceVersion=900").await;
    let cached = running.store.get(&ObjectKey::new("ns", "a"));
    let requests = running.stop().await;
    let selected =
        |r: &String| r.contains("labelSelector=app%3Dweb") && r.contains("spec.type%3DClusterIP");
    assert_eq!(requests.len(), 5, "{requests:?}");
    for request in &requests {
        assert!(selected(request), "{request}");
    }
    assert!(
        requests[3].starts_with("GET /api/v1/namespaces/ns/services?")
            && requests[3].contains("fieldSelector=metadata.name%3Da%2Cspec.type%3DClusterIP"),
        "the live read lists the one object through the selectors: {}",
        requests[3]
    );
    assert!(cached.is_none(), "no longer selected: gone from this cache");
}
