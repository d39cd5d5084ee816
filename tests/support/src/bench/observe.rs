//! The independent observer: one watch on Endpoints straight to kube-apiserver
//! (as the admin, which the audit policy leaves out). It tells when every
//! Service's Endpoints are correct (cold sync), when each flipped pod's
//! address moved between `addresses` and `notReadyAddresses` (churn latency),
//! and counts Endpoints writes as the watch events they cause.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use super::workload::{BenchWorkload, NAMESPACE_PREFIX};

/// What one Endpoints object says about its pods.
#[derive(Default)]
struct View {
    ready: HashSet<String>,
    not_ready: HashSet<String>,
}

struct Pending {
    want_ready: bool,
    sent: Instant,
}

#[derive(Default)]
struct State {
    views: HashMap<String, View>,
    /// Ready pods each Service should list (`namespace/name` → pod names).
    expected: HashMap<String, HashSet<String>>,
    correct: HashSet<String>,
    /// ADDED, MODIFIED and DELETED events in the bench namespaces.
    events: u64,
    pending: HashMap<String, Pending>,
    latencies_ms: Vec<f64>,
}

impl State {
    fn apply(&mut self, key: String, ep: Option<&Endpoints>, now: Instant) {
        let mut view = View::default();
        for subset in ep.and_then(|e| e.subsets.as_ref()).into_iter().flatten() {
            let names = |list: &Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| {
                list.iter()
                    .flatten()
                    .filter_map(|a| a.target_ref.as_ref().and_then(|r| r.name.clone()))
                    .collect::<Vec<_>>()
            };
            view.ready.extend(names(&subset.addresses));
            view.not_ready.extend(names(&subset.not_ready_addresses));
        }
        let namespace = key.split('/').next().unwrap_or_default().to_string();
        for (pod, ready) in view
            .ready
            .iter()
            .map(|p| (p, true))
            .chain(view.not_ready.iter().map(|p| (p, false)))
        {
            let pod_key = format!("{namespace}/{pod}");
            if let Some(p) = self.pending.get(&pod_key)
                && p.want_ready == ready
            {
                let sent = p.sent;
                self.pending.remove(&pod_key);
                self.latencies_ms
                    .push(now.saturating_duration_since(sent).as_secs_f64() * 1e3);
            }
        }
        let correct = self
            .expected
            .get(&key)
            .is_some_and(|want| ep.is_some() && view.not_ready.is_empty() && view.ready == *want);
        if correct {
            self.correct.insert(key.clone());
        } else {
            self.correct.remove(&key);
        }
        if ep.is_some() {
            self.views.insert(key, view);
        } else {
            self.views.remove(&key);
        }
    }
}

/// The running observer; its watch stops when it is dropped.
pub struct Observer {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(ep: &Endpoints) -> Option<String> {
    let ns = ep.namespace()?;
    ns.starts_with(NAMESPACE_PREFIX)
        .then(|| format!("{ns}/{}", ep.name_any()))
}

impl Observer {
    /// Lists the Endpoints, then watches them until dropped.
    pub async fn start(client: Client, workload: &BenchWorkload) -> Result<Self> {
        let mut state = State::default();
        for (s, (ns, name)) in workload.services.iter().enumerate() {
            let want = workload
                .pods
                .iter()
                .filter(|p| p.service == s)
                .map(|p| p.name.clone())
                .collect();
            state.expected.insert(format!("{ns}/{name}"), want);
        }
        let state = Arc::new(Mutex::new(state));
        let api: Api<Endpoints> = Api::all(client);
        let rv = relist(&api, &state).await?;
        let task = tokio::spawn(watch_forever(api, state.clone(), rv));
        Ok(Self { state, task })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Endpoints watch events seen so far in the bench namespaces.
    pub fn events(&self) -> u64 {
        self.lock().events
    }

    /// Bench Endpoints objects that exist.
    pub fn existing(&self) -> usize {
        self.lock().views.len()
    }

    /// Services whose Endpoints list exactly their pods, all ready.
    pub fn correct(&self) -> usize {
        self.lock().correct.len()
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

    /// Takes the latencies recorded so far and drops what is still pending;
    /// returns (latencies, pending flips given up on).
    pub fn take_latencies(&self) -> (Vec<f64>, usize) {
        let mut state = self.lock();
        let missed = state.pending.len();
        state.pending.clear();
        (std::mem::take(&mut state.latencies_ms), missed)
    }

    /// Waits until `done` holds, checking every 50 ms; fails after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Instant> {
        let start = Instant::now();
        loop {
            if done(self) {
                return Ok(Instant::now());
            }
            if self.task.is_finished() {
                bail!("the Endpoints watch stopped while waiting for {what}");
            }
            if start.elapsed() > timeout {
                bail!("{what}: not reached after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn relist(api: &Api<Endpoints>, state: &Mutex<State>) -> Result<String> {
    let list = api.list(&ListParams::default()).await?;
    let now = Instant::now();
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    let listed: HashSet<String> = list.items.iter().filter_map(key_of).collect();
    let gone: Vec<String> = state
        .views
        .keys()
        .filter(|k| !listed.contains(*k))
        .cloned()
        .collect();
    for key in gone {
        state.apply(key, None, now);
    }
    for ep in &list.items {
        if let Some(key) = key_of(ep) {
            state.apply(key, Some(ep), now);
        }
    }
    Ok(list.metadata.resource_version.unwrap_or_default())
}

async fn watch_forever(api: Api<Endpoints>, state: Arc<Mutex<State>>, mut rv: String) {
    loop {
        let params = WatchParams::default().timeout(290);
        let stream = match api.watch(&params, &rv).await {
            Ok(stream) => stream,
            Err(err) => {
                eprintln!("eg-bench: Endpoints watch failed: {err}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut gone = false;
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            let (ep, deleted) = match event {
                WatchEvent::Added(ep) | WatchEvent::Modified(ep) => (ep, false),
                WatchEvent::Deleted(ep) => (ep, true),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(err) => {
                    gone = err.code == 410;
                    break;
                }
            };
            if let Some(new_rv) = ep.resource_version() {
                rv = new_rv;
            }
            let Some(key) = key_of(&ep) else { continue };
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            state.events += 1;
            state.apply(key, (!deleted).then_some(&ep), now);
        }
        if gone {
            match relist(&api, &state).await {
                Ok(new_rv) => rv = new_rv,
                Err(err) => eprintln!("eg-bench: relisting Endpoints failed: {err}"),
            }
        }
    }
}
