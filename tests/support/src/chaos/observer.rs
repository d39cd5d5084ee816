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
    /// Learnt from a relist rather than an event (time only known roughly).
    relisted: bool,
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
    /// Learnt from a relist rather than an event (time only known roughly).
    pub relisted: bool,
    pub obj: Option<K>,
}

/// Lists, then watches `api` for good, relisting after a watch error; hands
/// every ADDED, MODIFIED and DELETED to `sink` with its resourceVersion (a
/// relist's differences carry the list's RV).
pub(super) async fn observe<K>(api: Api<K>, mut sink: impl FnMut(Change<K>) + Send)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    // name → uid of what is live as far as we know.
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    let mut first = true;
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
        let now: BTreeMap<String, String> = list
            .items
            .iter()
            .map(|o| (o.name_any(), o.uid().unwrap_or_default()))
            .collect();
        for (name, uid) in &live {
            if now.get(name) != Some(uid) && !first {
                sink(Change {
                    kind: "DELETED",
                    name: name.clone(),
                    rv: list_rv,
                    relisted: true,
                    obj: None,
                });
            }
        }
        for obj in list.items {
            let name = obj.name_any();
            if live.get(&name).map(String::as_str) != obj.uid().as_deref() {
                sink(Change {
                    kind: "ADDED",
                    name,
                    rv: if first { 0 } else { list_rv },
                    relisted: !first,
                    obj: Some(obj),
                });
            }
        }
        first = false;
        live = now;
        let mut rv = list_rv.to_string();
        loop {
            let params = WatchParams::default().timeout(290);
            let Ok(stream) = api.watch(&params, &rv).await else {
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
                    live.insert(name.clone(), obj.uid().unwrap_or_default());
                }
                sink(Change {
                    kind,
                    name,
                    rv: rv_of(&obj),
                    relisted: false,
                    obj: Some(obj),
                });
            }
            if relist {
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
                relisted: change.relisted,
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
                    "{} at rv {}{}{}",
                    e.key,
                    e.rv,
                    if e.epoch > 0 {
                        format!(" (after restore {})", e.epoch)
                    } else {
                        String::new()
                    },
                    if e.relisted { " (found by relist)" } else { "" }
                )
            })
            .collect()
    }

    /// Whether the watches have seen anything yet (both listed).
    pub fn endpoints_seen(&self) -> usize {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// The Service `name` existed at `rv` of `epoch`: its last ADDED/DELETED of
/// that epoch before `rv` was an ADDED. (Events of one etcd share one
/// revision order; a restored store starts a new one.)
fn service_alive_at(services: &[Seen], name: &str, epoch: u64, rv: u64) -> bool {
    let mut alive = false;
    let mut events: Vec<&Seen> = services
        .iter()
        .filter(|s| s.key == name && s.epoch == epoch && s.rv < rv)
        .collect();
    events.sort_by_key(|s| s.rv);
    for s in events {
        alive = s.kind == "ADDED";
    }
    alive
}
