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
//!
//! Keys wait in one of two lanes. A key a watch event queued goes ahead of
//! one only a resync, a sweep or a timer queued: a resync queues every
//! Service, and a pod that flips just then must not wait behind a thousand
//! reconciles that find nothing to do. A background key that an event
//! touches moves to the event lane. The background lane still gets one key
//! in every [`BACKGROUND_SHARE`], so steady events cannot starve it.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
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
/// While both lanes hold keys, one taken in this many comes from the
/// background lane.
pub const BACKGROUND_SHARE: u32 = 16;

/// Which lane a queued key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// A watch event queued it.
    Event,
    /// Only a resync, a sweep or a timer did.
    Background,
}

impl Lane {
    fn of(received: Option<Instant>) -> Self {
        if received.is_some() {
            Lane::Event
        } else {
            Lane::Background
        }
    }
}

struct State<K> {
    /// Keys queued by an event, in order. An entry is stale (and skipped)
    /// when its key is no longer dirty in this lane, or is being processed.
    events: VecDeque<K>,
    background: VecDeque<K>,
    /// Keys waiting for a worker, or re-added while processed, and their lane.
    dirty: HashMap<K, Lane>,
    /// How many dirty keys wait for a worker (the lanes may hold stale entries).
    waiting: usize,
    /// Keys taken from the event lane since the last background one.
    events_in_a_row: u32,
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
    /// The same keys by the instant they are due, so that taking the due
    /// ones and finding the next wake-up cost a lookup each, not a walk over
    /// every waiting key (thousands back off while the API server is down).
    due_order: BTreeSet<(Instant, K)>,
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
impl<K: Clone + Eq + Hash + Ord> State<K> {
    fn new(max_retries: u32) -> Self {
        Self {
            events: VecDeque::new(),
            background: VecDeque::new(),
            dirty: HashMap::new(),
            waiting: 0,
            events_in_a_row: 0,
            processing: HashSet::new(),
            failures: HashMap::new(),
            received: HashMap::new(),
            delayed: HashMap::new(),
            due_order: BTreeSet::new(),
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
        let waited = self.undelay(&key).and_then(|d| d.received);
        for at in received.into_iter().chain(waited) {
            self.received
                .entry(key.clone())
                .and_modify(|earliest| *earliest = (*earliest).min(at))
                .or_insert(at);
        }
        let lane = Lane::of(received);
        let processing = self.processing.contains(&key);
        match self.dirty.get_mut(&key) {
            // Already waiting in its lane, or in the event lane.
            Some(queued) if *queued == lane || *queued == Lane::Event => false,
            // A background key an event now calls for moves up; it was
            // counted as waiting already, and done() requeues one in process.
            Some(queued) => {
                *queued = Lane::Event;
                if !processing {
                    self.events.push_back(key);
                }
                false
            }
            None => {
                self.dirty.insert(key.clone(), lane);
                if processing {
                    // Re-added by done(), in the lane it holds then.
                    return false;
                }
                self.push(key, lane);
                true
            }
        }
    }

    fn push(&mut self, key: K, lane: Lane) {
        self.waiting += 1;
        match lane {
            Lane::Event => self.events.push_back(key),
            Lane::Background => self.background.push_back(key),
        }
    }

    /// Takes the next key of `lane` that waits there, skipping stale entries.
    fn pop(&mut self, lane: Lane) -> Option<K> {
        loop {
            let key = match lane {
                Lane::Event => self.events.pop_front()?,
                Lane::Background => self.background.pop_front()?,
            };
            if self.dirty.get(&key) == Some(&lane) && !self.processing.contains(&key) {
                return Some(key);
            }
        }
    }

    /// Adds `key` at `due` unless it already waits for an earlier instant;
    /// `received` as for [`State::add`], kept until then.
    fn add_at(&mut self, key: K, due: Instant, received: Option<Instant>) {
        if self.shutting_down {
            return;
        }
        match self.delayed.get_mut(&key) {
            Some(waiting) => {
                waiting.received = waiting.received.into_iter().chain(received).min();
                if due < waiting.due {
                    self.due_order.remove(&(waiting.due, key.clone()));
                    waiting.due = due;
                    self.due_order.insert((due, key));
                }
            }
            None => {
                self.due_order.insert((due, key.clone()));
                self.delayed.insert(key, Delayed { due, received });
            }
        }
    }

    /// Takes `key` out of waiting, if it waits.
    fn undelay(&mut self, key: &K) -> Option<Delayed> {
        let delayed = self.delayed.remove(key)?;
        self.due_order.remove(&(delayed.due, key.clone()));
        Some(delayed)
    }

    /// Adds every delayed key due at `now`; true when one became available.
    fn add_due(&mut self, now: Instant) -> bool {
        let mut available = false;
        while self.due_order.first().is_some_and(|(due, _)| *due <= now) {
            let Some((_, key)) = self.due_order.pop_first() else {
                break;
            };
            if let Some(delayed) = self.delayed.remove(&key) {
                available |= self.add(key, delayed.received);
            }
        }
        available
    }

    /// When the earliest delayed key is due.
    fn next_due(&self) -> Option<Instant> {
        self.due_order.first().map(|(due, _)| *due)
    }

    /// The next key; the events recorded for it until now are the ones the
    /// reconcile about to start serves (it reads caches that already hold
    /// them), so their instant leaves with the key. Events arriving while it
    /// is processed start a new entry for the run that follows.
    fn take(&mut self) -> Option<Taken<K>> {
        let background_due = self.events_in_a_row + 1 >= BACKGROUND_SHARE;
        let key = if background_due {
            self.pop(Lane::Background).or_else(|| self.pop(Lane::Event))
        } else {
            self.pop(Lane::Event).or_else(|| self.pop(Lane::Background))
        }?;
        self.waiting = self.waiting.saturating_sub(1);
        match self.dirty.remove(&key) {
            Some(Lane::Event) => self.events_in_a_row += 1,
            _ => self.events_in_a_row = 0,
        }
        self.processing.insert(key.clone());
        let received = self.received.remove(&key);
        Some(Taken { key, received })
    }

    /// Returns true when the key was queued again (it changed while processed).
    fn done(&mut self, key: &K) -> bool {
        self.processing.remove(key);
        match self.dirty.get(key) {
            Some(&lane) => {
                self.push(key.clone(), lane);
                true
            }
            None => false,
        }
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

impl<K: Clone + Eq + Hash + Ord + Send + 'static> WorkQueue<K> {
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
                    if state.waiting > 0 {
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
        self.lock().waiting
    }

    pub fn shutdown(&self) {
        self.lock().shutting_down = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
