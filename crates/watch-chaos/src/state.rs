//! What the proxy remembers: the faults in force, the last known version of
//! every object it saw (to send "old" DELETEs), the old RVs it sent (a watch
//! resuming there is a replay), LIST snapshots (stale lists), counters, and
//! the commands broadcast to open watch streams.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::events::{self, rv_number};
use super::faults::{FaultKind, FaultSet, FaultSpec};

/// A command to the open watch streams of `resource`.
#[derive(Debug, Clone)]
pub enum Command {
    /// Write these events (views, each stream on its own wire); end the
    /// stream after them if `close`.
    Inject {
        resource: String,
        namespace: Option<String>,
        events: Vec<Value>,
        close: bool,
    },
    /// Abort the streams (of every resource for `None`) mid-stream.
    Cut { resource: Option<String> },
    /// Make the open streams (of every resource for `None`) half-open: they
    /// pass nothing on from then on, bookmarks included, and stay open
    /// until the client leaves, as behind a load balancer whose far side
    /// is gone. Streams opened later are not touched.
    Silence { resource: Option<String> },
}

impl Command {
    /// Whether a stream of `resource` in `namespace` (None: all namespaces)
    /// takes this command.
    pub fn applies(&self, resource: &str, namespace: Option<&str>) -> bool {
        match self {
            Command::Inject {
                resource: r,
                namespace: target,
                ..
            } => r == resource && (namespace.is_none() || namespace == target.as_deref()),
            Command::Cut { resource: r } | Command::Silence { resource: r } => {
                r.as_deref().is_none_or(|r| r == resource)
            }
        }
    }
}

/// A LIST answer kept to serve stale lists: as JSON, and as protobuf at
/// the same RV where the API server serves it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub rv: String,
    pub body: Value,
    pub protobuf: Option<hyper::body::Bytes>,
}

#[derive(Debug, Clone)]
struct Known {
    rv: String,
    object: Value,
    deleted: bool,
}

/// State shared by the proxy's connections and the control API.
#[derive(Debug)]
pub struct Shared {
    faults: RwLock<FaultSet>,
    objects: Mutex<HashMap<String, HashMap<String, Known>>>,
    /// (resource, rv) of old RVs sent → pause between replayed events (ms).
    replays: Mutex<HashMap<(String, String), u64>>,
    max_rv: Mutex<HashMap<String, u64>>,
    snapshots: Mutex<HashMap<String, Snapshot>>,
    /// DELETEs already sent with an old RV: each is rewritten only once.
    old_deletes: Mutex<std::collections::HashSet<(String, String, String)>>,
    stats: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    commands: broadcast::Sender<Command>,
    open_streams: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map operations that cannot leave a map
    // half-changed, so a poisoned lock still holds consistent data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

impl Shared {
    pub fn new() -> Self {
        let (commands, _) = broadcast::channel(256);
        Self {
            faults: RwLock::new(FaultSet::default()),
            objects: Mutex::default(),
            replays: Mutex::default(),
            max_rv: Mutex::default(),
            snapshots: Mutex::default(),
            old_deletes: Mutex::default(),
            stats: Mutex::default(),
            commands,
            open_streams: AtomicUsize::new(0),
        }
    }

    pub fn faults(&self) -> FaultSet {
        self.faults
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn fault(&self, resource: &str, kind: FaultKind) -> Option<FaultSpec> {
        self.faults
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(resource, kind)
            .cloned()
    }

    pub fn set_fault(&self, spec: FaultSpec) {
        self.faults
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set(spec);
    }

    pub fn clear_faults(&self, resource: Option<&str>) {
        self.faults
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear(resource);
        match resource {
            Some(r) => {
                lock(&self.snapshots).remove(r);
            }
            None => lock(&self.snapshots).clear(),
        }
    }

    /// Counts one `what` for `resource`.
    pub fn bump(&self, resource: &str, what: &str) {
        *lock(&self.stats)
            .entry(resource.to_string())
            .or_default()
            .entry(what.to_string())
            .or_default() += 1;
    }

    pub fn count(&self, resource: &str, what: &str) -> u64 {
        lock(&self.stats)
            .get(resource)
            .and_then(|m| m.get(what))
            .copied()
            .unwrap_or(0)
    }

    /// Learns from one watch event (before faults are applied).
    pub fn record_event(&self, resource: &str, event: &Value) {
        let rv = events::object_rv(event).unwrap_or_default().to_string();
        self.observe_rv(resource, &rv);
        let kind = events::event_type(event);
        let (Some(key), Some(object)) = (events::event_key(event), event.get("object")) else {
            return;
        };
        let mut objects = lock(&self.objects);
        let known = objects.entry(resource.to_string()).or_default();
        match kind {
            "ADDED" | "MODIFIED" => {
                known.insert(
                    key,
                    Known {
                        rv,
                        object: object.clone(),
                        deleted: false,
                    },
                );
            }
            "DELETED" => {
                if let Some(k) = known.get_mut(&key) {
                    k.deleted = true;
                }
            }
            _ => {}
        }
    }

    /// Learns every item of a LIST answer and its RV.
    pub fn record_list(&self, resource: &str, list: &Value) {
        if let Some(rv) = list
            .get("metadata")
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
        {
            self.observe_rv(resource, rv);
        }
        let Some(items) = list.get("items").and_then(Value::as_array) else {
            return;
        };
        let mut objects = lock(&self.objects);
        let known = objects.entry(resource.to_string()).or_default();
        for item in items {
            let rv = item
                .get("metadata")
                .and_then(|m| m.get("resourceVersion"))
                .and_then(Value::as_str);
            if let (Some(key), Some(rv)) = (events::key_of(item), rv) {
                known.insert(
                    key,
                    Known {
                        rv: rv.to_string(),
                        object: item.clone(),
                        deleted: false,
                    },
                );
            }
        }
    }

    fn observe_rv(&self, resource: &str, rv: &str) {
        if let Some(n) = rv_number(rv) {
            let mut max = lock(&self.max_rv);
            let entry = max.entry(resource.to_string()).or_default();
            *entry = (*entry).max(n);
        }
    }

    /// The highest RV seen for `resource`.
    pub fn max_rv(&self, resource: &str) -> u64 {
        lock(&self.max_rv).get(resource).copied().unwrap_or(0)
    }

    /// The RV of the last version of `key` seen alive.
    pub fn previous_rv(&self, resource: &str, key: &str) -> Option<String> {
        lock(&self.objects)
            .get(resource)?
            .get(key)
            .map(|k| k.rv.clone())
    }

    /// The last version of `key` seen alive and its RV, while it is alive.
    pub fn live_object(&self, resource: &str, key: &str) -> Option<(Value, String)> {
        lock(&self.objects)
            .get(resource)?
            .get(key)
            .filter(|k| !k.deleted)
            .map(|k| (k.object.clone(), k.rv.clone()))
    }

    /// Remembers that `rv` was sent as an old RV: a watch resuming there gets
    /// its replayed events paced by `pace_ms`.
    pub fn register_replay(&self, resource: &str, rv: &str, pace_ms: u64) {
        lock(&self.replays).insert((resource.to_string(), rv.to_string()), pace_ms);
    }

    pub fn replay_pace(&self, resource: &str, rv: &str) -> Option<u64> {
        lock(&self.replays)
            .get(&(resource.to_string(), rv.to_string()))
            .copied()
    }

    /// True the first time the DELETE of `key` at `rv` is seen: only then is
    /// it sent with an old RV. (A real watch goes on after such a DELETE and
    /// the client's next resume comes later; rewriting the repeat a client
    /// gets when it resumes from before the deletion would loop.)
    pub fn first_old_delete(&self, resource: &str, key: &str, rv: &str) -> bool {
        lock(&self.old_deletes).insert((resource.to_string(), key.to_string(), rv.to_string()))
    }

    pub fn set_snapshot(&self, resource: &str, snapshot: Snapshot) {
        lock(&self.snapshots).insert(resource.to_string(), snapshot);
    }

    pub fn snapshot(&self, resource: &str) -> Option<Snapshot> {
        lock(&self.snapshots).get(resource).cloned()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Command> {
        self.commands.subscribe()
    }

    /// Sends `command` to the open streams; returns how many took it.
    pub fn broadcast(&self, command: Command) -> usize {
        self.commands.send(command).unwrap_or(0)
    }

    pub fn stream_opened(&self) {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stream_closed(&self) {
        self.open_streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// `GET /stats`.
    pub fn stats_json(&self) -> Value {
        let faults: Vec<Value> = self
            .faults()
            .all()
            .iter()
            .map(|f| serde_json::to_value(f).unwrap_or(Value::Null))
            .collect();
        json!({
            "open_watch_streams": self.open_streams.load(Ordering::Relaxed),
            "faults": faults,
            "resources": *lock(&self.stats),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, name: &str, rv: &str) -> Value {
        json!({"type": kind, "object": {"metadata": {"namespace": "a", "name": name, "resourceVersion": rv}}})
    }

    #[test]
    fn remembers_versions_and_deletions() {
        let s = Shared::new();
        s.record_list(
            "services",
            &json!({"metadata": {"resourceVersion": "10"}, "items": [
                {"metadata": {"namespace": "a", "name": "old", "resourceVersion": "3"}},
            ]}),
        );
        assert_eq!(s.max_rv("services"), 10);
        assert_eq!(s.previous_rv("services", "a/old").as_deref(), Some("3"));
        s.record_event("services", &event("MODIFIED", "old", "12"));
        assert_eq!(s.previous_rv("services", "a/old").as_deref(), Some("12"));
        assert!(s.live_object("services", "a/old").is_some());
        s.record_event("services", &event("DELETED", "old", "15"));
        // The last live version is kept; the object is known gone.
        assert_eq!(s.previous_rv("services", "a/old").as_deref(), Some("12"));
        assert!(s.live_object("services", "a/old").is_none());
        assert_eq!(s.max_rv("services"), 15);
    }

    #[test]
    fn replays_commands_and_counters() {
        let s = Shared::new();
        assert!(s.first_old_delete("services", "a/x", "9"));
        assert!(!s.first_old_delete("services", "a/x", "9"));
        s.register_replay("services", "7", 300);
        assert_eq!(s.replay_pace("services", "7"), Some(300));
        assert_eq!(s.replay_pace("pods", "7"), None);
        s.bump("pods", "deletes_dropped");
        s.bump("pods", "deletes_dropped");
        assert_eq!(s.count("pods", "deletes_dropped"), 2);
        assert_eq!(s.stats_json()["resources"]["pods"]["deletes_dropped"], 2);

        let inject = Command::Inject {
            resource: "services".into(),
            namespace: Some("a".into()),
            events: vec![],
            close: true,
        };
        assert!(inject.applies("services", None));
        assert!(inject.applies("services", Some("a")));
        assert!(!inject.applies("services", Some("b")));
        assert!(!inject.applies("pods", None));
        assert!(Command::Cut { resource: None }.applies("pods", Some("x")));
        assert!(
            !Command::Cut {
                resource: Some("services".into())
            }
            .applies("pods", None)
        );
    }
}
