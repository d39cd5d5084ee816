//! How many objects the cache held at each revision it has passed: what the
//! store's count at an older revision should be, if the watch missed nothing.
//!
//! A LIST with `limit=1` at an exact revision that kube-apiserver's watch
//! cache no longer covers is answered by etcd, and its `remainingItemCount`
//! is etcd's count at that revision (see `count.rs`). Set against what the
//! cache held at the same revision, it says whether the watch lost a
//! creation or a deletion before it, for the price of a one-item read.
//! Equal counts do not prove equal contents (a lost creation and a lost
//! deletion cancel out; a lost update does not count at all): a caller
//! still lists in full now and then.
//!
//! The cache moves through revisions in order (watch events, a finished
//! list), so the count at revision R is the count recorded last at or
//! below R, provided the cache has passed R. Only changes of the count are
//! recorded, each at the revision the cache had reached when it was made.
//! A count made between two revisions (a page of a list, a live read) is
//! recorded at the revision the cache had reached then, which can only make
//! a count at an older revision differ, and so cost a full list, never
//! hide one.

use std::collections::VecDeque;

/// Recorded changes kept at most: about two compaction intervals of
/// creations and deletions at 100 a second. Older ones are dropped first.
const KEPT: usize = 1 << 16;

/// The count of objects at the revisions it changed at (pure).
#[derive(Clone, Debug, Default)]
pub(crate) struct CountJournal {
    /// (revision, count from that revision on), revisions ascending.
    entries: VecDeque<(u64, u64)>,
}

impl CountJournal {
    /// The cache holds `count` objects (its own and those the last list
    /// could not decode) having reached `revision` (`None`: not a number,
    /// so nothing can be said about any revision).
    pub(crate) fn record(&mut self, revision: Option<u64>, count: u64) {
        let Some(revision) = revision else {
            self.entries.clear();
            return;
        };
        if let Some(&(last_revision, last_count)) = self.entries.back() {
            if last_count == count {
                return;
            }
            if revision < last_revision {
                // The store went back (a rewind): the old history is moot.
                self.entries.clear();
            } else if revision == last_revision {
                self.entries.pop_back();
            }
        }
        self.entries.push_back((revision, count));
        if self.entries.len() > KEPT {
            self.entries.pop_front();
        }
    }

    /// Forgets every count: the cache starts over from a list.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The count at `revision`, given that the cache has reached `reached`;
    /// `None` when the cache has not passed `revision` yet or the journal
    /// does not go back that far.
    pub(crate) fn at(&self, revision: u64, reached: Option<u64>) -> Option<u64> {
        if reached.is_none_or(|reached| reached < revision) {
            return None;
        }
        let after = self.entries.partition_point(|&(r, _)| r <= revision);
        let index = after.checked_sub(1)?;
        self.entries.get(index).map(|&(_, count)| count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_at_a_revision_is_the_last_one_recorded_at_or_below_it() {
        let mut journal = CountJournal::default();
        journal.record(Some(100), 5); // a list at 100
        journal.record(Some(105), 5); // a MODIFIED: no entry
        journal.record(Some(110), 6); // an ADDED
        journal.record(Some(120), 5); // a DELETED
        let reached = Some(130);
        assert_eq!(journal.at(99, reached), None, "before the first list");
        assert_eq!(journal.at(100, reached), Some(5));
        assert_eq!(journal.at(109, reached), Some(5));
        assert_eq!(journal.at(110, reached), Some(6));
        assert_eq!(journal.at(119, reached), Some(6));
        assert_eq!(journal.at(125, reached), Some(5));
        assert_eq!(journal.at(130, reached), Some(5));
        assert_eq!(journal.at(131, reached), None, "not reached yet");
        assert_eq!(journal.at(125, None), None);
    }

    #[test]
    fn changes_at_one_revision_keep_the_last_count() {
        let mut journal = CountJournal::default();
        journal.record(Some(100), 5);
        journal.record(Some(110), 7);
        journal.record(Some(110), 6);
        assert_eq!(journal.at(110, Some(110)), Some(6));
        assert_eq!(journal.at(109, Some(110)), Some(5));
    }

    #[test]
    fn a_store_gone_back_or_an_opaque_revision_forgets_the_history() {
        let mut journal = CountJournal::default();
        journal.record(Some(100), 5);
        journal.record(Some(90), 4);
        assert_eq!(journal.at(95, Some(100)), Some(4));
        assert_eq!(journal.at(89, Some(100)), None);
        journal.record(None, 4);
        assert_eq!(journal.at(95, Some(100)), None);
        journal.record(Some(120), 3);
        journal.clear();
        assert_eq!(journal.at(120, Some(120)), None);
    }

    #[test]
    fn the_oldest_changes_go_first_when_too_many_are_kept() {
        let mut journal = CountJournal::default();
        let kept = u64::try_from(KEPT).unwrap_or(u64::MAX);
        for revision in 1..=kept + 10 {
            journal.record(Some(revision), revision % 2);
        }
        let reached = Some(kept + 10);
        assert_eq!(journal.at(10, reached), None);
        assert_eq!(journal.at(11, reached), Some(1));
        assert_eq!(journal.at(kept + 10, reached), Some(0));
    }
}
