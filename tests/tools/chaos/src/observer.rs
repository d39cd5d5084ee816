//! The independent watches that count spurious Endpoints deletions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::task::JoinHandle;

use super::Published;
use super::slice_observer::{self, History};

#[derive(Debug, Clone)]
struct Seen {
    kind: &'static str,
    key: String,
    /// Which store the RV belongs to: 0 until the first etcd restore, then
    /// one more per restore ([`Observer::store_restored`]). RVs are only
    /// compared within an epoch.
    epoch: u64,
    rv: u64,
    /// Learnt from a relist rather than an event: it happened after this RV
    /// (where the watch had got to) and at or before `rv` (the list's).
    relisted_since: Option<u64>,
}

/// Watches one namespace directly against kube-apiserver and records every
/// change with its resourceVersion: Services and Endpoints, or (for
/// EndpointSlices) Services, pods and slices.
pub struct Observer {
    client: Client,
    namespace: String,
    published: Published,
    slices: Arc<Mutex<History>>,
    services: Arc<Mutex<Vec<Seen>>>,
    endpoints: Arc<Mutex<Vec<Seen>>>,
    epoch: u64,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn rv_of<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// One change a direct watch saw: `obj` is `None` for a deletion found by a
/// relist (the object is gone, only its name is known).
pub(super) struct Change<K> {
    pub kind: &'static str,
    pub name: String,
    pub rv: u64,
    /// Learnt from a relist rather than an event: it happened after this RV
    /// (where the watch had got to before it broke) and at or before `rv`
    /// (the list's). A judgement at an RV inside that window cannot tell
    /// whether the change had happened yet.
    pub relisted_since: Option<u64>,
    pub obj: Option<K>,
}

/// Lists, then watches `api` for good, relisting after a watch error; hands
/// every ADDED, MODIFIED and DELETED to `sink` with its resourceVersion (a
/// relist's differences carry the list's RV).
pub(super) async fn observe<K>(api: Api<K>, mut sink: impl FnMut(Change<K>) + Send)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    // name → (uid, resourceVersion) of what is live as far as we know.
    let mut live: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut first = true;
    // The RV the last watch had got to: a relist's differences happened after it.
    let mut reached: u64 = 0;
    loop {
        let Ok(list) = api.list(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let list_rv: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let now: BTreeMap<String, (String, String)> = list
            .items
            .iter()
            .map(|o| {
                (
                    o.name_any(),
                    (
                        o.uid().unwrap_or_default(),
                        o.resource_version().unwrap_or_default(),
                    ),
                )
            })
            .collect();
        for (name, (uid, _)) in &live {
            if now.get(name).map(|(u, _)| u) != Some(uid) && !first {
                sink(Change {
                    kind: "DELETED",
                    name: name.clone(),
                    rv: list_rv,
                    relisted_since: Some(reached),
                    obj: None,
                });
            }
        }
        for obj in list.items {
            let name = obj.name_any();
            // A new incarnation is an ADDED; the same one at another RV
            // changed while the watch was down (a Service's selector, a
            // pod's readiness): a MODIFIED, or the slice judgement would go
            // on with what it was before.
            let kind = match live.get(&name) {
                Some((uid, _)) if Some(uid.as_str()) != obj.uid().as_deref() => "ADDED",
                None => "ADDED",
                Some((_, rv)) if Some(rv.as_str()) != obj.resource_version().as_deref() => {
                    "MODIFIED"
                }
                Some(_) => continue,
            };
            sink(Change {
                kind,
                name,
                rv: if first { 0 } else { list_rv },
                relisted_since: (!first).then_some(reached),
                obj: Some(obj),
            });
        }
        first = false;
        live = now;
        let mut rv = list_rv.to_string();
        loop {
            let params = WatchParams::default().timeout(290);
            let Ok(stream) = api.watch(&params, &rv).await else {
                reached = rv.parse().unwrap_or(list_rv);
                break;
            };
            let mut stream = stream.boxed();
            let mut relist = false;
            while let Ok(Some(event)) = stream.try_next().await {
                let (kind, obj) = match event {
                    WatchEvent::Added(o) => ("ADDED", o),
                    WatchEvent::Modified(o) => ("MODIFIED", o),
                    WatchEvent::Deleted(o) => ("DELETED", o),
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(_) => {
                        relist = true;
                        break;
                    }
                };
                rv = obj.resource_version().unwrap_or_default();
                let name = obj.name_any();
                if kind == "DELETED" {
                    live.remove(&name);
                } else {
                    live.insert(
                        name.clone(),
                        (
                            obj.uid().unwrap_or_default(),
                            obj.resource_version().unwrap_or_default(),
                        ),
                    );
                }
                sink(Change {
                    kind,
                    name,
                    rv: rv_of(&obj),
                    relisted_since: None,
                    obj: Some(obj),
                });
            }
            if relist {
                reached = rv.parse().unwrap_or(list_rv);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A sink that keeps the ADDED and DELETED of a watch in `log`.
fn births_and_deaths<K>(log: Arc<Mutex<Vec<Seen>>>, epoch: u64) -> impl FnMut(Change<K>) + Send {
    move |change| {
        if change.kind != "MODIFIED" {
            log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
                kind: change.kind,
                key: change.name,
                epoch,
                rv: change.rv,
                relisted_since: change.relisted_since,
            });
        }
    }
}

impl Observer {
    /// Starts watching `namespace` through `client` (a direct client).
    pub fn start(client: &Client, namespace: &str) -> Self {
        Self::start_for(client, namespace, Published::Endpoints)
    }

    /// Starts watching what `published` needs in `namespace`.
    pub fn start_for(client: &Client, namespace: &str, published: Published) -> Self {
        let mut observer = Self {
            client: client.clone(),
            namespace: namespace.to_string(),
            published,
            slices: Arc::default(),
            services: Arc::new(Mutex::new(Vec::new())),
            endpoints: Arc::new(Mutex::new(Vec::new())),
            epoch: 0,
            tasks: Vec::new(),
        };
        observer.spawn();
        observer
    }

    fn spawn(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let (client, ns) = (&self.client, &self.namespace);
        if self.published == Published::EndpointSlices {
            self.tasks = slice_observer::spawn(client, ns, self.epoch, &self.slices);
            return;
        }
        self.tasks = vec![
            tokio::spawn(observe(
                Api::<Service>::namespaced(client.clone(), ns),
                births_and_deaths(self.services.clone(), self.epoch),
            )),
            tokio::spawn(observe(
                Api::<Endpoints>::namespaced(client.clone(), ns),
                births_and_deaths(self.endpoints.clone(), self.epoch),
            )),
        ];
    }

    /// etcd is about to be restored from a backup: stop watching, so that
    /// nothing the restore itself makes vanish is taken for a deletion.
    pub fn store_restoring(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    /// etcd was just restored from a backup: what the store says from now on
    /// starts a new epoch. The watches start over with a list that is the new
    /// baseline (objects that vanished with the restore were not deleted by
    /// anyone), and later deletions are judged against the restored store.
    pub fn store_restored(&mut self) {
        self.epoch += 1;
        self.spawn();
    }

    /// Endpoints DELETEs (seen as events, or as a changed UID after a relist)
    /// at a resourceVersion at which their Service existed; for
    /// EndpointSlices, every endpoint removed while its Service selected a
    /// live pod with that address ([`History::removals`]).
    pub fn spurious_deletions(&self) -> Vec<String> {
        if self.published == Published::EndpointSlices {
            return self
                .slices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .removals();
        }
        let services = self
            .services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let endpoints = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        endpoints
            .iter()
            .filter(|e| e.kind == "DELETED")
            .filter(|e| service_alive_at(&services, &e.key, e.epoch, e.rv))
            .map(|e| {
                format!(
                    "{} at rv {}{}",
                    e.key,
                    e.rv,
                    provenance(e.epoch, e.relisted_since)
                )
            })
            .collect()
    }

    /// The versions the slice watches saw of Service `name` (EndpointSlices only).
    pub fn service_versions(&self, name: &str) -> String {
        self.slices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .service_versions(name)
    }

    /// Whether the watches have seen anything yet (both listed).
    pub fn endpoints_seen(&self) -> usize {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// How a judged event was learnt, for its line in a report: after which
/// etcd restore, and whether a relist (not an event) showed it.
pub(super) fn provenance(epoch: u64, relisted_since: Option<u64>) -> String {
    let mut out = String::new();
    if epoch > 0 {
        out.push_str(&format!(" (after restore {epoch})"));
    }
    if relisted_since.is_some() {
        out.push_str(" (found by relist)");
    }
    out
}

/// Whether a change a relist found (`relisted_since`: the RV its watch had
/// reached) may have happened before `rv`: then the state at `rv` is not known.
pub(super) fn unsure_before(relisted_since: Option<u64>, rv: u64) -> bool {
    relisted_since.is_some_and(|since| since < rv)
}

/// The Service `name` provably existed at `rv` of `epoch`: its last
/// ADDED/DELETED of that epoch before `rv` was an ADDED, and no change a
/// relist found later may have happened before `rv`. (Events of one etcd
/// share one revision order; a restored store starts a new one.)
fn service_alive_at(services: &[Seen], name: &str, epoch: u64, rv: u64) -> bool {
    let mut events: Vec<&Seen> = services
        .iter()
        .filter(|s| s.key == name && s.epoch == epoch)
        .collect();
    events.sort_by_key(|s| s.rv);
    let end = events.partition_point(|s| s.rv < rv);
    let alive = events[..end].last().is_some_and(|s| s.kind == "ADDED");
    let unsure = events
        .get(end)
        .is_some_and(|s| unsure_before(s.relisted_since, rv));
    alive && !unsure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(kind: &'static str, rv: u64, relisted_since: Option<u64>) -> Seen {
        Seen {
            kind,
            key: "a".into(),
            epoch: 0,
            rv,
            relisted_since,
        }
    }

    #[test]
    fn a_service_is_alive_between_its_added_and_deleted_unless_a_relist_window_covers_the_rv() {
        let events = [seen("ADDED", 5, None), seen("DELETED", 50, Some(20))];
        // Created at 5; the watch broke at 20 and a relist at 50 found it gone.
        assert!(
            !service_alive_at(&events, "a", 0, 5),
            "not before its ADDED"
        );
        assert!(service_alive_at(&events, "a", 0, 10));
        assert!(service_alive_at(&events, "a", 0, 20));
        assert!(
            !service_alive_at(&events, "a", 0, 21),
            "deleted at some RV in (20, 50]: not known alive at 21"
        );
        assert!(!service_alive_at(&events, "a", 0, 60));
        assert!(!service_alive_at(&events, "a", 1, 10), "another epoch");
        let by_event = [seen("ADDED", 5, None), seen("DELETED", 50, None)];
        assert!(service_alive_at(&by_event, "a", 0, 49));
        assert!(!service_alive_at(&by_event, "a", 0, 51));
    }
}
