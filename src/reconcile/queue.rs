//! A keyed work queue in the manner of client-go's workqueue: however many events
//! arrive for a key, it is queued once; a key being processed is never handed to a
//! second worker, and an add during processing requeues it when the worker is done;
//! failed keys come back after a per-key exponential backoff.
//!
//! Delayed keys (retries, waits for a grace period) are entries of the queue,
//! not sleeping tasks: a key waits at most once, at the earliest instant asked
//! for, and an add before then takes it out of waiting (as kube-runtime's
//! scheduler de-duplicates). Idle workers sleep until the earliest of them.
//!
//! Each key also carries when the earliest watch event it has not yet served
//! arrived, so the worker can measure how long that event waited inside the
//! process before its write went out (`event_to_write_seconds`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::locks;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Upstream's per-item backoff: 5 ms doubling, capped at 1000 s.
const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1000);
/// Upstream drops a key after 15 retries; the next event or resync brings it back.
pub const MAX_RETRIES: u32 = 15;

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    /// Per key, when the earliest watch event not yet served by a reconcile
    /// arrived. Several events for one key collapse into one entry, and the
    /// earliest is kept: the one write that follows serves all of them, and the
    /// earliest has waited the longest, so keeping a later one would hide the
    /// time the key sat queued (or was re-dirtied while being processed).
    received: HashMap<K, Instant>,
    /// Keys waiting to be added: when, and the earliest unserved event.
    delayed: HashMap<K, Delayed>,
    max_retries: u32,
    shutting_down: bool,
}

#[derive(Debug, Clone, Copy)]
struct Delayed {
    due: Instant,
    received: Option<Instant>,
}

/// A key handed to a worker, with the arrival of the earliest watch event it
/// serves (`None` when only a resync or a sweep queued it since it was last
/// taken).
#[derive(Debug, PartialEq, Eq)]
pub struct Taken<K> {
    pub key: K,
    pub received: Option<Instant>,
}

/// The pure part of the queue: no async, no clock; the async shell wraps it.
impl<K: Clone + Eq + Hash> State<K> {
    fn new(max_retries: u32) -> Self {
        Self {
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            failures: HashMap::new(),
            received: HashMap::new(),
            delayed: HashMap::new(),
            max_retries,
            shutting_down: false,
        }
    }

    /// Returns true when the key became available to a worker. `received`:
    /// when the watch event that queues it arrived, if one did.
    fn add(&mut self, key: K, received: Option<Instant>) -> bool {
        if self.shutting_down {
            return false;
        }
        // Added now: a wait for a later instant is over.
        let waited = self.delayed.remove(&key).and_then(|d| d.received);
        for at in received.into_iter().chain(waited) {
            self.received
                .entry(key.clone())
                .and_modify(|earliest| *earliest = (*earliest).min(at))
                .or_insert(at);
        }
        if !self.dirty.insert(key.clone()) {
            return false;
        }
        if self.processing.contains(&key) {
            // Re-added by done().
            return false;
        }
        self.queue.push_back(key);
        true
    }

    /// Adds `key` at `due` unless it already waits for an earlier instant;
    /// `received` as for [`State::add`], kept until then.
    fn add_at(&mut self, key: K, due: Instant, received: Option<Instant>) {
        if self.shutting_down {
            return;
        }
        let entry = self.delayed.entry(key).or_insert(Delayed { due, received });
        entry.due = entry.due.min(due);
        entry.received = entry.received.into_iter().chain(received).min();
    }

    /// Adds every delayed key due at `now`; true when one became available.
    fn add_due(&mut self, now: Instant) -> bool {
        let due: Vec<K> = self
            .delayed
            .iter()
            .filter(|(_, d)| d.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut available = false;
        for key in due {
            if let Some(delayed) = self.delayed.remove(&key) {
                available |= self.add(key, delayed.received);
            }
        }
        available
    }

    /// When the earliest delayed key is due.
    fn next_due(&self) -> Option<Instant> {
        self.delayed.values().map(|d| d.due).min()
    }

    /// The next key; the events recorded for it until now are the ones the
    /// reconcile about to start serves (it reads caches that already hold
    /// them), so their instant leaves with the key. Events arriving while it
    /// is processed start a new entry for the run that follows.
    fn take(&mut self) -> Option<Taken<K>> {
        let key = self.queue.pop_front()?;
        self.dirty.remove(&key);
        self.processing.insert(key.clone());
        let received = self.received.remove(&key);
        Some(Taken { key, received })
    }

    /// Returns true when the key was queued again (it changed while processed).
    fn done(&mut self, key: &K) -> bool {
        self.processing.remove(key);
        if self.dirty.contains(key) {
            self.queue.push_back(key.clone());
            return true;
        }
        false
    }

    /// Counts a failure; `None` once the key has used up its retries.
    fn next_retry(&mut self, key: &K) -> Option<Duration> {
        let count = self.failures.entry(key.clone()).or_insert(0);
        if *count >= self.max_retries {
            self.failures.remove(key);
            return None;
        }
        let delay = BASE_DELAY
            .saturating_mul(1u32 << (*count).min(31))
            .min(MAX_DELAY);
        *count += 1;
        Some(delay)
    }
}

pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    ready: Notify,
}

/// What happened to a failed key.
#[derive(Debug, PartialEq, Eq)]
pub enum Retry {
    After(Duration),
    GaveUp,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A queue that gives a failing key `max_retries` retries.
    pub fn new(max_retries: u32) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::new(max_retries)),
            ready: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        locks::lock(&self.state)
    }

    /// Queues `key`; `received` is when the watch event that calls for it
    /// arrived (`None` for a resync or a sweep, which no event caused).
    pub fn add(&self, key: K, received: Option<Instant>) {
        if self.lock().add(key, received) {
            self.ready.notify_one();
        }
    }

    /// The next key to process, or `None` once the queue is shut down and drained
    /// of keys that were waiting.
    pub async fn next(&self) -> Option<Taken<K>> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut state = self.lock();
                if state.shutting_down {
                    return None;
                }
                state.add_due(Instant::now());
                if let Some(key) = state.take() {
                    // More keys may be waiting for other workers.
                    if !state.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
                state.next_due()
            };
            match next_due {
                Some(due) => {
                    let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(due));
                    tokio::select! {
                        () = &mut notified => {}
                        () = sleep => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    pub fn done(&self, key: &K) {
        if self.lock().done(key) {
            self.ready.notify_one();
        }
    }

    /// Forget the key's failures after a successful reconcile.
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Requeue after the key's backoff; gives up after the queue's retries.
    /// `received` is what the failed reconcile was handed: the events it did
    /// not manage to serve are still waiting, and the retry's write is
    /// measured from them.
    pub fn retry(&self, key: K, received: Option<Instant>) -> Retry {
        let mut state = self.lock();
        let Some(delay) = state.next_retry(&key) else {
            return Retry::GaveUp;
        };
        state.add_at(key, Instant::now() + delay, received);
        drop(state);
        // An idle worker sleeps until the earliest delayed key.
        self.ready.notify_one();
        Retry::After(delay)
    }

    /// Queues `key` after `delay` (a reconcile that waits for something
    /// no watch event announces, such as the end of a grace period).
    /// Asked again while it waits, the earliest instant stands.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.lock().add_at(key, Instant::now() + delay, None);
        self.ready.notify_one();
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn shutdown(&self) {
        self.lock().shutting_down = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of a [`Taken`], for tests that do not look at instants.
    fn key<K>(taken: Option<Taken<K>>) -> Option<K> {
        taken.map(|t| t.key)
    }

    #[test]
    fn one_entry_per_key_however_many_adds() {
        let mut s = State::new(MAX_RETRIES);
        assert!(s.add("a", None));
        assert!(!s.add("a", None));
        assert!(s.add("b", None));
        assert_eq!(key(s.take()), Some("a"));
        assert_eq!(key(s.take()), Some("b"));
        assert_eq!(key(s.take()), None);
    }

    #[test]
    fn key_in_processing_is_not_handed_out_twice_but_requeued_after() {
        let mut s = State::new(MAX_RETRIES);
        s.add("a", None);
        assert_eq!(key(s.take()), Some("a"));
        // An event arrives while a worker holds "a".
        assert!(!s.add("a", None));
        assert_eq!(
            key(s.take()),
            None,
            "a second worker must not get a key in flight"
        );
        assert!(s.done(&"a"));
        assert_eq!(key(s.take()), Some("a"));
        assert!(!s.done(&"a"));
    }

    #[test]
    fn a_key_queued_by_several_events_carries_the_earliest() {
        let t0 = Instant::now();
        let (t1, t2) = (t0 + Duration::from_millis(1), t0 + Duration::from_millis(2));
        let mut s = State::new(MAX_RETRIES);
        // Out of order on purpose: two watchers (pods, services) feed one queue.
        s.add("a", Some(t1));
        s.add("a", Some(t0));
        s.add("a", Some(t2));
        s.add("a", None);
        assert_eq!(
            s.take(),
            Some(Taken {
                key: "a",
                received: Some(t0)
            })
        );
    }

    #[test]
    fn events_during_processing_wait_for_the_next_run_and_earlier_ones_leave_with_the_key() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        let mut s = State::new(MAX_RETRIES);
        s.add("a", Some(t0));
        assert_eq!(key(s.take()), Some("a"));
        // The running reconcile reads caches that may predate this event.
        s.add("a", Some(t1));
        assert!(s.done(&"a"));
        assert_eq!(
            s.take(),
            Some(Taken {
                key: "a",
                received: Some(t1)
            })
        );
        s.done(&"a");
        // Queued by a resync only: no event to measure from.
        s.add("a", None);
        assert_eq!(
            s.take(),
            Some(Taken {
                key: "a",
                received: None
            })
        );
    }

    #[test]
    fn keys_keep_their_own_instants() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        let mut s = State::new(MAX_RETRIES);
        s.add("a", Some(t1));
        s.add("b", Some(t0));
        s.add("c", None);
        let taken: Vec<_> = std::iter::from_fn(|| s.take())
            .map(|t| (t.key, t.received))
            .collect();
        assert_eq!(taken, vec![("a", Some(t1)), ("b", Some(t0)), ("c", None)]);
    }

    #[test]
    fn nothing_is_recorded_after_shutdown() {
        let mut s = State::new(MAX_RETRIES);
        s.shutting_down = true;
        assert!(!s.add("a", Some(Instant::now())));
        assert!(s.received.is_empty());
    }

    #[test]
    fn a_delayed_key_waits_once_for_the_earliest_instant() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = State::new(MAX_RETRIES);
        s.add_at("a", at(100), None);
        s.add_at("a", at(50), Some(at(3)));
        s.add_at("a", at(200), Some(at(1)));
        assert_eq!(s.delayed.len(), 1);
        assert_eq!(s.next_due(), Some(at(50)));
        assert!(!s.add_due(at(49)));
        assert_eq!(key(s.take()), None);
        assert!(s.add_due(at(50)));
        assert_eq!(
            s.take(),
            Some(Taken {
                key: "a",
                received: Some(at(1))
            })
        );
        assert_eq!(s.next_due(), None);
    }

    #[test]
    fn an_add_ends_the_wait_and_keeps_its_events() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = State::new(MAX_RETRIES);
        s.add_at("a", at(100), Some(at(1)));
        s.add("a", Some(at(2)));
        assert_eq!(s.next_due(), None, "no second run at the old instant");
        assert_eq!(
            s.take(),
            Some(Taken {
                key: "a",
                received: Some(at(1))
            })
        );
    }

    #[test]
    fn backoff_doubles_from_5ms_and_gives_up_after_15() {
        let mut s: State<&str> = State::new(MAX_RETRIES);
        let delays: Vec<_> = (0..MAX_RETRIES).map(|_| s.next_retry(&"a")).collect();
        assert_eq!(delays[0], Some(Duration::from_millis(5)));
        assert_eq!(delays[1], Some(Duration::from_millis(10)));
        assert_eq!(delays[14], Some(Duration::from_millis(5 << 14)));
        assert_eq!(s.next_retry(&"a"), None);
        // After giving up the count starts over.
        assert_eq!(s.next_retry(&"a"), Some(Duration::from_millis(5)));
    }

    #[tokio::test]
    async fn workers_wake_for_added_keys_and_stop_on_shutdown() {
        let q: Arc<WorkQueue<u32>> = WorkQueue::new(MAX_RETRIES);
        let worker = {
            let q = q.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Some(taken) = q.next().await {
                    seen.push(taken.key);
                    q.done(&taken.key);
                    if seen.len() == 3 {
                        break;
                    }
                }
                seen
            })
        };
        q.add(1, None);
        q.add(2, None);
        q.add(2, None);
        q.add(3, None);
        let seen = tokio::time::timeout(Duration::from_secs(5), worker)
            .await
            .expect("worker finished")
            .expect("worker task");
        assert_eq!(seen, vec![1, 2, 3]);
        q.shutdown();
        assert_eq!(q.next().await, None);
    }

    #[tokio::test]
    async fn an_idle_worker_wakes_for_a_key_added_after_a_delay() {
        let q: Arc<WorkQueue<&str>> = WorkQueue::new(MAX_RETRIES);
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await.map(|t| t.key) })
        };
        tokio::task::yield_now().await;
        q.add_after("a", Duration::from_millis(20));
        q.add_after("a", Duration::from_millis(10));
        let taken = tokio::time::timeout(Duration::from_secs(5), worker)
            .await
            .expect("woken when the key was due")
            .expect("worker task");
        assert_eq!(taken, Some("a"));
        assert!(q.lock().delayed.is_empty());
    }

    #[tokio::test]
    async fn a_retried_key_keeps_the_instant_of_the_event_it_has_not_served() {
        let q: Arc<WorkQueue<&str>> = WorkQueue::new(MAX_RETRIES);
        let t0 = Instant::now();
        q.add("a", Some(t0));
        let taken = q.next().await.expect("queued");
        assert_eq!(q.retry(taken.key, taken.received), Retry::After(BASE_DELAY));
        q.done(&taken.key);
        let again = tokio::time::timeout(Duration::from_secs(5), q.next())
            .await
            .expect("requeued after its 5 ms backoff")
            .expect("queue open");
        assert_eq!(
            again,
            Taken {
                key: "a",
                received: Some(t0)
            }
        );
    }
}
