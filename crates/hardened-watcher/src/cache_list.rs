//! How a consistent list is applied to the [`Cache`], item by item and then
//! as a whole (the page-by-page driver is [`ListDiffBuilder`](super::list::ListDiffBuilder)).
//!
//! A consistent LIST (resourceVersion unset) is the truth about the store at
//! its RV. The per-object "never older" guard of watch events does not apply
//! to it, with two exceptions:
//! - a cached object newer than the list was written after the snapshot (our
//!   own write, a live read): it is kept;
//! - an item that contradicts what the cache learned in a way a healthy store
//!   cannot produce (the same incarnation at a lower RV than a copy known
//!   before the snapshot; an incarnation a live read found gone) is a
//!   [`Dispute`], settled by a read that reaches etcd: either the store was
//!   rewound, or the list came from a watch cache that lost an event.
//!
//! A list whose RV is below the highest RV the store was known to have
//! reached means the store itself was rewound (etcd restored from a backup):
//! the cache then starts over from the list ([`ListMode::Rewind`]).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::cache::{Cache, ReadStamp};
use super::object::{
    Cached, Change, Confirmation, DeletionSource, Dispute, DisputeKind, DriftKind, ListDiff,
    ListedOutcome, LiveRead, ObjectKey, Outcome, Resolution, StaleReason,
};
use super::rv::{ResumePoint, compare_rv, max_rv};

/// Why a list is applied, which decides what it may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMode {
    /// The first list, or a relist after a watch error: apply the diff.
    Recover,
    /// The periodic resync: apply the diff and hold what it changed as
    /// pending drift until the watch shows whether it was only behind.
    Resync,
    /// The store was rewound: the list replaces the cache; tombstones,
    /// confirmations and drift learned from the lost history are dropped.
    Rewind,
}

impl<T: Cached> Cache<T> {
    /// The RV below which a consistent list means a rewound store.
    pub(crate) fn list_floor(&self) -> Option<String> {
        self.highest.get().map(str::to_owned)
    }

    /// Whether a list at `list_rv`, started when the floor was `floor`,
    /// shows the store rewound.
    pub(crate) fn is_rewound(floor: Option<&str>, list_rv: &str) -> bool {
        floor.is_some_and(|floor| compare_rv(list_rv, floor) == Some(Ordering::Less))
    }

    /// Starts a [`ListMode::Rewind`] list at `list_rv`: everything learned
    /// from history the store no longer has goes. Live objects stay until the
    /// list ends (listed ones are replaced, the rest become candidates).
    pub(crate) fn begin_rewind(&mut self, list_rv: &str) {
        self.tombstones.clear();
        self.confirmed.clear();
        self.drift = Default::default();
        self.list_rv = None;
        self.counts.clear();
        self.highest = ResumePoint::at(list_rv);
    }

    /// Applies one item of a consistent list at `list_rv`.
    pub(crate) fn apply_listed(
        &mut self,
        item: T,
        list_rv: &str,
        mode: ListMode,
    ) -> ListedOutcome<T> {
        self.highest.observe(item.resource_version());
        let key = item.key();
        if mode == ListMode::Rewind {
            return ListedOutcome::Outcome(self.listed_authoritative(key, item));
        }
        if let Some(cur) = self.live.get(&key).cloned() {
            return self.listed_on_live(key, cur, item, list_rv);
        }
        // Deletion evidence learned at or after the snapshot wins; older
        // evidence is overruled by the list, except a live read's.
        let evidence = match self.tombstones.get(&key) {
            Some(tomb) => Some((tomb.horizon().to_owned(), None)),
            None => self
                .confirmed
                .get(&key)
                .map(|c| (c.horizon.clone(), Some((c.uid.clone(), c.how)))),
        };
        if let Some((horizon, confirmed)) = evidence {
            if matches!(
                self.order(list_rv, &horizon),
                Some(Ordering::Less | Ordering::Equal)
            ) {
                return ListedOutcome::Outcome(Outcome::Stale(StaleReason::AlreadyDeleted));
            }
            if let Some((uid, Confirmation::LiveRead)) = confirmed
                && uid == item.uid()
            {
                return ListedOutcome::Disputed(Dispute {
                    listed: item,
                    kind: DisputeKind::DeletedByLiveRead,
                });
            }
        }
        ListedOutcome::Outcome(self.revive(key, item))
    }

    fn listed_authoritative(&mut self, key: ObjectKey, item: T) -> Outcome<T> {
        match self.live.get(&key).cloned() {
            Some(cur)
                if cur.uid() == item.uid() && cur.resource_version() == item.resource_version() =>
            {
                Outcome::Unchanged
            }
            Some(cur) => self.replace(key, cur, item),
            None => self.revive(key, item),
        }
    }

    fn listed_on_live(
        &mut self,
        key: ObjectKey,
        cur: Arc<T>,
        item: T,
        list_rv: &str,
    ) -> ListedOutcome<T> {
        let same_uid = cur.uid() == item.uid();
        let ord = self.order(item.resource_version(), cur.resource_version());
        let outcome = match ord {
            Some(Ordering::Equal) if same_uid => Outcome::Unchanged,
            Some(Ordering::Greater) | None => self.replace(key, cur, item),
            // Older than the cache (or an equal RV of another incarnation).
            _ => {
                let cached_after_snapshot = matches!(
                    self.order(cur.resource_version(), list_rv),
                    Some(Ordering::Greater)
                );
                if cached_after_snapshot {
                    let reason = if same_uid {
                        StaleReason::OlderRv
                    } else {
                        StaleReason::OlderUid
                    };
                    Outcome::Stale(reason)
                } else {
                    return ListedOutcome::Disputed(Dispute {
                        listed: item,
                        kind: DisputeKind::OlderThanCache {
                            cached_rv: cur.resource_version().to_owned(),
                        },
                    });
                }
            }
        };
        ListedOutcome::Outcome(outcome)
    }

    /// Ends a complete consistent list at `list_rv` whose items (decodable
    /// or not) had the keys in `listed`:
    /// - live objects not listed become deletion candidates, unless newer
    ///   than the list (kept; not in rewind mode, where nothing newer exists);
    /// - tombstones and confirmations the list proves gone are released (the
    ///   list RV keeps replays out from now on);
    /// - the list RV is recorded.
    ///
    /// Returns the deletion candidates, and counts into `diff`.
    pub(crate) fn finish_list(
        &mut self,
        list_rv: &str,
        listed: &HashSet<ObjectKey>,
        mode: ListMode,
        diff: &mut ListDiff<T>,
    ) {
        let proven = |cache: &mut Self, horizon: &str| {
            matches!(
                cache.order(horizon, list_rv),
                Some(Ordering::Less | Ordering::Equal)
            )
        };
        // Release first, so the candidates this list makes are not released.
        let released: Vec<ObjectKey> = self
            .tombstones
            .iter()
            .filter(|(key, _)| !listed.contains(*key))
            .map(|(key, tomb)| (key.clone(), tomb.horizon().to_owned()))
            .collect::<Vec<_>>()
            .into_iter()
            .filter(|(_, horizon)| proven(self, horizon))
            .map(|(key, _)| key)
            .collect();
        for key in &released {
            self.tombstones.remove(key);
        }
        diff.released += released.len();
        let before = self.confirmed.len();
        let confirmed = std::mem::take(&mut self.confirmed);
        for (key, c) in confirmed {
            if listed.contains(&key) || !proven(self, &c.horizon) {
                self.confirmed.insert(key, c);
            }
        }
        diff.released += before - self.confirmed.len();

        let missing: Vec<(ObjectKey, Arc<T>)> = self
            .live
            .iter()
            .filter(|(key, _)| !listed.contains(*key))
            .map(|(key, obj)| (key.clone(), obj.clone()))
            .collect();
        for (key, cur) in missing {
            let newer = mode != ListMode::Rewind
                && matches!(
                    self.order(cur.resource_version(), list_rv),
                    Some(Ordering::Greater)
                );
            if newer {
                diff.kept_newer += 1;
                continue;
            }
            self.put_tombstone(
                key,
                cur.clone(),
                Some(list_rv.to_owned()),
                DeletionSource::MissingFromList,
                mode == ListMode::Rewind,
            );
            diff.deletion_candidates += 1;
            diff.changes.push(Change::DeletionCandidate(cur));
        }
        let newest = match (mode, self.list_rv.as_deref()) {
            (ListMode::Rewind, _) | (_, None) => list_rv.to_owned(),
            (_, Some(prev)) => max_rv(prev, list_rv).to_owned(),
        };
        self.list_rv = Some(newest);
        self.highest.observe(list_rv);
        self.note_count();
    }

    /// Settles a [`Dispute`] with what a read that reaches etcd found
    /// (`stamp` taken before the read was sent).
    pub(crate) fn resolve_dispute(
        &mut self,
        dispute: Dispute<T>,
        read: LiveRead<T>,
        stamp: &ReadStamp,
    ) -> Resolution<T> {
        let listed = dispute.listed;
        let key = listed.key();
        match (dispute.kind, read) {
            (DisputeKind::OlderThanCache { cached_rv }, LiveRead::Found(obj)) => {
                let same_as_listed = obj.uid() == listed.uid();
                let below_cache = matches!(
                    self.order(obj.resource_version(), &cached_rv),
                    Some(Ordering::Less)
                );
                if same_as_listed && below_cache {
                    return Resolution::Rewound;
                }
                // etcd has what the cache had (or newer): the list was stale.
                Resolution::Ghost(applied(self.restore(obj, stamp).outcome))
            }
            (DisputeKind::OlderThanCache { .. }, LiveRead::Gone) => {
                // Neither the cached copy nor the listed one exists.
                let cached_uid = self.live.get(&key).map(|c| c.uid().to_owned());
                let change = cached_uid.and_then(|uid| self.evict_ghost(&key, &uid));
                Resolution::Ghost(change)
            }
            (DisputeKind::DeletedByLiveRead, LiveRead::Found(obj)) => {
                if obj.uid() == listed.uid() {
                    // A deleted incarnation is back in etcd itself.
                    return Resolution::Rewound;
                }
                Resolution::Ghost(applied(self.restore(obj, stamp).outcome))
            }
            (DisputeKind::DeletedByLiveRead, LiveRead::Gone) => Resolution::StillGone,
        }
    }

    /// Counts leftover drift of an earlier resync that the watch never
    /// explained, and holds the differences of the resync list at `list_rv`
    /// (see [`Cache::settle_drift`]).
    pub(crate) fn hold_drift(
        &mut self,
        list_rv: &str,
        keys: HashMap<ObjectKey, DriftKind>,
    ) -> Vec<DriftKind> {
        let leftover = self.settle_all_drift();
        self.drift.list_rv = Some(list_rv.to_owned());
        self.drift.keys = keys;
        leftover
    }

    /// A watch event for `key` at `rv` explains a pending difference of a
    /// resync list at or after `rv`: the watch was only behind.
    pub(super) fn explain_drift(&mut self, key: &ObjectKey, rv: &str) {
        let Some(list_rv) = self.drift.list_rv.as_deref() else {
            return;
        };
        if self.drift.keys.contains_key(key)
            && matches!(
                compare_rv(rv, list_rv),
                Some(Ordering::Less | Ordering::Equal)
            )
        {
            self.drift.keys.remove(key);
        }
    }

    /// Once the watch has reached `progress_rv` at or past the resync list's
    /// RV, every difference no event explained is drift: returned (and
    /// forgotten) for counting.
    pub(crate) fn settle_drift(&mut self, progress_rv: &str) -> Vec<DriftKind> {
        let passed = self.drift.list_rv.as_deref().is_some_and(|list_rv| {
            matches!(
                compare_rv(progress_rv, list_rv),
                Some(Ordering::Greater | Ordering::Equal)
            )
        });
        if passed {
            self.settle_all_drift()
        } else {
            Vec::new()
        }
    }

    /// Every pending difference, returned as drift and forgotten.
    pub(crate) fn settle_all_drift(&mut self) -> Vec<DriftKind> {
        self.drift.list_rv = None;
        self.drift.keys.drain().map(|(_, kind)| kind).collect()
    }

    /// Differences of the last resync still waiting for the watch.
    #[cfg(test)]
    pub(crate) fn pending_drift(&self) -> usize {
        self.drift.keys.len()
    }
}

fn applied<T>(outcome: Outcome<T>) -> Option<Change<T>> {
    match outcome {
        Outcome::Applied(change) => Some(change),
        Outcome::Stale(_) | Outcome::Unchanged => None,
    }
}

#[cfg(test)]
#[path = "cache_list_tests.rs"]
mod tests;
