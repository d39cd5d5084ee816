//! Repairs the rest of a program makes to a [`Cache`] from reads that reach
//! etcd: confirmed deletions, objects read live (the truth, stamped against
//! races), ghosts the API server's watch cache kept; and the aging of
//! deletion evidence.

use std::cmp::Ordering;

use super::cache::{Cache, Confirmed, ReadStamp, Restored};
use super::object::ObjectKey;
use super::object::{Cached, Change, Confirmation, Outcome, StaleReason};
use super::rv::{compare_rv, max_rv};

impl<T: Cached> Cache<T> {
    /// A live read showed the object gone (or replaced by another UID), or
    /// nothing is at stake: drop the tombstone of incarnation `uid`. Returns
    /// whether one was dropped. The deletion stays remembered until a newer
    /// list covers it, so a list taken before the deletion cannot resurrect
    /// the object.
    pub(crate) fn confirm_deleted(
        &mut self,
        key: &ObjectKey,
        uid: &str,
        how: Confirmation,
    ) -> bool {
        let matches = self
            .tombstones
            .get(key)
            .is_some_and(|tomb| tomb.last_known.uid() == uid);
        if !matches {
            return false;
        }
        if let Some(tomb) = self.tombstones.remove(key) {
            let horizon = tomb.horizon().to_owned();
            self.remember_gone(key.clone(), uid, &horizon, how);
        }
        true
    }

    fn remember_gone(&mut self, key: ObjectKey, uid: &str, horizon: &str, how: Confirmation) {
        let horizon = match self.highest.get() {
            // The confirmation came after everything seen so far.
            Some(highest) => max_rv(horizon, highest).to_owned(),
            None => horizon.to_owned(),
        };
        let born = self.tick;
        self.confirmed.insert(
            key,
            Confirmed {
                horizon,
                uid: uid.to_owned(),
                how,
                born,
            },
        );
    }

    /// Where the cache stands before a live read is sent; pass it to
    /// [`Cache::restore`] with the read's answer.
    pub(crate) fn read_stamp(&self) -> ReadStamp {
        ReadStamp(self.highest.get().map(str::to_owned))
    }

    /// Whether `rv` was learned after `stamp` was taken (unknowable orders
    /// count as before: the read wins).
    fn after_stamp(&self, rv: &str, stamp: &ReadStamp) -> bool {
        stamp
            .0
            .as_deref()
            .is_some_and(|at| compare_rv(rv, at) == Some(Ordering::Greater))
    }

    /// Puts an object read live (a GET with resourceVersion unset, or the
    /// answer to our own write) into the cache. The read is the truth, except
    /// against what the cache learned after `stamp` (a watch event newer than
    /// the read). A read older than what the cache knew before it was sent is
    /// still taken, and flagged: see [`Restored::rewind_suspected`].
    pub(crate) fn restore(&mut self, obj: T, stamp: &ReadStamp) -> Restored<T> {
        let restored = self.restore_guarded(obj, stamp);
        self.note_count();
        restored
    }

    fn restore_guarded(&mut self, obj: T, stamp: &ReadStamp) -> Restored<T> {
        self.highest.observe(obj.resource_version());
        let key = obj.key();
        let older_than = |cache: &mut Self, known: &str| {
            matches!(
                cache.order(obj.resource_version(), known),
                Some(Ordering::Less)
            )
        };
        if let Some(cur) = self.live.get(&key).cloned() {
            let ord = self.order(obj.resource_version(), cur.resource_version());
            if ord == Some(Ordering::Equal) && obj.uid() == cur.uid() {
                return restored(Outcome::Unchanged, false);
            }
            if ord == Some(Ordering::Less) {
                if self.after_stamp(cur.resource_version(), stamp) {
                    let reason = if obj.uid() == cur.uid() {
                        StaleReason::OlderRv
                    } else {
                        StaleReason::OlderUid
                    };
                    return restored(Outcome::Stale(reason), false);
                }
                return restored(self.replace(key, cur, obj), true);
            }
            return restored(self.replace(key, cur, obj), false);
        }
        let evidence = match self.tombstones.get(&key) {
            Some(tomb) => Some(tomb.horizon().to_owned()),
            None => self.confirmed.get(&key).map(|c| c.horizon.clone()),
        };
        let Some(horizon) = evidence else {
            return restored(self.revive(key, obj), false);
        };
        let newer = matches!(
            self.order(obj.resource_version(), &horizon),
            Some(Ordering::Greater)
        );
        if !newer && self.after_stamp(&horizon, stamp) {
            // The deletion was learned after the read was sent: it is newer.
            return restored(Outcome::Stale(StaleReason::AlreadyDeleted), false);
        }
        let suspicious = older_than(self, &horizon);
        restored(self.revive(key, obj), suspicious)
    }

    /// Two live reads found the object gone while the cache still holds
    /// incarnation `uid`: the API server's watch cache lost its DELETE. The
    /// object leaves the cache as confirmed gone (no further read needed);
    /// the returned change tells the controller.
    pub(crate) fn evict_ghost(&mut self, key: &ObjectKey, uid: &str) -> Option<Change<T>> {
        let cur = self.live.get(key).cloned()?;
        if cur.uid() != uid {
            return None;
        }
        self.drop_live(key);
        self.note_count();
        self.tombstones.remove(key);
        let horizon = cur.resource_version().to_owned();
        self.remember_gone(key.clone(), uid, &horizon, Confirmation::LiveRead);
        Some(Change::DeletionCandidate(cur))
    }

    /// Advances the age of tombstones and confirmations by one (the
    /// controller calls it on a timer).
    pub(crate) fn tick(&mut self) {
        self.tick += 1;
    }

    /// Tombstones made at least `ticks` ticks ago, as (key, uid): candidates
    /// that nobody confirmed, for the controller to release when nothing
    /// names them.
    pub fn aged_tombstones(&self, ticks: u64) -> Vec<(ObjectKey, String)> {
        self.tombstones
            .iter()
            .filter(|(_, t)| self.tick.saturating_sub(t.born) >= ticks)
            .map(|(k, t)| (k.clone(), t.last_known.uid().to_owned()))
            .collect()
    }

    /// Forgets confirmations made at least `released_ticks` ticks ago
    /// ([`Confirmation::Released`]) or `live_read_ticks` ago (by a live read,
    /// which also keeps ghosts out of lists): by then the history they guard
    /// against is out of every watch window. Returns how many went.
    pub(crate) fn forget_confirmed(&mut self, released_ticks: u64, live_read_ticks: u64) -> usize {
        let before = self.confirmed.len();
        let now = self.tick;
        self.confirmed.retain(|_, c| {
            let limit = match c.how {
                Confirmation::Released => released_ticks,
                Confirmation::LiveRead => live_read_ticks,
            };
            now.saturating_sub(c.born) < limit
        });
        before - self.confirmed.len()
    }
}

fn restored<T>(outcome: Outcome<T>, rewind_suspected: bool) -> Restored<T> {
    Restored {
        outcome,
        rewind_suspected,
    }
}
