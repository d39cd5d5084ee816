//! The cache's list rules: a rewound store, disputes settled by live reads,
//! ghosts, releases by consistent lists, drift told from watch lag, and the
//! aging of deletion evidence.

use std::collections::HashMap;

use crate::cache::{
    Cache, Change, Confirmation, DriftKind, Outcome, StaleReason, WatchEventKind::*,
};
use crate::list::ListMode;
use crate::object::LiveRead;
use crate::object::{DisputeKind, Resolution};
use crate::testkit::{Obj, apply_list, cache_with, items, key, list_in, obj, rv_of};

/// A plain etcd restore: the store's revision is back at the backup's.
#[test]
fn a_list_below_the_known_rv_rewinds_the_cache_to_the_list() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "120");
    // After the backup (taken at 120): a changed, b deleted and confirmed,
    // c created.
    cache.apply_event(Modified, obj("a", "ua", "400"));
    cache.apply_event(Deleted, obj("b", "ub", "450"));
    assert!(cache.confirm_deleted(&key("b"), "ub", Confirmation::LiveRead));
    cache.apply_event(Added, obj("c", "uc", "480"));
    // The restored store lists at 130, below what we knew (480).
    let out = list_in(
        &mut cache,
        items(&[obj("a", "ua", "100"), obj("b", "ub", "110")]),
        "130",
        ListMode::Recover,
    );
    assert!(out.rewound);
    assert_eq!(out.mode, ListMode::Rewind);
    assert!(
        out.diff.disputes.is_empty(),
        "a rewind list settles nothing by reads"
    );
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("100"), "the list wins");
    assert_eq!(rv_of(&cache, "b").as_deref(), Some("110"), "b is back");
    assert!(cache.get(&key("c")).is_none());
    assert_eq!(
        out.diff.deletion_candidates, 1,
        "c is a candidate, not dropped"
    );
    assert_eq!(cache.confirmed_count(), 0, "history forgotten");
    assert_eq!(cache.highest_rv(), Some("130"));
    assert_eq!(cache.list_rv(), Some("130"));
    // Changes after the restore flow again.
    assert!(matches!(
        cache.apply_event(Modified, obj("a", "ua", "140")),
        Outcome::Applied(Change::Updated { .. })
    ));
}

/// The bump-revision restore: the list's RV is higher than anything known,
/// but restored objects keep their old RVs.
#[test]
fn an_older_incarnation_in_a_newer_list_is_disputed_not_applied() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "120");
    cache.apply_event(Modified, obj("a", "ua", "400"));
    let out = list_in(
        &mut cache,
        items(&[obj("a", "ua", "100")]),
        "1000500",
        ListMode::Recover,
    );
    assert!(!out.rewound);
    assert_eq!(out.diff.disputes.len(), 1);
    assert_eq!(
        out.diff.disputes[0].kind,
        DisputeKind::OlderThanCache {
            cached_rv: "400".into()
        }
    );
    assert_eq!(
        rv_of(&cache, "a").as_deref(),
        Some("400"),
        "not applied yet"
    );
}

#[test]
fn a_live_read_settles_a_dispute_as_rewind_stale_list_or_ghost() {
    let dispute_of = |cache: &mut Cache<Obj>| {
        let mut out = list_in(
            cache,
            items(&[obj("a", "ua", "100")]),
            "900",
            ListMode::Recover,
        );
        out.diff.disputes.remove(0)
    };
    let fresh = || {
        let mut cache = cache_with(vec![obj("a", "ua", "100")], "120");
        cache.apply_event(Modified, obj("a", "ua", "400"));
        cache
    };
    // etcd has the older version: the store was rewound.
    let mut cache = fresh();
    let dispute = dispute_of(&mut cache);
    let stamp = cache.read_stamp();
    let found = LiveRead::Found(obj("a", "ua", "100"));
    assert!(matches!(
        cache.resolve_dispute(dispute, found, &stamp),
        Resolution::Rewound
    ));
    // etcd has what we cached: the list was served stale (a lost update).
    let mut cache = fresh();
    let dispute = dispute_of(&mut cache);
    let stamp = cache.read_stamp();
    let found = LiveRead::Found(obj("a", "ua", "400"));
    assert!(matches!(
        cache.resolve_dispute(dispute, found, &stamp),
        Resolution::Ghost(None)
    ));
    assert_eq!(rv_of(&cache, "a").as_deref(), Some("400"));
    // etcd has neither: both are ghosts; ours goes.
    let mut cache = fresh();
    let dispute = dispute_of(&mut cache);
    let stamp = cache.read_stamp();
    let resolution = cache.resolve_dispute(dispute, LiveRead::Gone, &stamp);
    assert!(matches!(
        resolution,
        Resolution::Ghost(Some(Change::DeletionCandidate(_)))
    ));
    assert!(cache.get(&key("a")).is_none());
}

/// A watch cache that lost a DELETE keeps serving the object in every list;
/// once a live read confirmed it gone, lists do not bring it back.
#[test]
fn an_incarnation_confirmed_gone_by_a_live_read_is_disputed_by_later_lists() {
    let mut cache = cache_with(vec![obj("ghost", "ug", "100")], "120");
    let change = cache.evict_ghost(&key("ghost"), "ug");
    assert!(matches!(change, Some(Change::DeletionCandidate(_))));
    assert!(cache.get(&key("ghost")).is_none());
    let mut out = list_in(
        &mut cache,
        items(&[obj("ghost", "ug", "100")]),
        "300",
        ListMode::Resync,
    );
    assert_eq!(out.diff.added, 0);
    assert_eq!(out.diff.disputes.len(), 1);
    assert_eq!(out.diff.disputes[0].kind, DisputeKind::DeletedByLiveRead);
    assert_eq!(out.diff.released, 0, "a disputed confirmation is kept");
    let stamp = cache.read_stamp();
    let dispute = out.diff.disputes.remove(0);
    assert!(matches!(
        cache.resolve_dispute(dispute, LiveRead::Gone, &stamp),
        Resolution::StillGone
    ));
    assert!(cache.get(&key("ghost")).is_none());
    // ... but the same incarnation found in etcd means a restored store.
    let mut out = list_in(
        &mut cache,
        items(&[obj("ghost", "ug", "100")]),
        "310",
        ListMode::Resync,
    );
    let dispute = out.diff.disputes.remove(0);
    let found = LiveRead::Found(obj("ghost", "ug", "100"));
    assert!(matches!(
        cache.resolve_dispute(dispute, found, &stamp),
        Resolution::Rewound
    ));
}

#[test]
fn a_released_deletion_is_overruled_by_a_newer_list() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "120");
    cache.apply_event(Deleted, obj("a", "ua", "130"));
    assert!(cache.confirm_deleted(&key("a"), "ua", Confirmation::Released));
    let diff = apply_list(&mut cache, vec![obj("a", "ua", "100")], "300");
    assert!(diff.disputes.is_empty());
    assert_eq!(
        diff.added, 1,
        "released without a read: the list is the truth"
    );
}

#[test]
fn a_consistent_list_releases_the_tombstones_it_proves_gone() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "120");
    cache.apply_event(Deleted, obj("a", "ua", "130"));
    assert_eq!(cache.tombstone_count(), 1);
    let diff = apply_list(&mut cache, vec![obj("b", "ub", "100")], "200");
    assert_eq!(diff.released, 1);
    assert_eq!(cache.tombstone_count(), 0);
    // The list's RV keeps replays out.
    assert!(matches!(
        cache.apply_event(Added, obj("a", "ua", "100")),
        Outcome::Stale(StaleReason::AlreadyDeleted)
    ));
}

#[test]
fn resync_differences_are_drift_only_if_the_watch_never_explains_them() {
    let mut cache = cache_with(
        vec![
            obj("a", "ua", "100"),
            obj("b", "ub", "100"),
            obj("c", "uc", "100"),
        ],
        "120",
    );
    // The resync list at 300: b was deleted at 250 (its DELETE still on the
    // way), c was deleted at 200 and its DELETE lost, d was created at 280
    // (ADDED on the way).
    let out = list_in(
        &mut cache,
        items(&[obj("a", "ua", "100"), obj("d", "ud", "280")]),
        "300",
        ListMode::Resync,
    );
    assert!(out.leftover_drift.is_empty());
    assert_eq!(cache.pending_drift(), 3);
    assert!(
        cache.settle_drift("290").is_empty(),
        "the watch is not past 300"
    );
    // The overtaken events arrive: they explain b and d.
    cache.apply_event(Deleted, obj("b", "ub", "250"));
    cache.apply_event(Added, obj("d", "ud", "280"));
    assert_eq!(cache.pending_drift(), 1);
    // Once the watch is past the list, what is left is drift: c's lost DELETE.
    assert_eq!(cache.settle_drift("305"), vec![DriftKind::MissedDelete]);
    assert_eq!(cache.pending_drift(), 0);
}

#[test]
fn drift_the_watch_never_reached_is_counted_at_the_next_resync() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "120");
    list_in(&mut cache, items(&[]), "300", ListMode::Resync);
    assert_eq!(cache.pending_drift(), 1);
    let out = list_in(&mut cache, items(&[]), "400", ListMode::Resync);
    assert_eq!(out.leftover_drift, vec![DriftKind::MissedDelete]);
}

#[test]
fn held_drift_keys_come_from_the_list() {
    let mut cache = cache_with(vec![obj("a", "ua", "100")], "120");
    let leftover = cache.hold_drift("500", HashMap::from([(key("a"), DriftKind::MissedUpdate)]));
    assert!(leftover.is_empty());
    assert_eq!(cache.settle_all_drift(), vec![DriftKind::MissedUpdate]);
}

#[test]
fn old_tombstones_and_confirmations_age_out_by_ticks() {
    let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "120");
    cache.apply_event(Deleted, obj("a", "ua", "130"));
    cache.tick();
    assert!(cache.aged_tombstones(2).is_empty());
    cache.tick();
    assert_eq!(cache.aged_tombstones(2), vec![(key("a"), "ua".to_owned())]);
    assert!(cache.confirm_deleted(&key("a"), "ua", Confirmation::Released));
    cache.apply_event(Deleted, obj("b", "ub", "140"));
    assert!(cache.confirm_deleted(&key("b"), "ub", Confirmation::LiveRead));
    cache.tick();
    cache.tick();
    assert_eq!(
        cache.forget_confirmed(2, 12),
        1,
        "the released one goes first"
    );
    for _ in 0..10 {
        cache.tick();
    }
    assert_eq!(cache.forget_confirmed(2, 12), 1);
    assert_eq!(cache.confirmed_count(), 0);
}
