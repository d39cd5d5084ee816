//! [`Store`]: the one handle on a watched resource's cache, shared by its
//! watcher (the only writer of watch and list results) and everything else
//! (readers, and the repairs that live reads make).

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::cache::{Cache, ReadStamp, Restored};
use super::error::WatchError;
use super::machine::RestartReason;
use super::object::{Cached, Change, Confirmation, ObjectKey};

/// What the rest of the program asks of a watcher.
#[derive(Debug)]
pub(super) enum Request {
    /// A consistent relist now (the periodic resync); answered once a list
    /// has been applied.
    Resync(oneshot::Sender<ResyncReport>),
    /// A consistent relist, because something suggests the store was rewound.
    Relist(RestartReason),
}

/// What a resync list did.
#[derive(Clone, Debug, Default)]
pub struct ResyncReport {
    /// Changes the list made to the cache (watch lag and drift alike: which
    /// is which is known only once the watch has passed the list).
    pub changes: usize,
    /// Listed items a live read had to settle.
    pub disputes: usize,
}

/// Suspected rewinds relist at most this often: a watch cache that keeps
/// serving one wrong object must not turn every reconcile into a relist.
const SUSPECT_RELIST_EVERY: Duration = Duration::from_secs(30);

struct Inner<T: Cached> {
    resource: &'static str,
    cache: RwLock<Cache<T>>,
    requests: mpsc::UnboundedSender<Request>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Request>>>,
    synced: watch::Sender<bool>,
    last_suspect_relist: Mutex<Option<Instant>>,
}

/// A watched resource's cache and the way to its watcher. Cheap to clone.
pub struct Store<T: Cached> {
    inner: Arc<Inner<T>>,
}

impl<T: Cached> Clone for Store<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: Cached> Store<T> {
    /// An empty, unsynced store for `resource` (a bounded label such as
    /// "pods", used in logs and metrics).
    pub fn new(resource: &'static str) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel();
        Self {
            inner: Arc::new(Inner {
                resource,
                cache: RwLock::new(Cache::new()),
                requests,
                receiver: Mutex::new(Some(receiver)),
                synced: watch::channel(false).0,
                last_suspect_relist: Mutex::new(None),
            }),
        }
    }

    /// The resource label this store was made with.
    pub fn resource(&self) -> &'static str {
        self.inner.resource
    }

    /// Every cache operation is a few map updates that cannot leave the maps
    /// half-changed, so a lock poisoned by a panicking thread is still
    /// consistent: this is the one place that says so.
    pub fn read(&self) -> RwLockReadGuard<'_, Cache<T>> {
        self.inner
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cache, for writing (see [`Store::read`]).
    pub fn write(&self) -> RwLockWriteGuard<'_, Cache<T>> {
        self.inner
            .cache
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The live object under `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.read().get(key)
    }

    /// Whether the cache holds a complete consistent list (false before the
    /// first one, and while a rewound store is listed again).
    pub fn is_synced(&self) -> bool {
        *self.inner.synced.borrow()
    }

    /// Follows [`Store::is_synced`].
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.inner.synced.subscribe()
    }

    /// Returns whether the state changed.
    pub(super) fn set_synced(&self, synced: bool) -> bool {
        self.inner
            .synced
            .send_if_modified(|now| std::mem::replace(now, synced) != synced)
    }

    /// The request channel, taken once by the watcher.
    pub(super) fn take_requests(&self) -> Option<mpsc::UnboundedReceiver<Request>> {
        self.inner
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Asks the watcher for a consistent relist and waits until one has been
    /// applied (the periodic resync). Fails if no watcher runs.
    pub async fn resync(&self) -> Result<ResyncReport, WatchError> {
        let gone = || WatchError::WatcherGone {
            resource: self.inner.resource,
        };
        let (reply, answer) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Resync(reply))
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())
    }

    /// Where the cache stands before a live read is sent.
    pub fn read_stamp(&self) -> ReadStamp {
        self.read().read_stamp()
    }

    /// Puts an object read live into the cache (see [`Cache::restore`]); a
    /// read that suggests a rewound store asks the watcher for a relist.
    pub fn restore(&self, obj: T, stamp: &ReadStamp) -> Restored<T> {
        let restored = self.write().restore(obj, stamp);
        if restored.rewind_suspected {
            self.suspect_rewind();
        }
        restored
    }

    /// See [`Cache::confirm_deleted`].
    pub fn confirm_deleted(&self, key: &ObjectKey, uid: &str, how: Confirmation) -> bool {
        self.write().confirm_deleted(key, uid, how)
    }

    /// See [`Cache::evict_ghost`].
    pub fn evict_ghost(&self, key: &ObjectKey, uid: &str) -> Option<Change<T>> {
        self.write().evict_ghost(key, uid)
    }

    /// Asks for a relist to find out whether the store was rewound, at most
    /// once every 30 s.
    pub fn suspect_rewind(&self) {
        let mut last = self
            .inner
            .last_suspect_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < SUSPECT_RELIST_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        // No watcher (shut down): nothing to relist.
        let _ = self
            .inner
            .requests
            .send(Request::Relist(RestartReason::RewindSuspected));
    }
}
