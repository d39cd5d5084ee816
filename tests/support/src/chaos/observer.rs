//! The independent watches that count spurious Endpoints deletions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::task::JoinHandle;

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

/// Watches Services and Endpoints of one namespace directly against
/// kube-apiserver and records every change with its resourceVersion.
pub struct Observer {
    client: Client,
    namespace: String,
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

async fn observe<K>(api: Api<K>, log: Arc<Mutex<Vec<Seen>>>, epoch: u64)
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
        {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            for (name, uid) in &live {
                if now.get(name) != Some(uid) && !first {
                    log.push(Seen {
                        kind: "DELETED",
                        key: name.clone(),
                        epoch,
                        rv: list_rv,
                        relisted: true,
                    });
                }
            }
            for (name, uid) in &now {
                if live.get(name) != Some(uid) {
                    let rv = if first { 0 } else { list_rv };
                    log.push(Seen {
                        kind: "ADDED",
                        key: name.clone(),
                        epoch,
                        rv,
                        relisted: !first,
                    });
                }
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
                match kind {
                    "DELETED" => {
                        live.remove(&name);
                    }
                    _ => {
                        live.insert(name.clone(), obj.uid().unwrap_or_default());
                    }
                }
                if kind != "MODIFIED" {
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
                        kind,
                        key: name,
                        epoch,
                        rv: rv_of(&obj),
                        relisted: false,
                    });
                }
            }
            if relist {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Observer {
    /// Starts watching `namespace` through `client` (a direct client).
    pub fn start(client: &Client, namespace: &str) -> Self {
        let mut observer = Self {
            client: client.clone(),
            namespace: namespace.to_string(),
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
        self.tasks = vec![
            tokio::spawn(observe(
                Api::<Service>::namespaced(client.clone(), ns),
                self.services.clone(),
                self.epoch,
            )),
            tokio::spawn(observe(
                Api::<Endpoints>::namespaced(client.clone(), ns),
                self.endpoints.clone(),
                self.epoch,
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
    /// at a resourceVersion at which their Service existed.
    pub fn spurious_deletions(&self) -> Vec<String> {
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
