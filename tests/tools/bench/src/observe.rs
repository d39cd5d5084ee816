//! The independent observer: one watch straight to kube-apiserver (as the
//! admin, which the audit policy leaves out) on the kind the run measures,
//! Endpoints or EndpointSlices. It tells when every Service's objects are
//! correct (cold sync), when each flipped pod's endpoint changed readiness
//! (churn latency: Endpoints move it between `addresses` and
//! `notReadyAddresses`, slices flip its `conditions.ready`), and counts writes
//! as the watch events they cause.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::TryStreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use super::Kind;
use super::workload::{BenchWorkload, NAMESPACE_PREFIX};

/// The label naming a slice's Service.
const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// One endpoint as an object lists it.
struct Entry {
    pod: String,
    /// What must match the pod: its IP (Endpoints), or its IP, Node and zone
    /// (EndpointSlices).
    at: String,
    ready: bool,
}

impl Entry {
    fn id(&self) -> String {
        format!("{} {}", self.pod, self.at)
    }
}

/// An object kind the observer watches.
trait Observed:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The name of the Service the object belongs to.
    fn service(&self) -> Option<String>;
    fn entries(&self) -> Vec<Entry>;
}

impl Observed for Endpoints {
    fn service(&self) -> Option<String> {
        Some(self.name_any())
    }

    fn entries(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for subset in self.subsets.iter().flatten() {
            for (list, ready) in [
                (&subset.addresses, true),
                (&subset.not_ready_addresses, false),
            ] {
                for a in list.iter().flatten() {
                    if let Some(pod) = a.target_ref.as_ref().and_then(|r| r.name.clone()) {
                        out.push(Entry {
                            pod,
                            at: a.ip.clone(),
                            ready,
                        });
                    }
                }
            }
        }
        out
    }
}

impl Observed for EndpointSlice {
    fn service(&self) -> Option<String> {
        self.labels().get(LABEL_SERVICE_NAME).cloned()
    }

    fn entries(&self) -> Vec<Entry> {
        self.endpoints
            .iter()
            .flatten()
            .filter_map(|e| {
                let pod = e.target_ref.as_ref()?.name.clone()?;
                Some(Entry {
                    pod,
                    at: slice_location(
                        &e.addresses.join(","),
                        e.node_name.as_deref().unwrap_or(""),
                        e.zone.as_deref().unwrap_or(""),
                    ),
                    // The API reads a missing `ready` as ready.
                    ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                })
            })
            .collect()
    }
}

fn slice_location(addresses: &str, node: &str, zone: &str) -> String {
    format!("{addresses} node={node} zone={zone}")
}

struct Pending {
    want_ready: bool,
    sent: Instant,
}

#[derive(Default)]
struct State {
    /// Each object (`namespace/name`): its Service's key and endpoints.
    objects: HashMap<String, (String, Vec<Entry>)>,
    /// Object keys per Service (`namespace/name`).
    by_service: HashMap<String, HashSet<String>>,
    /// What each Service's objects should list, all ready ([`Entry::id`]s).
    expected: HashMap<String, HashSet<String>>,
    correct: HashSet<String>,
    /// ADDED, MODIFIED and DELETED events in the bench namespaces.
    events: u64,
    pending: HashMap<String, Pending>,
    flips: Vec<Flip>,
    /// Per pod (`namespace/name`): the endpoints of every object that name
    /// it, and how many of those are ready (the ghost phase waits for a
    /// pod's to reach zero).
    listings: HashMap<String, Listings>,
}

/// One pod flip seen in the objects of the kind.
#[derive(Clone, Copy, Debug)]
pub struct Flip {
    /// Just before its status write was sent.
    pub sent: Instant,
    /// From `sent` to the watch event that showed it, milliseconds.
    pub ms: f64,
}

/// How often the objects of the kind list one pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listings {
    pub all: usize,
    pub ready: usize,
}

/// Churn flips slower than this are logged one by one.
const SLOW_FLIP_MS: f64 = 50.0;

impl State {
    /// Records the object at `key` (`None`: deleted), belonging to `service`.
    fn apply(&mut self, key: String, now_is: Option<(String, Vec<Entry>)>, now: Instant) {
        let mut touched = Vec::new();
        let namespace = key.split('/').next().unwrap_or_default().to_string();
        if let Some((service, entries)) = self.objects.remove(&key) {
            if let Some(set) = self.by_service.get_mut(&service) {
                set.remove(&key);
            }
            for e in &entries {
                self.count_listing(&namespace, e, false);
            }
            touched.push(service);
        }
        if let Some((service, entries)) = now_is {
            for e in &entries {
                self.count_listing(&namespace, e, true);
                let pod_key = format!("{namespace}/{}", e.pod);
                if let Some(p) = self.pending.get(&pod_key)
                    && p.want_ready == e.ready
                {
                    let sent = p.sent;
                    self.pending.remove(&pod_key);
                    let ms = now.saturating_duration_since(sent).as_secs_f64() * 1e3;
                    if ms >= SLOW_FLIP_MS {
                        // With its wall-clock time, to line it up with the
                        // controller's log and what else ran then.
                        let at = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0.0, |d| d.as_secs_f64());
                        eprintln!("bench: slow flip {pod_key} {ms:.1} ms, seen at {at:.3}");
                    }
                    self.flips.push(Flip { sent, ms });
                }
            }
            self.by_service
                .entry(service.clone())
                .or_default()
                .insert(key.clone());
            self.objects.insert(key, (service.clone(), entries));
            touched.push(service);
        }
        for service in touched {
            self.check(&service);
        }
    }

    /// Counts `entry` of an object in `namespace` in (`added`) or out of its
    /// pod's listings.
    fn count_listing(&mut self, namespace: &str, entry: &Entry, added: bool) {
        let pod_key = format!("{namespace}/{}", entry.pod);
        let listings = self.listings.entry(pod_key.clone()).or_default();
        let ready = usize::from(entry.ready);
        if added {
            listings.all += 1;
            listings.ready += ready;
        } else {
            listings.all = listings.all.saturating_sub(1);
            listings.ready = listings.ready.saturating_sub(ready);
        }
        if listings.all == 0 {
            self.listings.remove(&pod_key);
        }
    }

    /// Whether the Service's objects list exactly its pods, each once and ready.
    fn check(&mut self, service: &str) {
        let correct = self.expected.get(service).is_some_and(|want| {
            let keys = self.by_service.get(service);
            let entries: Vec<&Entry> = keys
                .into_iter()
                .flatten()
                .filter_map(|k| self.objects.get(k))
                .flat_map(|(_, e)| e.iter())
                .collect();
            !entries.is_empty()
                && entries.len() == want.len()
                && entries.iter().all(|e| e.ready && want.contains(&e.id()))
                && entries.iter().map(|e| e.id()).collect::<HashSet<_>>().len() == want.len()
        });
        if correct {
            self.correct.insert(service.to_string());
        } else {
            self.correct.remove(service);
        }
    }
}

/// The running observer; its watch stops when it is dropped.
pub struct Observer {
    kind: Kind,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// (object key, Service key) of a bench object.
fn keys_of<K: Observed>(obj: &K) -> Option<(String, String)> {
    let ns = obj.namespace()?;
    if !ns.starts_with(NAMESPACE_PREFIX) {
        return None;
    }
    let service = obj.service()?;
    Some((
        format!("{ns}/{}", obj.name_any()),
        format!("{ns}/{service}"),
    ))
}

impl Observer {
    /// Lists the kind's objects, then watches them until dropped.
    pub async fn start(client: Client, workload: &BenchWorkload, kind: Kind) -> Result<Self> {
        let mut state = State::default();
        for (ns, name) in &workload.services {
            state
                .expected
                .insert(format!("{ns}/{name}"), HashSet::new());
        }
        for (i, pod) in workload.pods.iter().enumerate() {
            let (ns, name) = &workload.services[pod.service];
            let at = match kind {
                Kind::Endpoints => BenchWorkload::pod_ip(i),
                Kind::EndpointSlices => {
                    let node = BenchWorkload::node_of(i);
                    slice_location(&BenchWorkload::pod_ip(i), &node.0, node.1)
                }
            };
            let id = Entry {
                pod: pod.name.clone(),
                at,
                ready: true,
            }
            .id();
            if let Some(set) = state.expected.get_mut(&format!("{ns}/{name}")) {
                set.insert(id);
            }
        }
        let state = Arc::new(Mutex::new(state));
        let task = match kind {
            Kind::Endpoints => spawn_watch(Api::<Endpoints>::all(client), state.clone()).await?,
            Kind::EndpointSlices => {
                spawn_watch(Api::<EndpointSlice>::all(client), state.clone()).await?
            }
        };
        Ok(Self { kind, state, task })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watch events seen so far in the bench namespaces.
    pub fn events(&self) -> u64 {
        self.lock().events
    }

    /// Bench objects of the kind that exist.
    pub fn existing(&self) -> usize {
        self.lock().objects.len()
    }

    /// Services whose objects list exactly their pods, all ready.
    pub fn correct(&self) -> usize {
        self.lock().correct.len()
    }

    /// How often the objects of the kind list the pod `pod_key`
    /// (`namespace/name`), and how many of those endpoints are ready.
    pub fn listings(&self, pod_key: &str) -> Listings {
        self.lock()
            .listings
            .get(pod_key)
            .copied()
            .unwrap_or_default()
    }

    /// Marks `pod_key` as flipped to `want_ready` at `sent` (call before
    /// sending the write).
    pub fn expect_flip(&self, pod_key: String, want_ready: bool, sent: Instant) {
        self.lock()
            .pending
            .insert(pod_key, Pending { want_ready, sent });
    }

    /// Forgets a flip whose write failed.
    pub fn cancel_flip(&self, pod_key: &str) {
        self.lock().pending.remove(pod_key);
    }

    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Takes the flips seen so far and drops what is still pending;
    /// returns (flips seen, pending flips given up on).
    pub fn take_flips(&self) -> (Vec<Flip>, usize) {
        let mut state = self.lock();
        let missed = state.pending.len();
        state.pending.clear();
        (std::mem::take(&mut state.flips), missed)
    }

    /// Waits until `done` holds, checking every 50 ms; fails after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Instant> {
        match self.wait_until(what, timeout, done).await? {
            Some(at) => Ok(at),
            None => bail!("{what}: not reached after {timeout:?}"),
        }
    }

    /// Waits until `done` holds, checking every 50 ms: when it first held,
    /// or `None` after `timeout`. Fails if the watch stopped.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Option<Instant>> {
        let start = Instant::now();
        loop {
            if done(self) {
                return Ok(Some(Instant::now()));
            }
            if self.task.is_finished() {
                bail!(
                    "the {} watch stopped while waiting for {what}",
                    self.kind.objects()
                );
            }
            if start.elapsed() > timeout {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn spawn_watch<K: Observed>(api: Api<K>, state: Arc<Mutex<State>>) -> Result<JoinHandle<()>> {
    let rv = relist(&api, &state).await?;
    Ok(tokio::spawn(watch_forever(api, state, rv)))
}

/// An object's key, with its Service's key and endpoints.
type Record = (String, (String, Vec<Entry>));

fn record<K: Observed>(obj: &K) -> Option<Record> {
    let (key, service) = keys_of(obj)?;
    Some((key, (service, obj.entries())))
}

async fn relist<K: Observed>(api: &Api<K>, state: &Mutex<State>) -> Result<String> {
    let list = api.list(&ListParams::default()).await?;
    let now = Instant::now();
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    let listed: Vec<Record> = list.items.iter().filter_map(record).collect();
    let names: HashSet<&String> = listed.iter().map(|(k, _)| k).collect();
    let gone: Vec<String> = state
        .objects
        .keys()
        .filter(|k| !names.contains(k))
        .cloned()
        .collect();
    for key in gone {
        state.apply(key, None, now);
    }
    for (key, now_is) in listed {
        state.apply(key, Some(now_is), now);
    }
    Ok(list.metadata.resource_version.unwrap_or_default())
}

async fn watch_forever<K: Observed>(api: Api<K>, state: Arc<Mutex<State>>, mut rv: String) {
    let kind = K::kind(&());
    loop {
        let params = WatchParams::default().timeout(290);
        let stream = match api.watch(&params, &rv).await {
            Ok(stream) => stream,
            Err(err) => {
                eprintln!("eg-bench: {kind} watch failed: {err}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut gone = false;
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            let (obj, deleted) = match event {
                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => (obj, false),
                WatchEvent::Deleted(obj) => (obj, true),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(err) => {
                    gone = err.code == 410;
                    break;
                }
            };
            if let Some(new_rv) = obj.resource_version() {
                rv = new_rv;
            }
            let Some((key, now_is)) = record(&obj) else {
                continue;
            };
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            state.events += 1;
            state.apply(key, (!deleted).then_some(now_is), now);
        }
        if gone {
            match relist(&api, &state).await {
                Ok(new_rv) => rv = new_rv,
                Err(err) => eprintln!("eg-bench: relisting {kind} failed: {err}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pod: &str, ready: bool) -> Entry {
        Entry {
            pod: pod.into(),
            at: format!("ip-of-{pod}"),
            ready,
        }
    }

    fn listed(state: &State, pod_key: &str) -> Listings {
        state.listings.get(pod_key).copied().unwrap_or_default()
    }

    #[test]
    fn a_pods_listings_follow_every_object_that_names_it() {
        let mut state = State::default();
        let now = Instant::now();
        let svc = "bench-0/svc-0".to_string();
        state.apply(
            "bench-0/slice-a".into(),
            Some((svc.clone(), vec![entry("p", true), entry("q", true)])),
            now,
        );
        state.apply(
            "bench-0/slice-b".into(),
            Some((svc.clone(), vec![entry("p", false)])),
            now,
        );
        assert_eq!(listed(&state, "bench-0/p"), Listings { all: 2, ready: 1 });
        // An update replaces what the object listed before.
        state.apply(
            "bench-0/slice-a".into(),
            Some((svc.clone(), vec![entry("q", true)])),
            now,
        );
        assert_eq!(listed(&state, "bench-0/p"), Listings { all: 1, ready: 0 });
        assert_eq!(listed(&state, "bench-0/q"), Listings { all: 1, ready: 1 });
        // Another namespace's pod of the same name is another pod.
        assert_eq!(listed(&state, "bench-1/p"), Listings::default());
        state.apply("bench-0/slice-b".into(), None, now);
        assert_eq!(listed(&state, "bench-0/p"), Listings::default());
        assert!(!state.listings.contains_key("bench-0/p"));
    }
}
