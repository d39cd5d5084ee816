//! [`Store`]: the one handle on a watched resource's cache, shared by its
//! watcher (the only writer of watch and list results) and everything else
//! (readers, and the repairs that live reads make).

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::cache::{Cache, ReadStamp, Restored};
use super::count::CountCheck;
use super::error::WatchError;
use super::machine::RestartReason;
use super::object::{Cached, Change, Confirmation, ObjectKey};
#[cfg(any(test, feature = "testing"))]
use super::object::{Outcome, WatchEventKind};

/// What the rest of the program asks of a watcher.
#[derive(Debug)]
pub(super) enum Request {
    /// A consistent relist now (the periodic resync); answered once a list
    /// has been applied.
    Resync(oneshot::Sender<ResyncReport>),
    /// The same, when nothing suggests the cache is wrong (a scheduled
    /// resync): a list beside the open watch is paced (see
    /// `WatcherBuilder::resync_list_share`).
    PacedResync(oneshot::Sender<ResyncReport>),
    /// A consistent relist, because something suggests the store was rewound.
    Relist(RestartReason),
    /// A count check (see `count.rs`), answered at once, the watch left open.
    CountCheck(oneshot::Sender<CountCheck>),
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
    resource: Arc<str>,
    cache: RwLock<Cache<T>>,
    requests: mpsc::UnboundedSender<Request>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Request>>>,
    synced: watch::Sender<bool>,
    /// How many rewinds this store's watcher found first-hand.
    rewinds: watch::Sender<u64>,
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
    pub fn new(resource: impl Into<Arc<str>>) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel();
        Self {
            inner: Arc::new(Inner {
                resource: resource.into(),
                cache: RwLock::new(Cache::new()),
                requests,
                receiver: Mutex::new(Some(receiver)),
                synced: watch::channel(false).0,
                rewinds: watch::channel(0).0,
                last_suspect_relist: Mutex::new(None),
            }),
        }
    }

    /// The resource label this store was made with.
    pub fn resource(&self) -> &str {
        &self.inner.resource
    }

    /// Calls `read` with the cache (live objects, deletion candidates,
    /// where the store stands) and returns what it returns. The cache is
    /// locked for the call only, and no guard leaves the store, so none can
    /// be held across an `.await`; keep `read` short: the watcher waits for
    /// it to apply what arrives.
    pub fn with_cache<R>(&self, read: impl FnOnce(&Cache<T>) -> R) -> R {
        read(&self.read())
    }

    /// The cache, to read (the crate's own; others use
    /// [`Store::with_cache`]).
    ///
    /// Every cache operation is a few map updates that cannot leave the maps
    /// half-changed, so a lock poisoned by a panicking thread is still
    /// consistent: this (and `write`) is the one place that says so.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Cache<T>> {
        self.inner
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cache, for writing: the watcher's, and the named repairs'
    /// below (see [`Store::with_cache`]).
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Cache<T>> {
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

    /// Counts a rewind this store's watcher found itself (not one it was
    /// told of by [`Store::start_over`]): [`share_rewinds`] passes it on.
    pub(super) fn announce_rewind(&self) {
        self.inner.rewinds.send_modify(|count| *count += 1);
    }

    /// Follows the rewinds this store's watcher found itself.
    pub fn rewinds(&self) -> watch::Receiver<u64> {
        self.inner.rewinds.subscribe()
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
        self.ask(Request::Resync).await
    }

    /// [`Store::resync`] when nothing suggests the cache is wrong (a
    /// scheduled full resync): a list that runs beside the open watch pauses
    /// after each page as the builder's
    /// [`resync_list_share`](crate::WatcherBuilder::resync_list_share) says,
    /// so that the API server spends only that share of the time on it. A
    /// [`Store::resync`] asked for meanwhile lifts the pauses.
    pub async fn resync_paced(&self) -> Result<ResyncReport, WatchError> {
        self.ask(Request::PacedResync).await
    }

    /// Compares how many objects the store holds at its current
    /// resourceVersion with how many the cache holds, by two one-item LISTs
    /// (see [`CountCheck`]): far cheaper than [`Store::resync`], which only
    /// a difference (or no answer) calls for. The watch stays open.
    pub async fn count_check(&self) -> Result<CountCheck, WatchError> {
        self.ask(Request::CountCheck).await
    }

    /// Sends the watcher the request `make` builds around a reply channel
    /// and waits for the answer. Fails if no watcher runs.
    async fn ask<R>(
        &self,
        make: impl FnOnce(oneshot::Sender<R>) -> Request,
    ) -> Result<R, WatchError> {
        let gone = || WatchError::WatcherGone {
            resource: self.inner.resource.to_string(),
        };
        let (reply, answer) = oneshot::channel();
        self.inner.requests.send(make(reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())
    }

    /// Where the cache stands before a live read is sent: take it first,
    /// then read, then pass it to [`Store::restore`] with the answer.
    pub fn read_stamp(&self) -> ReadStamp {
        self.read().read_stamp()
    }

    /// Puts an object read live (a GET with resourceVersion unset, or the
    /// answer to the program's own write) into the cache, `stamp` being
    /// [`Store::read_stamp`] from before the read was sent. The read is the
    /// truth, except against what the cache learned after `stamp` (a watch
    /// event newer than the read). A read older than what the cache knew
    /// before it was sent is still taken, and suggests a rewound store: the
    /// watcher is asked for a relist (at most once every 30 s), which
    /// decides.
    pub fn restore(&self, obj: T, stamp: &ReadStamp) -> Restored<T> {
        let restored = self.write().restore(obj, stamp);
        if restored.rewind_suspected {
            self.suspect_rewind();
        }
        restored
    }

    /// A deletion candidate is settled: a live read found incarnation `uid`
    /// of `key` gone (or replaced by another UID), or, with
    /// [`Confirmation::Released`], nothing is at stake. Drops its tombstone;
    /// returns whether there was one of that incarnation. The deletion stays
    /// remembered until a newer list covers it, so replayed history and a
    /// list taken before the deletion cannot bring the object back.
    pub fn confirm_deleted(&self, key: &ObjectKey, uid: &str, how: Confirmation) -> bool {
        self.write().confirm_deleted(key, uid, how)
    }

    /// Reads that reach etcd found incarnation `uid` of `key` gone while the
    /// cache still holds it live: the API server's watch cache lost its
    /// DELETE (a ghost), and every list it serves would keep it. The object
    /// leaves the cache as confirmed gone, no further read needed; the
    /// returned deletion candidate is for the caller's handler, which the
    /// watcher does not call for it. `None` when the cache holds no such
    /// incarnation.
    pub fn evict_ghost(&self, key: &ObjectKey, uid: &str) -> Option<Change<T>> {
        self.write().evict_ghost(key, uid)
    }

    /// Ages deletion evidence (tombstones and confirmed deletions) by one
    /// tick. Call it on a timer: [`Cache::aged_tombstones`] and
    /// [`Store::forget_confirmed`] count in these ticks, so the cache needs
    /// no clock.
    pub fn tick(&self) {
        self.write().tick();
    }

    /// Forgets confirmed deletions made at least `released_ticks` ticks ago
    /// ([`Confirmation::Released`]) or `live_read_ticks` ago
    /// ([`Confirmation::LiveRead`], which also keeps ghosts out of lists).
    /// Choose both longer than the API server's watch history (etcd
    /// compaction, five minutes by default): by then no watch can replay
    /// what they guard against. Returns how many went.
    pub fn forget_confirmed(&self, released_ticks: u64, live_read_ticks: u64) -> usize {
        self.write()
            .forget_confirmed(released_ticks, live_read_ticks)
    }

    /// Applies one watch event as the watcher would (through the
    /// per-object guard), without calling any change handler: for tests
    /// that need a store in a given state without a server.
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_watch_event(&self, kind: WatchEventKind, obj: T) -> Outcome<T> {
        self.write().apply_event(kind, obj)
    }

    /// Takes one line of a WATCH response as the watcher does: an event
    /// whose metadata shows the state the cache holds is Unchanged without
    /// being decoded; any other is decoded with the watcher's own decoder,
    /// projected with `project` and applied as [`Store::apply_watch_event`]
    /// does. `None` for a line that is no object event, or whose object
    /// cannot be decoded or projected.
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_watch_line<K>(
        &self,
        line: &str,
        project: impl Fn(K) -> Option<T>,
    ) -> Option<Outcome<T>>
    where
        K: serde::de::DeserializeOwned,
    {
        if let Some((_, meta)) = super::decode::peek_watch_line(line)
            && self.write().apply_unchanged_event(&meta)
        {
            return Some(Outcome::Unchanged);
        }
        let super::decode::WatchLine::Object(kind, raw) = super::decode::parse_watch_line(line)
        else {
            return None;
        };
        let obj = super::decode::decode_object::<K, T>(raw, &project).ok()?;
        Some(self.apply_watch_event(kind, obj))
    }

    /// Another watcher of the same store found it rewound: this cache is not
    /// to be trusted either until it has listed again. It stops counting as
    /// synced now, and its watcher relists (that list's own RV check then
    /// starts it over). Without this, one cache could already hold the
    /// restored state while another still held the lost history, and a
    /// reconcile in between would act on the mix.
    pub fn start_over(&self) {
        self.set_synced(false);
        // No watcher (shut down): nothing to relist.
        let _ = self
            .inner
            .requests
            .send(Request::Relist(RestartReason::StoreRewound));
    }

    /// Asks for a relist to find out whether the store was rewound, at most
    /// once every 30 s.
    fn suspect_rewind(&self) {
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

/// A [`Store`] whatever its object type: what [`share_rewinds`] needs.
pub trait StoreHandle: Send + Sync {
    /// See [`Store::resource`].
    fn resource(&self) -> &str;
    /// See [`Store::is_synced`].
    fn is_synced(&self) -> bool;
    /// See [`Store::synced`].
    fn synced(&self) -> watch::Receiver<bool>;
    /// See [`Store::rewinds`].
    fn rewinds(&self) -> watch::Receiver<u64>;
    /// See [`Store::start_over`].
    fn start_over(&self);
}

impl<T: Cached> StoreHandle for Store<T> {
    fn resource(&self) -> &str {
        Store::resource(self)
    }

    fn is_synced(&self) -> bool {
        Store::is_synced(self)
    }

    fn synced(&self) -> watch::Receiver<bool> {
        Store::synced(self)
    }

    fn rewinds(&self) -> watch::Receiver<u64> {
        Store::rewinds(self)
    }

    fn start_over(&self) {
        Store::start_over(self);
    }
}

/// Runs as long as the stores exist (spawn it beside the watchers and end
/// it with them): whenever the watcher of one of `stores` finds the store
/// rewound, every other store starts over too ([`Store::start_over`]). The
/// caches of one API server share one etcd: a restore rewinds them all, but
/// each watcher would otherwise find out on its own schedule. A store told
/// to start over does not pass it on again when its own list then finds the
/// rewind (it is no longer synced, so its watcher announces nothing).
pub async fn share_rewinds(stores: Vec<Arc<dyn StoreHandle>>) {
    let mut followers = tokio::task::JoinSet::new();
    for (index, store) in stores.iter().enumerate() {
        let mut rewinds = store.rewinds();
        let others: Vec<Arc<dyn StoreHandle>> = stores
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(_, store)| Arc::clone(store))
            .collect();
        let resource = store.resource().to_owned();
        followers.spawn(async move {
            while rewinds.changed().await.is_ok() {
                tracing::info!(
                    resource,
                    "store rewound: every other cache lists again before anything is reconciled"
                );
                for other in &others {
                    other.start_over();
                }
            }
        });
    }
    while followers.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Obj;

    #[tokio::test]
    async fn a_rewind_seen_by_one_store_makes_the_others_list_again() {
        let pods: Store<Obj> = Store::new("pods");
        let services: Store<Obj> = Store::new("services");
        let mut requests = services.take_requests().expect("requests not taken yet");
        pods.set_synced(true);
        services.set_synced(true);
        let handles: Vec<Arc<dyn StoreHandle>> =
            vec![Arc::new(pods.clone()), Arc::new(services.clone())];
        let sharing = tokio::spawn(share_rewinds(handles));
        // Both synced: nothing happens.
        tokio::task::yield_now().await;
        assert!(services.is_synced());
        assert!(requests.try_recv().is_err());
        // The pods watcher finds the store rewound.
        pods.set_synced(false);
        pods.announce_rewind();
        let request = tokio::time::timeout(Duration::from_secs(5), requests.recv())
            .await
            .expect("a relist request in time");
        assert!(matches!(
            request,
            Some(Request::Relist(RestartReason::StoreRewound))
        ));
        assert!(!services.is_synced(), "not trusted until it lists again");
        sharing.abort();
    }
}
