//! A keyed work queue in the manner of client-go's workqueue: however many events
//! arrive for a key, it is queued once; a key being processed is never handed to a
//! second worker, and an add during processing requeues it when the worker is done;
//! failed keys come back after a per-key exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    max_retries: u32,
    shutting_down: bool,
}

/// The pure part of the queue: no async, no clock; the async shell wraps it.
impl<K: Clone + Eq + Hash> State<K> {
    fn new(max_retries: u32) -> Self {
        Self {
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            failures: HashMap::new(),
            max_retries,
            shutting_down: false,
        }
    }

    /// Returns true when the key became available to a worker.
    fn add(&mut self, key: K) -> bool {
        if self.shutting_down || !self.dirty.insert(key.clone()) {
            return false;
        }
        if self.processing.contains(&key) {
            // Re-added by done().
            return false;
        }
        self.queue.push_back(key);
        true
    }

    fn take(&mut self) -> Option<K> {
        let key = self.queue.pop_front()?;
        self.dirty.remove(&key);
        self.processing.insert(key.clone());
        Some(key)
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
        // A panic while holding this lock leaves the queue's sets consistent
        // (each operation is a few set updates), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add(&self, key: K) {
        if self.lock().add(key) {
            self.ready.notify_one();
        }
    }

    /// The next key to process, or `None` once the queue is shut down and drained
    /// of keys that were waiting.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.take() {
                    // More keys may be waiting for other workers.
                    if !state.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
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
    pub fn retry(self: &Arc<Self>, key: K) -> Retry {
        let Some(delay) = self.lock().next_retry(&key) else {
            return Retry::GaveUp;
        };
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
        Retry::After(delay)
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

    #[test]
    fn one_entry_per_key_however_many_adds() {
        let mut s = State::new(MAX_RETRIES);
        assert!(s.add("a"));
        assert!(!s.add("a"));
        assert!(s.add("b"));
        assert_eq!(s.take(), Some("a"));
        assert_eq!(s.take(), Some("b"));
        assert_eq!(s.take(), None);
    }

    #[test]
    fn key_in_processing_is_not_handed_out_twice_but_requeued_after() {
        let mut s = State::new(MAX_RETRIES);
        s.add("a");
        assert_eq!(s.take(), Some("a"));
        // An event arrives while a worker holds "a".
        assert!(!s.add("a"));
        assert_eq!(
            s.take(),
            None,
            "a second worker must not get a key in flight"
        );
        assert!(s.done(&"a"));
        assert_eq!(s.take(), Some("a"));
        assert!(!s.done(&"a"));
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
                while let Some(k) = q.next().await {
                    seen.push(k);
                    q.done(&k);
                    if seen.len() == 3 {
                        break;
                    }
                }
                seen
            })
        };
        q.add(1);
        q.add(2);
        q.add(2);
        q.add(3);
        let seen = tokio::time::timeout(Duration::from_secs(5), worker)
            .await
            .expect("worker finished")
            .expect("worker task");
        assert_eq!(seen, vec![1, 2, 3]);
        q.shutdown();
        assert_eq!(q.next().await, None);
    }
}
