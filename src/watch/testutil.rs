//! Test fixtures: a tiny cached type, a deterministic backoff, and a harness
//! that wires machine and cache together the way the driver does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::runtime::utils::Backoff;

use super::cache::{Cache, Cached, Change, ObjectKey, Outcome, StaleReason, WatchEventKind};
use super::machine::{Action, Machine, PageOutcome, RestartReason};
use super::rv::RvObservation;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub key: ObjectKey,
    pub uid: String,
    pub rv: String,
    /// Stands for the object's content (e.g. a Service's selector).
    pub data: String,
}

impl Cached for Obj {
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

/// `name` in namespace "ns", with `uid` and `rv`.
pub fn obj(name: &str, uid: &str, rv: &str) -> Obj {
    Obj {
        key: key(name),
        uid: uid.to_owned(),
        rv: rv.to_owned(),
        data: format!("{name}@{rv}"),
    }
}

pub fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ns", name)
}

/// Always 1 s, counting resets (so tests see when backoff restarts).
#[derive(Clone, Default)]
pub struct TestBackoff {
    pub resets: Arc<AtomicU32>,
    pub steps: Arc<AtomicU32>,
}

impl Iterator for TestBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let step = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        Some(Duration::from_secs(u64::from(step)))
    }
}

impl Backoff for TestBackoff {
    fn reset(&mut self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.steps.store(0, Ordering::SeqCst);
    }
}

pub fn machine() -> Machine<Obj> {
    Machine::new(500, Box::new(TestBackoff::default()))
}

/// Machine + cache, driven like `driver.rs` drives them, recording changes
/// and counters, and checking after every step that the cache never shrinks
/// below the objects that the scenario says are untouched.
pub struct Harness {
    pub machine: Machine<Obj>,
    pub cache: Cache<Obj>,
    pub changes: Vec<Change<Obj>>,
    pub stale: Vec<StaleReason>,
    pub regressions: usize,
    pub restarts: Vec<RestartReason>,
}

impl Harness {
    pub fn new() -> Self {
        Self {
            machine: machine(),
            cache: Cache::new(),
            changes: Vec::new(),
            stale: Vec::new(),
            regressions: 0,
            restarts: Vec::new(),
        }
    }

    /// Runs the initial list (one page) and asserts the machine then watches.
    pub fn synced_with(items: Vec<Obj>, list_rv: &str) -> Self {
        let mut h = Self::new();
        h.expect_list(None);
        h.page(items, None, list_rv);
        h.expect_watch(list_rv);
        h.changes.clear();
        h
    }

    pub fn expect_list(&self, token: Option<&str>) {
        assert_eq!(
            self.machine.next_action(),
            Action::List {
                continue_token: token.map(str::to_owned),
                limit: 500
            },
            "phase: {:?}",
            self.machine.phase()
        );
    }

    pub fn expect_watch(&self, rv: &str) {
        assert_eq!(
            self.machine.next_action(),
            Action::Watch {
                resource_version: rv.to_owned()
            }
        );
    }

    /// Feeds one list page; applies the list as one diff when complete.
    pub fn page(&mut self, items: Vec<Obj>, token: Option<&str>, list_rv: &str) {
        let before = self.cache.len();
        match self
            .machine
            .on_list_page(items, token.map(str::to_owned), list_rv)
        {
            PageOutcome::More => {
                // Pages are buffered, never applied piecemeal.
                assert_eq!(self.cache.len(), before, "a page must not touch the cache");
            }
            PageOutcome::Complete(list) => {
                let diff = self.cache.apply_list(list.items, &list.resource_version);
                self.stale.extend(diff.stale);
                self.changes.extend(diff.changes);
            }
            PageOutcome::Invalid => {}
        }
    }

    pub fn event(&mut self, kind: WatchEventKind, o: Obj) -> Outcome<Obj> {
        if self.machine.on_watch_event(&o.rv) == RvObservation::Regressed {
            self.regressions += 1;
        }
        let outcome = self.cache.apply_event(kind, o);
        match &outcome {
            Outcome::Applied(change) => self.changes.push(change.clone()),
            Outcome::Stale(reason) => self.stale.push(*reason),
            Outcome::Unchanged => {}
        }
        outcome
    }

    pub fn error_event(&mut self, code: u16, reason: &str) {
        let why = self.machine.on_watch_error_event(code, reason);
        self.restarts.push(why);
    }

    pub fn deletion_candidates(&self) -> Vec<ObjectKey> {
        self.changes
            .iter()
            .filter_map(|c| match c {
                Change::DeletionCandidate(o) => Some(o.key.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn data(&self, name: &str) -> Option<String> {
        self.cache.get(&key(name)).map(|o| o.data.clone())
    }
}
