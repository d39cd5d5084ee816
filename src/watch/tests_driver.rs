//! The async driver against a scripted fake API server on loopback (raw
//! HTTP/1.1 over tokio, no Kubernetes): checks the requests it sends (no RV
//! on lists, resume RVs, bookmarks) and that it survives a bad object, an old
//! DELETE RV, a stream end and a 410.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::cache::{Cache, Cached, Change, ObjectKey};
use super::driver::{WatchConfig, WatchContext, run};
use super::observer::CountingObserver;

#[derive(Clone, Debug)]
struct Svc {
    key: ObjectKey,
    uid: String,
    rv: String,
}

impl Cached for Svc {
    fn key(&self) -> ObjectKey {
        self.key.clone()
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.rv
    }
}

fn project(svc: Service) -> Option<Svc> {
    let meta = svc.metadata;
    Some(Svc {
        key: ObjectKey::new(meta.namespace?, meta.name?),
        uid: meta.uid?,
        rv: meta.resource_version?,
    })
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
    let body = json!({"kind": "ServiceList", "apiVersion": "v1",
                      "metadata": {"resourceVersion": rv, "continue": cont}, "items": items});
    Reply::Body(body.to_string())
}

fn ev(kind: &str, object: Value) -> String {
    json!({"type": kind, "object": object}).to_string()
}

enum Reply {
    Body(String),
    /// An HTTP error with a Status body.
    Error(u16, String),
    /// Watch lines, then close the connection.
    Stream(Vec<String>),
    /// Headers, then keep the stream open.
    Hang,
}

async fn serve(listener: TcpListener, mut script: VecDeque<Reply>, log: Arc<Mutex<Vec<String>>>) {
    while let Ok((mut sock, _)) = listener.accept().await {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let line = String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        log.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n";
        match script.pop_front() {
            Some(Reply::Body(body)) => {
                let msg = format!("{ok}Content-Length: {}\r\n\r\n{body}", body.len());
                let _ = sock.write_all(msg.as_bytes()).await;
            }
            Some(Reply::Error(code, body)) => {
                let msg = format!(
                    "HTTP/1.1 {code} Err\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(msg.as_bytes()).await;
            }
            Some(Reply::Stream(lines)) => {
                let _ = sock.write_all(format!("{ok}\r\n").as_bytes()).await;
                for line in lines {
                    let _ = sock.write_all(format!("{line}\n").as_bytes()).await;
                }
            }
            Some(Reply::Hang) | None => {
                let _ = sock.write_all(format!("{ok}\r\n").as_bytes()).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
        let _ = sock.shutdown().await;
    }
}

#[tokio::test]
async fn driver_survives_bad_objects_old_delete_rv_stream_end_and_410() {
    let script = VecDeque::from([
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
    ]);
    let (api, log) = fake_api(script.into()).await;
    let cache = Arc::new(RwLock::new(Cache::<Svc>::new()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (synced_tx, mut synced_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let observer = Arc::new(CountingObserver::default());
    let mut config = WatchConfig::new("services");
    config.page_limit = 2;
    let ctx = WatchContext {
        config,
        cache: cache.clone(),
        changes: tx,
        observer: observer.clone(),
        synced: synced_tx,
    };
    let task = tokio::spawn(run(api, project, ctx, stop_rx));

    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        let _ = synced_rx.wait_for(|s| *s).await;
        // Wait until the final watch (from the relist's RV) is open.
        loop {
            let watching = log
                .lock()
                .map(|l| l.iter().any(|r| r.contains("resourceVersion=300")))
                .unwrap_or(false);
            if watching {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "driver did not get through the script; requests: {:?}",
        log.lock().map(|l| l.clone())
    );
    let _ = stop_tx.send(true);
    let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "run must stop cleanly on shutdown"
    );

    let requests = log.lock().map(|l| l.clone()).unwrap_or_default();
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

    let cache = cache
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut names: Vec<_> = cache.iter().map(|s| s.key.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["a", "c"]);
    assert!(cache.tombstone(&ObjectKey::new("ns", "b")).is_some());
    let mut candidates = Vec::new();
    while let Ok(change) = rx.try_recv() {
        if let Change::DeletionCandidate(s) = change {
            candidates.push(s.key.name.clone());
        }
    }
    assert_eq!(candidates, ["b"]);
    let counts = observer.snapshot();
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    assert_eq!(get("services/undecodable"), 2, "{counts:?}");
    assert_eq!(get("services/rv_regression"), 1, "{counts:?}");
    assert_eq!(get("services/restart/stream_ended"), 1, "{counts:?}");
    assert_eq!(get("services/restart/expired"), 1, "{counts:?}");
    assert_eq!(get("services/relist"), 2, "{counts:?}");
    assert_eq!(get("services/synced/true"), 1, "{counts:?}");
}

async fn fake_api(script: Vec<Reply>) -> (Api<Service>, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|err| panic!("bind: {err}"));
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let log = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, script.into(), log.clone()));
    let url = format!("http://{addr}")
        .parse()
        .unwrap_or_else(|err| panic!("url: {err}"));
    let client = kube::Client::try_from(kube::Config::new(url))
        .unwrap_or_else(|err| panic!("client: {err}"));
    (Api::all(client), log)
}

fn expired() -> Reply {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                        "reason": "Expired", "message": "The provided continue parameter is too old"});
    Reply::Error(410, status.to_string())
}

#[tokio::test]
async fn list_consistent_restarts_when_the_continue_token_expires() {
    let (api, log) = fake_api(vec![
        list(vec![svc("a", "100")], "200", Some("c1")),
        expired(),
        list(vec![svc("a", "100")], "300", Some("c2")),
        list(vec![svc("b", "150")], "300", None),
    ])
    .await;
    let listed = super::list::list_consistent(&api, 1).await;
    let Ok((items, rv)) = listed else {
        panic!("list failed: {listed:?}")
    };
    let names: Vec<_> = items
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names, ["a", "b"], "the first attempt's page is discarded");
    assert_eq!(rv, "300");
    let requests = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(
        requests.iter().all(|r| !r.contains("resourceVersion")),
        "{requests:?}"
    );
    assert!(
        !requests[2].contains("continue="),
        "restarted from scratch: {requests:?}"
    );
}

#[tokio::test]
async fn list_consistent_is_strict_and_list_snapshot_tolerant_about_bad_items() {
    let page = || list(vec![svc("a", "100"), bad_svc("bad", "110")], "200", None);
    let (api, _) = fake_api(vec![page(), page()]).await;
    let strict = super::list::list_consistent(&api, 500).await;
    assert!(
        matches!(
            strict,
            Err(super::error::WatchError::Undecodable { count: 1, .. })
        ),
        "{strict:?}"
    );
    let tolerant = super::list::list_snapshot(&api, 500, project).await;
    let Ok(snapshot) = tolerant else {
        panic!("{tolerant:?}")
    };
    assert_eq!(snapshot.items.len(), 1);
    assert!(snapshot.unknown.contains(&ObjectKey::new("ns", "bad")));
    assert!(snapshot.complete);
}

/// `run` must be spawnable on a multi-threaded runtime.
fn _run_future_is_send(api: Api<Service>, ctx: WatchContext<Svc>, stop: watch::Receiver<bool>) {
    fn assert_send<F: Send>(_: F) {}
    assert_send(run(api, project, ctx, stop));
}
