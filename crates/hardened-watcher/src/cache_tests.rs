//! Cache guard tests: RV and UID rules, tombstones, list diffs, live-read
//! repairs, store rewinds, disputes, drift and aging.

use crate::cache::{Change, Confirmation, DeletionSource, Outcome, StaleReason, WatchEventKind::*};
use crate::list::{ListDiffBuilder, ListMode};
use crate::testkit::{
    Obj, apply_list, apply_list_with_unknown, cache_with, items, key, obj, rv_of,
};

fn is_candidate(outcome: &Outcome<Obj>) -> bool {
    matches!(outcome, Outcome::Applied(Change::DeletionCandidate(_)))
}

#[test]
fn newer_modified_updates_and_older_is_stale() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    assert!(matches!(
        cache.apply_event(Modified, obj("a", "ua", "120")),
        Outcome::Applied(Change::Updated { .. })
    ));
    assert!(matches!(
        cache.apply_event(Modified, obj("a", "ua", "110")),
        Outcome::Stale(StaleReason::OlderRv)
    ));
    assert!(matches!(
        cache.apply_event(Added, obj("a", "ua", "120")),
        Outcome::Unchanged
    ));
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("120"));
}

#[test]
fn delete_moves_to_tombstone_with_last_known_state() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    let out = cache.apply_event(Deleted, obj("a", "ua", "130"));
    let Outcome::Applied(Change::DeletionCandidate(last)) = out else {
        panic!("want candidate, got {out:?}")
    };
    assert_eq!(last.rv, "130");
    assert!(cache.get(&key("a")).is_none());
    let tomb = cache
        .tombstone(&key("a"))
        .map(|t| (t.source, t.observed_rv.clone()));
    assert_eq!(
        tomb,
        Some((DeletionSource::WatchDelete, Some("130".to_owned())))
    );
    assert_eq!(cache.tombstone_count(), 1);
}

#[test]
fn delete_with_same_rv_as_cached_is_a_real_delete() {
    // Servers before kubernetes#58547 send the object's last RV on DELETE.
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    assert!(is_candidate(
        &cache.apply_event(Deleted, obj("a", "ua", "100"))
    ));
}

#[test]
fn replayed_added_of_tombstoned_object_is_stale() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    cache.apply_event(Deleted, obj("a", "ua", "130"));
    assert!(matches!(
        cache.apply_event(Added, obj("a", "ua", "100")),
        Outcome::Stale(StaleReason::AlreadyDeleted)
    ));
    assert!(matches!(
        cache.apply_event(Deleted, obj("a", "ua", "130")),
        Outcome::Stale(StaleReason::AlreadyDeleted)
    ));
    assert!(cache.get(&key("a")).is_none());
}

#[test]
fn uid_replacement_new_incarnation_wins_and_old_late_delete_is_stale() {
    let mut cache = cache_with(vec![obj("a", "old", "100")], "100");
    // Deleted and re-created under the same name; we only see the new ADDED.
    let out = cache.apply_event(Added, obj("a", "new", "150"));
    let Outcome::Applied(Change::Updated { old, new }) = out else {
        panic!("want replacement, got {out:?}")
    };
    assert_eq!((old.uid.as_str(), new.uid.as_str()), ("old", "new"));
    // The old incarnation's DELETE arrives late (deletion RV 120 < 150).
    assert!(matches!(
        cache.apply_event(Deleted, obj("a", "old", "120")),
        Outcome::Stale(StaleReason::OlderUid)
    ));
    // And a replayed ADDED of the old incarnation too.
    assert!(matches!(
        cache.apply_event(Added, obj("a", "old", "100")),
        Outcome::Stale(StaleReason::OlderUid)
    ));
    assert_eq!(
        cache.get(&key("a")).map(|o| o.uid.clone()).as_deref(),
        Some("new")
    );
}

#[test]
fn uid_replacement_after_tombstone_revives_with_new_uid() {
    let mut cache = cache_with(vec![obj("a", "old", "100")], "100");
    cache.apply_event(Deleted, obj("a", "old", "120"));
    assert!(matches!(
        cache.apply_event(Added, obj("a", "new", "150")),
        Outcome::Applied(Change::Added(_))
    ));
    assert!(cache.tombstone(&key("a")).is_none());
}

#[test]
fn delete_of_a_newer_incarnation_tombstones_the_ghost() {
    // We missed: DELETE old (rv 110), ADDED new (rv 150). Then new is deleted.
    let mut cache = cache_with(vec![obj("a", "old", "100")], "100");
    assert!(is_candidate(
        &cache.apply_event(Deleted, obj("a", "new", "160"))
    ));
    assert!(cache.get(&key("a")).is_none());
}

#[test]
fn opaque_rvs_fall_back_to_accepting_and_are_counted() {
    let mut cache = cache_with(vec![obj("a", "ua", "x1")], "l1");
    assert!(matches!(
        cache.apply_event(Modified, obj("a", "ua", "x0")),
        Outcome::Applied(Change::Updated { .. })
    ));
    assert!(cache.opaque_rv_count() >= 1);
    // The rule for UIDs still holds without an order: a DELETE for another UID is stale.
    assert!(matches!(
        cache.apply_event(Deleted, obj("a", "other", "zz")),
        Outcome::Stale(StaleReason::OlderUid)
    ));
}

/// Our own writes (and live reads) land in the cache while a list is under
/// way; the list's snapshot predates them.
#[test]
fn list_keeps_objects_written_after_its_snapshot() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
    let stamp = cache.read_stamp();
    cache.restore(obj("late", "ul", "250"), &stamp);
    builder.apply_page(&mut cache, items(&[obj("a", "ua", "100")]), "200");
    let diff = builder.finish(&mut cache).diff;
    assert_eq!(diff.kept_newer, 1);
    assert_eq!(diff.deletion_candidates, 0);
    assert!(cache.get(&key("late")).is_some());
}

#[test]
fn list_racing_with_a_write_does_not_roll_objects_back() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
    let stamp = cache.read_stamp();
    cache.restore(obj("a", "ua", "300"), &stamp);
    // The list's snapshot (250) is older than what our write returned for "a".
    builder.apply_page(&mut cache, items(&[obj("a", "ua", "200")]), "250");
    let diff = builder.finish(&mut cache).diff;
    assert_eq!(diff.stale, vec![StaleReason::OlderRv]);
    assert!(diff.disputes.is_empty());
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("300"));
}

#[test]
fn list_taken_before_a_delete_learned_meanwhile_does_not_resurrect_it() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
    cache.apply_event(Deleted, obj("a", "ua", "300"));
    builder.apply_page(&mut cache, items(&[obj("a", "ua", "100")]), "250");
    let diff = builder.finish(&mut cache).diff;
    assert_eq!(diff.stale, vec![StaleReason::AlreadyDeleted]);
    assert!(cache.get(&key("a")).is_none());
    assert!(cache.tombstone(&key("a")).is_some());
}

#[test]
fn confirm_deleted_drops_tombstone_and_blocks_older_resurrection() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    // A list is under way when the delete arrives and is confirmed.
    let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
    cache.apply_event(Deleted, obj("a", "ua", "300"));
    assert!(
        !cache.confirm_deleted(&key("a"), "someone-else", Confirmation::LiveRead),
        "wrong UID: keep the tombstone"
    );
    assert!(cache.confirm_deleted(&key("a"), "ua", Confirmation::LiveRead));
    assert_eq!(cache.tombstone_count(), 0);
    // A list from before the deletion, and a replayed ADDED, cannot bring it back.
    builder.apply_page(&mut cache, items(&[obj("a", "ua", "100")]), "250");
    let diff = builder.finish(&mut cache).diff;
    assert_eq!(diff.added, 0);
    assert!(matches!(
        cache.apply_event(Added, obj("a", "ua", "100")),
        Outcome::Stale(StaleReason::AlreadyDeleted)
    ));
    // A newer list without it ends the need to remember; a re-creation is fine.
    let diff = apply_list(&mut cache, vec![], "400");
    assert_eq!(diff.released, 1);
    assert_eq!(cache.confirmed_count(), 0);
    assert!(matches!(
        cache.apply_event(Added, obj("a", "u2", "450")),
        Outcome::Applied(Change::Added(_))
    ));
}

#[test]
fn restore_puts_back_an_object_missing_from_a_list() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    let diff = apply_list(&mut cache, vec![], "200");
    assert_eq!(diff.deletion_candidates, 1);
    // The live read shows it exists, unchanged: the list lacked it. A list at
    // 200 without an object of RV 100 that exists is not a healthy store's:
    // the read is taken and a relist asked for.
    let stamp = cache.read_stamp();
    let restored = cache.restore(obj("a", "ua", "100"), &stamp);
    assert!(matches!(
        restored.outcome,
        Outcome::Applied(Change::Added(_))
    ));
    assert!(restored.rewind_suspected);
    assert!(cache.get(&key("a")).is_some());
    assert_eq!(cache.tombstone_count(), 0);
}

#[test]
fn restore_loses_against_a_later_watch_delete() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    // A live read sent before the delete, answered after it.
    let stamp = cache.read_stamp();
    cache.apply_event(Deleted, obj("a", "ua", "300"));
    let restored = cache.restore(obj("a", "ua", "100"), &stamp);
    assert!(matches!(
        restored.outcome,
        Outcome::Stale(StaleReason::AlreadyDeleted)
    ));
    assert!(!restored.rewind_suspected);
    assert!(cache.get(&key("a")).is_none());
}

#[test]
fn a_live_read_older_than_what_was_known_before_it_wins_and_is_flagged() {
    // The 409 refresh after a plain etcd restore: we cached a@400 (written
    // after the backup); etcd now has a@200.
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
    cache.apply_event(Modified, obj("a", "ua", "400"));
    let stamp = cache.read_stamp();
    let restored = cache.restore(obj("a", "ua", "200"), &stamp);
    assert!(matches!(
        restored.outcome,
        Outcome::Applied(Change::Updated { .. })
    ));
    assert!(restored.rewind_suspected);
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("200"));
    // But a read older than a watch event that arrived after it was sent loses.
    let stamp = cache.read_stamp();
    cache.apply_event(Modified, obj("a", "ua", "500"));
    let restored = cache.restore(obj("a", "ua", "450"), &stamp);
    assert!(matches!(
        restored.outcome,
        Outcome::Stale(StaleReason::OlderRv)
    ));
    assert!(!restored.rewind_suspected);
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("500"));
}

#[test]
fn unknown_keys_in_a_list_never_become_candidates() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("bad", "ub", "90")], "100");
    let unknown = [key("bad")].into_iter().collect();
    let diff = apply_list_with_unknown(&mut cache, vec![obj("a", "ua", "100")], "200", &unknown);
    assert_eq!(diff.deletion_candidates, 0);
    assert!(cache.get(&key("bad")).is_some());
}

#[test]
fn highest_rv_tracks_objects_lists_and_bookmarks() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "150");
    cache.apply_event(Deleted, obj("z", "uz", "20"));
    assert_eq!(cache.highest_rv(), Some("150"));
    cache.apply_event(Added, obj("b", "ub", "170"));
    assert_eq!(cache.highest_rv(), Some("170"));
    cache.note_bookmark("190");
    assert_eq!(cache.highest_rv(), Some("190"));
    assert_eq!(cache.list_rv(), Some("150"));
}

#[test]
fn the_count_at_a_revision_follows_creations_and_deletions_not_updates() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
    cache.apply_event(Added, obj("c", "uc", "110"));
    cache.apply_event(Modified, obj("a", "ua", "115"));
    cache.apply_event(Deleted, obj("b", "ub", "120"));
    // A replayed DELETE changes nothing.
    cache.apply_event(Deleted, obj("b", "ub", "120"));
    assert_eq!(cache.count_at(99), None, "before the list");
    assert_eq!(cache.count_at(100), Some(2));
    assert_eq!(cache.count_at(112), Some(3));
    assert_eq!(cache.count_at(120), Some(2));
    assert_eq!(cache.count_at(121), None, "not reached yet");
    cache.apply_event(Modified, obj("a", "ua", "130"));
    assert_eq!(cache.count_at(125), Some(2));
}

#[test]
fn a_ghost_counts_until_it_is_evicted_and_a_rewind_forgets_the_counts() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("g", "ug", "90")], "100");
    cache.apply_event(Modified, obj("a", "ua", "140"));
    // etcd deleted g at 110; the watch never said so: every count from the
    // list on holds it, and a count at 120 in etcd would be one lower.
    assert_eq!(cache.count_at(120), Some(2));
    cache.evict_ghost(&key("g"), "ug");
    assert_eq!(cache.count_at(120), Some(2), "evicted at 140, not before");
    assert_eq!(cache.count_at(140), Some(1));
    // etcd restored from a backup taken at 50: a list there starts over.
    crate::testkit::list_in(
        &mut cache,
        items(&[obj("a", "ua", "40")]),
        "50",
        ListMode::Recover,
    );
    assert_eq!(
        cache.count_at(120),
        None,
        "history after the rewind is gone"
    );
    assert_eq!(cache.count_at(50), Some(1));
}
