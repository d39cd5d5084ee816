//! The watcher's cache: live objects, tombstones and the per-object guard.
//!
//! Synchronous on purpose (no client, no async) so every failure case in
//! `shared/watch-failures.md` is a plain unit test. The rules, in short:
//!
//! - An event older than what we hold (by resourceVersion, or an older UID
//!   incarnation) is *stale*: ignored and reported, never applied.
//! - Nothing is ever dropped silently: a DELETE, or an object missing from a
//!   consistent list, moves the last known state to a [`Tombstone`] and yields
//!   a [`Change::DeletionCandidate`]. The reconciler confirms with a live read
//!   and then calls [`Cache::confirm_deleted`] or [`Cache::restore`].
//! - A relist is applied as a diff ([`Cache::apply_list`]): the cache is never
//!   wiped and never empty in between.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::index::LabelIndex;
use super::rv::{ResumePoint, compare_rv, max_rv};

pub use super::object::{
    Cached, Change, DeletionSource, ListDiff, ObjectKey, Outcome, StaleReason, Tombstone,
    WatchEventKind,
};

/// The cache of one resource.
#[derive(Debug)]
pub struct Cache<T: Cached> {
    /// Ordered by namespace then name, so one namespace is a range.
    live: BTreeMap<ObjectKey, Arc<T>>,
    tombstones: HashMap<ObjectKey, Tombstone<T>>,
    /// Deletions confirmed by a live read, with the RV up to which the key is
    /// known gone. Kept until a list newer than that RV makes them redundant,
    /// so a list taken before the deletion cannot bring the object back.
    confirmed: HashMap<ObjectKey, String>,
    /// RV of the newest consistent list applied: an absent key cannot come
    /// back through an event at or below it.
    list_rv: Option<String>,
    highest: ResumePoint,
    opaque_fallbacks: u64,
    /// Live objects by label pair, for kinds that expose labels (pods).
    labels: LabelIndex,
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
        }
    }
}

impl<T: Cached> Cache<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every insertion into `live` goes through here, so the label index
    /// never differs from it.
    fn put_live(&mut self, key: ObjectKey, obj: Arc<T>) {
        if T::LABEL_INDEXED {
            if let Some(old) = self.live.get(&key) {
                self.labels.remove(&key.namespace, &key.name, old.labels());
            }
            self.labels.insert(&key.namespace, &key.name, obj.labels());
        }
        self.live.insert(key, obj);
    }

    /// Every removal from `live` goes through here (see [`Cache::put_live`]).
    fn drop_live(&mut self, key: &ObjectKey) {
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
    fn order(&mut self, a: &str, b: &str) -> Option<Ordering> {
        let ord = compare_rv(a, b);
        if ord.is_none() {
            self.opaque_fallbacks += 1;
        }
        ord
    }

    /// Applies one ADDED / MODIFIED / DELETED watch event through the guard.
    pub fn apply_event(&mut self, ev: WatchEventKind, obj: T) -> Outcome<T> {
        self.highest.observe(obj.resource_version());
        let key = obj.key();
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
                let obj = Arc::new(obj);
                self.put_live(key, obj.clone());
                Outcome::Applied(Change::Added(obj))
            }
        }
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
            ) => {
                let new = Arc::new(obj);
                self.put_live(key, new.clone());
                Outcome::Applied(Change::Updated { old: cur, new })
            }
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

    fn tombstone_live(&mut self, key: ObjectKey, last: T, source: DeletionSource) -> Outcome<T> {
        self.drop_live(&key);
        let observed_rv = Some(last.resource_version().to_owned());
        let last_known = Arc::new(last);
        self.tombstones.insert(
            key,
            Tombstone {
                last_known: last_known.clone(),
                observed_rv,
                source,
            },
        );
        Outcome::Applied(Change::DeletionCandidate(last_known))
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

    fn revive(&mut self, key: ObjectKey, obj: T) -> Outcome<T> {
        self.tombstones.remove(&key);
        self.confirmed.remove(&key);
        let obj = Arc::new(obj);
        self.put_live(key, obj.clone());
        Outcome::Applied(Change::Added(obj))
    }

    /// Whether `key`, absent from the cache, is known gone at `rv`.
    fn proven_absent_at(&mut self, key: &ObjectKey, rv: &str) -> bool {
        let proofs = [self.confirmed.get(key).cloned(), self.list_rv.clone()];
        proofs.into_iter().flatten().any(|proof| {
            matches!(
                compare_rv(rv, &proof),
                Some(Ordering::Less | Ordering::Equal)
            )
        })
    }

    /// Applies a consistent list (RV unset, all pages) as a diff.
    pub fn apply_list(&mut self, items: Vec<T>, list_rv: &str) -> ListDiff<T> {
        self.apply_list_with_unknown(items, list_rv, &HashSet::new())
    }

    /// Like [`Cache::apply_list`]; `unknown` are keys that were in the list
    /// but could not be decoded: they are present, so they never become
    /// deletion candidates (their cached copy, if any, is kept as is).
    pub fn apply_list_with_unknown(
        &mut self,
        items: Vec<T>,
        list_rv: &str,
        unknown: &HashSet<ObjectKey>,
    ) -> ListDiff<T> {
        let mut diff = ListDiff::default();
        let mut seen = HashSet::with_capacity(items.len());
        for item in items {
            self.highest.observe(item.resource_version());
            let key = item.key();
            seen.insert(key.clone());
            let outcome = self.list_item(key, item, list_rv);
            diff.record(outcome);
        }
        // Missing from the list: a deletion candidate only if the list is at
        // least as new as our copy. A newer copy was created (or changed)
        // after the snapshot: keep it.
        let missing: Vec<(ObjectKey, Arc<T>)> = self
            .live
            .iter()
            .filter(|(key, _)| !seen.contains(*key) && !unknown.contains(*key))
            .map(|(key, obj)| (key.clone(), obj.clone()))
            .collect();
        for (key, cur) in missing {
            match self.order(cur.resource_version(), list_rv) {
                Some(Ordering::Greater) => diff.kept_newer += 1,
                _ => {
                    self.drop_live(&key);
                    self.tombstones.insert(
                        key,
                        Tombstone {
                            last_known: cur.clone(),
                            observed_rv: Some(list_rv.to_owned()),
                            source: DeletionSource::MissingFromList,
                        },
                    );
                    diff.deletion_candidates += 1;
                    diff.changes.push(Change::DeletionCandidate(cur));
                }
            }
        }
        // Confirmed deletions at or below this list's RV are proven by it now.
        self.confirmed.retain(|_, rv| {
            !matches!(
                compare_rv(rv, list_rv),
                Some(Ordering::Less | Ordering::Equal)
            )
        });
        let newest = match self.list_rv.as_deref() {
            Some(prev) => max_rv(prev, list_rv).to_owned(),
            None => list_rv.to_owned(),
        };
        self.list_rv = Some(newest);
        self.highest.observe(list_rv);
        diff
    }

    /// Applies one item of a consistent list at `list_rv` exactly as
    /// [`Cache::apply_list_with_unknown`] applies each of its items, and
    /// nothing else: it never removes anything and does not record `list_rv`.
    /// For lists applied page by page ([`ListDiffBuilder`](super::list::ListDiffBuilder)),
    /// which end with `apply_list_with_unknown(vec![], list_rv, listed_keys)`.
    pub fn apply_listed(&mut self, item: T, list_rv: &str) -> Outcome<T> {
        self.highest.observe(item.resource_version());
        let key = item.key();
        self.list_item(key, item, list_rv)
    }

    fn list_item(&mut self, key: ObjectKey, item: T, list_rv: &str) -> Outcome<T> {
        if let Some(cur) = self.live.get(&key).cloned() {
            // Same rules as a MODIFIED event: a list racing with the watch
            // may be older than what the watch already applied.
            return self.event_on_live(WatchEventKind::Modified, key, cur, item);
        }
        // Deletion evidence (tombstone or confirmed) newer than the list wins;
        // a list newer than it proves the object exists.
        let evidence = match self.tombstones.get(&key) {
            Some(tomb) => Some(tomb.horizon().to_owned()),
            None => self.confirmed.get(&key).cloned(),
        };
        if let Some(evidence) = evidence
            && matches!(
                self.order(list_rv, &evidence),
                Some(Ordering::Less | Ordering::Equal)
            )
        {
            return Outcome::Stale(StaleReason::AlreadyDeleted);
        }
        self.revive(key, item)
    }

    /// The live object under `key` (tombstoned objects are not live).
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.live.get(key).cloned()
    }

    pub fn tombstone(&self, key: &ObjectKey) -> Option<&Tombstone<T>> {
        self.tombstones.get(key)
    }

    /// All pending tombstones (deletion candidates not yet confirmed).
    pub fn tombstones(&self) -> impl Iterator<Item = (&ObjectKey, &Tombstone<T>)> {
        self.tombstones.iter()
    }

    /// A live read showed the object gone (or replaced by another UID): drop
    /// the tombstone of incarnation `uid`. Returns whether one was dropped.
    /// The deletion stays remembered until a newer list covers it, so a list
    /// taken before the deletion cannot resurrect the object.
    pub fn confirm_deleted(&mut self, key: &ObjectKey, uid: &str) -> bool {
        let matches = self
            .tombstones
            .get(key)
            .is_some_and(|tomb| tomb.last_known.uid() == uid);
        if !matches {
            return false;
        }
        if let Some(tomb) = self.tombstones.remove(key) {
            let horizon = tomb.horizon().to_owned();
            let horizon = match self.highest.get() {
                // The live read happened after everything seen so far.
                Some(highest) => max_rv(&horizon, highest).to_owned(),
                None => horizon,
            };
            self.confirmed.insert(key.clone(), horizon);
        }
        true
    }

    /// A live read showed the object exists: put it back. Guarded: a DELETE
    /// that arrived after the read (higher RV) wins over it.
    pub fn restore(&mut self, obj: T) -> Outcome<T> {
        self.highest.observe(obj.resource_version());
        let key = obj.key();
        if let Some(cur) = self.live.get(&key).cloned() {
            return self.event_on_live(WatchEventKind::Modified, key, cur, obj);
        }
        if let Some(tomb) = self.tombstones.get(&key) {
            // A live read outranks a list's absence, but not a DELETE event
            // observed at or after the object's version.
            let threshold = match tomb.source {
                DeletionSource::WatchDelete => tomb.horizon().to_owned(),
                DeletionSource::MissingFromList => tomb.last_known.resource_version().to_owned(),
            };
            let same_uid = tomb.last_known.uid() == obj.uid();
            let source = tomb.source;
            return match (self.order(obj.resource_version(), &threshold), source) {
                (Some(Ordering::Greater) | None, _) => self.revive(key, obj),
                (Some(Ordering::Equal), DeletionSource::MissingFromList) if same_uid => {
                    self.revive(key, obj)
                }
                (_, _) if same_uid => Outcome::Stale(StaleReason::AlreadyDeleted),
                (_, _) => Outcome::Stale(StaleReason::OlderUid),
            };
        }
        if let Some(proof) = self.confirmed.get(&key).cloned()
            && matches!(
                self.order(obj.resource_version(), &proof),
                Some(Ordering::Less | Ordering::Equal)
            )
        {
            return Outcome::Stale(StaleReason::AlreadyDeleted);
        }
        self.revive(key, obj)
    }

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

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// Highest RV seen in any object or list applied (never goes backwards).
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
