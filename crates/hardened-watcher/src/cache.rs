//! The watcher's cache: live objects, tombstones and the per-object guard.
//!
//! Synchronous on purpose (no client, no async, no clock) so every failure
//! case in the crate documentation's table of failures is a plain unit test. The rules, in short:
//!
//! - A watch event older than what we hold (by resourceVersion, or an older
//!   UID incarnation) is *stale*: ignored and reported, never applied. This
//!   guard is for watch events only: a consistent LIST and a GET with
//!   resourceVersion unset are the truth (see `cache_list.rs` and
//!   [`Cache::restore`]).
//! - Nothing is ever dropped silently: a DELETE, or an object missing from a
//!   consistent list, moves the last known state to a [`Tombstone`] and yields
//!   a [`Change::DeletionCandidate`]. The reconciler confirms with a live read
//!   and then calls [`Cache::confirm_deleted`] or [`Cache::restore`].
//! - A relist is applied as a diff, page by page: the cache is never wiped
//!   and never empty in between.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::count_journal::CountJournal;
use super::index::LabelIndex;
use super::rv::{ResumePoint, compare_rv};

pub(crate) use super::object::{
    Cached, Change, Confirmation, DeletionSource, DriftKind, ObjectKey, Outcome, StaleReason,
    Tombstone, WatchEventKind,
};

/// A deletion that was confirmed, remembered so that replayed history and
/// lists taken before it cannot bring the object back.
#[derive(Clone, Debug)]
pub(super) struct Confirmed {
    /// The RV up to which the key is known gone.
    pub horizon: String,
    /// The incarnation that was confirmed gone.
    pub uid: String,
    pub how: Confirmation,
    pub born: u64,
}

/// Differences a resync list found, not yet counted as drift: each is either
/// explained by a watch event at or below `list_rv` (the watch was merely
/// behind) or, once the watch has passed `list_rv` without one, real drift.
#[derive(Debug, Default)]
pub(super) struct PendingDrift {
    pub list_rv: Option<String>,
    pub keys: HashMap<ObjectKey, DriftKind>,
}

/// The state of the cache before a read was sent: a live read's answer is
/// newer than everything the cache had learned by then, and older than
/// nothing it learned after (see [`Store::restore`](crate::Store::restore)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadStamp(pub(super) Option<String>);

/// Result of putting a live read into the cache.
#[derive(Clone, Debug)]
pub struct Restored<T> {
    /// The cache's answer, as for a watch event.
    pub outcome: Outcome<T>,
    /// The read was older than what the cache knew before the read was sent:
    /// a healthy store never answers so, so the store may have been rewound.
    /// The caller asks for a relist, which decides.
    pub rewind_suspected: bool,
}

/// The cache of one resource.
#[derive(Debug)]
pub struct Cache<T: Cached> {
    /// Ordered by namespace then name, so one namespace is a range.
    pub(super) live: BTreeMap<ObjectKey, Arc<T>>,
    pub(super) tombstones: HashMap<ObjectKey, Tombstone<T>>,
    /// Deletions confirmed by a live read or released with nothing at stake.
    /// Kept until a list newer than their horizon no longer shows the key.
    pub(super) confirmed: HashMap<ObjectKey, Confirmed>,
    /// RV of the newest consistent list applied: an absent key cannot come
    /// back through an event at or below it.
    pub(super) list_rv: Option<String>,
    /// The highest RV the store is known to have reached (events, bookmarks,
    /// lists, live reads). A consistent list below it means a rewound store.
    pub(super) highest: ResumePoint,
    pub(super) opaque_fallbacks: u64,
    /// Live objects by label pair, for kinds that expose labels (pods).
    labels: LabelIndex,
    pub(super) drift: PendingDrift,
    /// Advanced by [`Cache::tick`]: the age of tombstones and confirmations.
    pub(super) tick: u64,
    /// Items of the last complete list that could not be decoded or
    /// projected: in the store, never in the cache.
    pub(super) skipped: usize,
    /// The count at each revision passed, for [`Cache::count_at`].
    pub(super) counts: CountJournal,
}

impl<T: Cached> Default for Cache<T> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            tombstones: HashMap::new(),
            confirmed: HashMap::new(),
            list_rv: None,
            highest: ResumePoint::default(),
            opaque_fallbacks: 0,
            labels: LabelIndex::default(),
            drift: PendingDrift::default(),
            tick: 0,
            skipped: 0,
            counts: CountJournal::default(),
        }
    }
}

impl<T: Cached> Cache<T> {
    /// An empty cache.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Every insertion into `live` goes through here, so the label index
    /// never differs from it.
    pub(super) fn put_live(&mut self, key: ObjectKey, obj: Arc<T>) {
        if T::LABEL_INDEXED {
            if let Some(old) = self.live.get(&key) {
                self.labels.remove(&key.namespace, &key.name, old.labels());
            }
            self.labels.insert(&key.namespace, &key.name, obj.labels());
        }
        self.live.insert(key, obj);
    }

    /// Every removal from `live` goes through here (see [`Cache::put_live`]).
    pub(super) fn drop_live(&mut self, key: &ObjectKey) {
        if let Some(old) = self.live.remove(key)
            && T::LABEL_INDEXED
        {
            self.labels.remove(&key.namespace, &key.name, old.labels());
        }
    }

    /// Live objects of `namespace` that may match `selector` (a superset; the
    /// caller checks the selector). Without labels to index, or for an empty
    /// selector, every object of the namespace.
    pub fn selector_candidates<'a>(
        &'a self,
        namespace: &'a str,
        selector: &BTreeMap<String, String>,
    ) -> Vec<&'a Arc<T>> {
        match self.labels.candidates(namespace, selector) {
            Some(names) if T::LABEL_INDEXED => names
                .into_iter()
                .filter_map(|name| {
                    self.live.get(&ObjectKey {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                    })
                })
                .collect(),
            _ => self.in_namespace(namespace).collect(),
        }
    }

    /// Orders `a` against `b`; counts the cases where the guard has to fall
    /// back because one of them is opaque.
    pub(super) fn order(&mut self, a: &str, b: &str) -> Option<Ordering> {
        let ord = compare_rv(a, b);
        if ord.is_none() {
            self.opaque_fallbacks += 1;
        }
        ord
    }

    /// Applies one ADDED / MODIFIED / DELETED watch event through the guard.
    pub(crate) fn apply_event(&mut self, ev: WatchEventKind, obj: T) -> Outcome<T> {
        let outcome = self.apply_event_guarded(ev, obj);
        self.note_count();
        outcome
    }

    /// Records the count held at the revision reached (see
    /// [`Cache::count_at`]); called once the cache stands at one revision
    /// again: after an event, a finished list, a repair.
    pub(super) fn note_count(&mut self) {
        let revision = self.highest.get().and_then(|rv| rv.parse().ok());
        let count = (self.live.len() + self.skipped) as u64;
        self.counts.record(revision, count);
    }

    fn apply_event_guarded(&mut self, ev: WatchEventKind, obj: T) -> Outcome<T> {
        self.highest.observe(obj.resource_version());
        let key = obj.key();
        self.explain_drift(&key, obj.resource_version());
        if let Some(cur) = self.live.get(&key).cloned() {
            return self.event_on_live(ev, key, cur, obj);
        }
        if self.tombstones.contains_key(&key) {
            return self.event_on_tombstone(ev, key, obj);
        }
        match ev {
            // Nothing known about it: nothing to delete.
            WatchEventKind::Deleted => Outcome::Stale(StaleReason::AlreadyDeleted),
            WatchEventKind::Added | WatchEventKind::Modified => {
                if self.proven_absent_at(&key, obj.resource_version()) {
                    // Replayed history of an object that a consistent list or
                    // a confirmed deletion already showed gone.
                    return Outcome::Stale(StaleReason::AlreadyDeleted);
                }
                self.revive(key, obj)
            }
        }
    }

    /// An ADDED / MODIFIED event known from its metadata alone
    /// ([`peek_watch_line`](super::decode::peek_watch_line)) to bring exactly
    /// the incarnation and resourceVersion held live for its key: what
    /// [`Cache::apply_event`] does with it (Unchanged), without the object.
    /// False, and nothing done, for any other event: decode and apply it.
    pub(crate) fn apply_unchanged_event(&mut self, meta: &super::decode::RawMeta) -> bool {
        let held = self.live.get(&meta.key).is_some_and(|cur| {
            cur.uid() == meta.uid && cur.resource_version() == meta.resource_version
        });
        if held {
            self.highest.observe(&meta.resource_version);
            self.explain_drift(&meta.key, &meta.resource_version);
        }
        held
    }

    /// A BOOKMARK: the store has reached `rv`.
    pub(crate) fn note_bookmark(&mut self, rv: &str) {
        self.highest.observe(rv);
    }

    fn event_on_live(
        &mut self,
        ev: WatchEventKind,
        key: ObjectKey,
        cur: Arc<T>,
        obj: T,
    ) -> Outcome<T> {
        let ord = self.order(obj.resource_version(), cur.resource_version());
        let same_uid = obj.uid() == cur.uid();
        match (ev, same_uid, ord) {
            (_, true, Some(Ordering::Less)) => Outcome::Stale(StaleReason::OlderRv),
            (WatchEventKind::Added | WatchEventKind::Modified, true, Some(Ordering::Equal)) => {
                Outcome::Unchanged
            }
            // Newer (or, opaque, accepted) version of the same object, or a
            // newer incarnation replacing the cached one.
            (WatchEventKind::Added | WatchEventKind::Modified, true, _)
            | (
                WatchEventKind::Added | WatchEventKind::Modified,
                false,
                Some(Ordering::Greater) | None,
            ) => self.replace(key, cur, obj),
            (WatchEventKind::Added | WatchEventKind::Modified, false, _) => {
                Outcome::Stale(StaleReason::OlderUid)
            }
            // A DELETE at or above the cached RV. Equal is a real delete from
            // servers that send the object's last RV (pre kubernetes#58547).
            (WatchEventKind::Deleted, true, _) => {
                self.tombstone_live(key, obj, DeletionSource::WatchDelete)
            }
            // A DELETE of a *newer* incarnation: ours is a ghost (its DELETE
            // and the new ADDED were lost) and the newer one is gone too.
            (WatchEventKind::Deleted, false, Some(Ordering::Greater)) => {
                self.tombstone_live(key, obj, DeletionSource::WatchDelete)
            }
            (WatchEventKind::Deleted, false, _) => Outcome::Stale(StaleReason::OlderUid),
        }
    }

    pub(super) fn replace(&mut self, key: ObjectKey, old: Arc<T>, obj: T) -> Outcome<T> {
        let new = Arc::new(obj);
        self.put_live(key, new.clone());
        Outcome::Applied(Change::Updated { old, new })
    }

    pub(super) fn tombstone_live(
        &mut self,
        key: ObjectKey,
        last: T,
        source: DeletionSource,
    ) -> Outcome<T> {
        let observed_rv = Some(last.resource_version().to_owned());
        let last_known = Arc::new(last);
        self.put_tombstone(key, last_known.clone(), observed_rv, source, false);
        Outcome::Applied(Change::DeletionCandidate(last_known))
    }

    /// `before_rewind`: made by a list that started the cache over (see
    /// [`Tombstone::before_rewind`]).
    pub(super) fn put_tombstone(
        &mut self,
        key: ObjectKey,
        last_known: Arc<T>,
        observed_rv: Option<String>,
        source: DeletionSource,
        before_rewind: bool,
    ) {
        self.drop_live(&key);
        let born = self.tick;
        self.tombstones.insert(
            key,
            Tombstone {
                last_known,
                observed_rv,
                source,
                born,
                before_rewind,
            },
        );
    }

    fn event_on_tombstone(&mut self, ev: WatchEventKind, key: ObjectKey, obj: T) -> Outcome<T> {
        let Some(tomb) = self.tombstones.get(&key) else {
            return Outcome::Unchanged;
        };
        let horizon = tomb.horizon().to_owned();
        let same_uid = obj.uid() == tomb.last_known.uid();
        let ord = self.order(obj.resource_version(), &horizon);
        match (ev, ord) {
            (WatchEventKind::Deleted, Some(Ordering::Greater)) => {
                // Still gone, but remember the newest state we were told of.
                let observed_rv = Some(obj.resource_version().to_owned());
                if let Some(tomb) = self.tombstones.get_mut(&key) {
                    tomb.last_known = Arc::new(obj);
                    tomb.observed_rv = observed_rv;
                }
                Outcome::Stale(StaleReason::AlreadyDeleted)
            }
            (WatchEventKind::Deleted, _) => Outcome::Stale(StaleReason::AlreadyDeleted),
            // Newer than the deletion evidence: a new incarnation, or the
            // deletion evidence was wrong. Existence wins.
            (_, Some(Ordering::Greater) | None) => self.revive(key, obj),
            // Replayed ADDED/MODIFIED of something deleted later.
            (_, _) if same_uid => Outcome::Stale(StaleReason::AlreadyDeleted),
            (_, _) => Outcome::Stale(StaleReason::OlderUid),
        }
    }

    /// Puts `obj` live, forgetting any deletion evidence for its key.
    pub(super) fn revive(&mut self, key: ObjectKey, obj: T) -> Outcome<T> {
        self.tombstones.remove(&key);
        self.confirmed.remove(&key);
        let obj = Arc::new(obj);
        self.put_live(key, obj.clone());
        Outcome::Applied(Change::Added(obj))
    }

    /// Whether `key`, absent from the cache, is known gone at `rv`.
    fn proven_absent_at(&mut self, key: &ObjectKey, rv: &str) -> bool {
        let proofs = [
            self.confirmed.get(key).map(|c| c.horizon.clone()),
            self.list_rv.clone(),
        ];
        proofs.into_iter().flatten().any(|proof| {
            matches!(
                compare_rv(rv, &proof),
                Some(Ordering::Less | Ordering::Equal)
            )
        })
    }

    /// The live object under `key` (tombstoned objects are not live).
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.live.get(key).cloned()
    }

    /// The tombstone of `key`, if it is a deletion candidate.
    pub fn tombstone(&self, key: &ObjectKey) -> Option<&Tombstone<T>> {
        self.tombstones.get(key)
    }

    /// All pending tombstones (deletion candidates not yet confirmed).
    pub fn tombstones(&self) -> impl Iterator<Item = (&ObjectKey, &Tombstone<T>)> {
        self.tombstones.iter()
    }

    /// Every live object, ordered by namespace and name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> {
        self.live.values()
    }

    /// The live objects of one namespace (a range of the ordered map: the
    /// reconcile of one Service never walks other namespaces).
    pub fn in_namespace<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Arc<T>> + 'a {
        let start = ObjectKey {
            namespace: namespace.to_string(),
            name: String::new(),
        };
        self.live
            .range(start..)
            .take_while(move |(k, _)| k.namespace == namespace)
            .map(|(_, v)| v)
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// How many deletion candidates await confirmation.
    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// Confirmed deletions still remembered.
    pub fn confirmed_count(&self) -> usize {
        self.confirmed.len()
    }

    /// Items of the last complete list that could not be decoded or
    /// projected (the store holds them, the cache cannot): a count check
    /// adds them to the cache's.
    pub fn skipped_in_last_list(&self) -> usize {
        self.skipped
    }

    /// Whether only another list can settle something: a deletion candidate
    /// not yet confirmed, or a difference the last list found that waits
    /// to be counted as drift or watch lag. A count check cannot.
    pub fn awaits_a_list(&self) -> bool {
        !self.tombstones.is_empty() || !self.drift.keys.is_empty()
    }

    /// How many objects the store held at `revision` as far as the cache
    /// learned it (its objects and those its last list could not decode),
    /// for a comparison with the store's own count there (the
    /// `remainingItemCount` of a one-item LIST at exactly `revision`). A
    /// watch that lost a creation or a deletion at or below `revision` makes
    /// the two differ. `None` when the cache has not reached `revision`, or
    /// has started over or been rewound since.
    pub fn count_at(&self, revision: u64) -> Option<u64> {
        let reached = self.highest.get().and_then(|rv| rv.parse().ok());
        self.counts.at(revision, reached)
    }

    /// Highest RV the store is known to have reached.
    pub fn highest_rv(&self) -> Option<&str> {
        self.highest.get()
    }

    /// RV of the newest consistent list applied.
    pub fn list_rv(&self) -> Option<&str> {
        self.list_rv.as_deref()
    }

    /// How many times the guard had to accept an opaque RV it could not order.
    pub fn opaque_rv_count(&self) -> u64 {
        self.opaque_fallbacks
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
