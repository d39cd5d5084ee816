//! The eight cases of "What a hardened watcher must survive"
//! (`shared/watch-failures.md`), each driven through machine + cache.

use std::time::Duration;

use super::cache::{Change, DeletionSource, Outcome, StaleReason, WatchEventKind::*};
use super::error::ApiErrorKind;
use super::machine::{Action, Phase, RestartReason};
use super::testutil::{Harness, key, obj};

/// 1. A DELETE (or any event) whose RV is older than the cached object's →
///    stale, ignored, counted.
#[test]
fn case1_event_older_than_cache_is_stale_ignored_and_counted() {
    let mut h = Harness::synced_with(vec![obj("web", "u1", "100")], "100");
    h.event(Modified, obj("web", "u1", "140"));
    assert!(matches!(
        h.event(Deleted, obj("web", "u1", "120")),
        Outcome::Stale(StaleReason::OlderRv)
    ));
    assert!(matches!(
        h.event(Modified, obj("web", "u1", "110")),
        Outcome::Stale(StaleReason::OlderRv)
    ));
    assert!(matches!(
        h.event(Added, obj("web", "u1", "100")),
        Outcome::Stale(StaleReason::OlderRv)
    ));
    assert_eq!(h.stale, vec![StaleReason::OlderRv; 3]);
    assert_eq!(h.data("web").as_deref(), Some("web@140"));
    assert!(h.deletion_candidates().is_empty());
}

/// 2. Failure A: a DELETE of an old object carries an old RV; the resume
///    point must not move back to it.
#[test]
fn case2_resume_point_never_goes_backwards_on_an_old_delete() {
    let mut h = Harness::synced_with(
        vec![obj("oldest", "u0", "10"), obj("new", "u9", "900")],
        "1000",
    );
    h.event(Added, obj("newer", "u10", "1010"));
    // Pre-#58547 server: the DELETE of the oldest Service carries RV 10.
    let out = h.event(Deleted, obj("oldest", "u0", "10"));
    assert!(
        matches!(out, Outcome::Applied(Change::DeletionCandidate(_))),
        "a real delete: {out:?}"
    );
    assert_eq!(h.regressions, 1);
    assert_eq!(h.machine.resume_rv(), Some("1010"));
    // The server closes the watch: resume from the highest RV, not from 10.
    h.machine.on_stream_end();
    h.expect_watch("1010");
    assert_eq!(h.cache.highest_rv(), Some("1010"));
}

/// 3. Replayed history (ADDED/DELETED of objects that exist now, old RVs) →
///    no deletion candidates for live objects, the cache still holds them.
#[test]
fn case3_replayed_history_deletes_no_live_object() {
    let live = vec![obj("a", "ua2", "500"), obj("b", "ub", "600")];
    let mut h = Harness::synced_with(live, "700");
    // A proxy resumed far back and replays: an older incarnation of "a"
    // created and deleted, "b" created, a long-gone "ghost" created/deleted.
    h.event(Added, obj("a", "ua1", "100"));
    h.event(Deleted, obj("a", "ua1", "200"));
    h.event(Added, obj("ghost", "ug", "250"));
    h.event(Deleted, obj("ghost", "ug", "260"));
    h.event(Added, obj("b", "ub", "300"));
    h.event(Added, obj("a", "ua2", "500"));
    assert!(h.deletion_candidates().is_empty(), "{:?}", h.changes);
    assert!(
        h.changes.is_empty(),
        "replay must change nothing: {:?}",
        h.changes
    );
    assert_eq!(h.cache.len(), 2);
    assert!(h.cache.get(&key("ghost")).is_none());
    assert_eq!(h.data("a").as_deref(), Some("a@500"));
    assert!(
        h.stale.contains(&StaleReason::OlderUid) && h.stale.contains(&StaleReason::AlreadyDeleted)
    );
    assert_eq!(h.machine.resume_rv(), Some("700"));
}

/// 4. ERROR 410 during the watch → consistent relist applied as a diff:
///    never empty in between; updated objects come out updated, removed
///    ones become deletion candidates.
#[test]
fn case4_error_410_during_watch_relists_and_applies_a_diff() {
    let start = vec![
        obj("keep", "uk", "100"),
        obj("change", "uc", "110"),
        obj("gone", "ug", "120"),
    ];
    let mut h = Harness::synced_with(start, "200");
    h.event(Modified, obj("keep", "uk", "210"));
    h.error_event(410, "Expired");
    assert_eq!(h.restarts, vec![RestartReason::Expired]);
    h.expect_list(None);
    // Two pages; the harness asserts the cache is untouched by each page.
    h.page(vec![obj("keep", "uk", "210")], Some("c1"), "900");
    assert_eq!(h.cache.len(), 3, "never empty, never partial");
    h.page(
        vec![obj("change", "uc", "800"), obj("fresh", "uf", "850")],
        None,
        "900",
    );
    assert_eq!(h.cache.len(), 3); // keep, change, fresh
    assert_eq!(h.data("keep").as_deref(), Some("keep@210"));
    assert_eq!(h.data("change").as_deref(), Some("change@800"));
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    let tomb = h
        .cache
        .tombstone(&key("gone"))
        .map(|t| (t.source, t.last_known.rv.clone()));
    assert_eq!(
        tomb,
        Some((DeletionSource::MissingFromList, "120".to_owned()))
    );
    h.expect_watch("900");
}

/// 4b. 410 when starting the watch (RV compacted while we were away).
#[test]
fn case4_error_410_at_watch_start_relists() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    assert_eq!(
        h.machine.on_watch_start_error(ApiErrorKind::Expired),
        RestartReason::Expired
    );
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], None, "5000");
    assert!(h.changes.is_empty());
    h.expect_watch("5000");
}

/// 5. ERROR 500 "etcd event received with PrevKv=nil" → relist, not resume;
///    the delete is learned from the list, with the last known state.
#[test]
fn case5_error_500_prevkv_nil_relists_and_learns_the_delete() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "150")], "200");
    h.event(Modified, obj("b", "ub", "250"));
    // The DELETE of "b" lost its previous value to compaction.
    h.error_event(500, "InternalError");
    assert_eq!(h.restarts, vec![RestartReason::WatchError500]);
    assert!(matches!(h.machine.phase(), Phase::Relisting { .. }));
    h.expect_list(None); // not Action::Watch
    h.page(vec![obj("a", "ua", "100")], None, "400");
    let last = h.changes.iter().find_map(|c| match c {
        Change::DeletionCandidate(o) => Some(o.data.clone()),
        _ => None,
    });
    assert_eq!(last.as_deref(), Some("b@250"), "last known state");
    assert!(h.cache.get(&key("a")).is_some());
}

/// 6. A lost DELETE → found by the periodic resync diff, confirmed by a live
///    read, and never resurrected by late or stale data.
#[test]
fn case6_lost_delete_found_by_resync_and_confirmed() {
    let mut h = Harness::synced_with(
        vec![obj("a", "ua", "100"), obj("ghost", "ug", "120")],
        "200",
    );
    h.event(Modified, obj("a", "ua", "300"));
    // The watch cache dropped ghost's DELETE (kubernetes#123072). Resync:
    let diff = h.cache.apply_list(vec![obj("a", "ua", "300")], "400");
    assert_eq!(diff.deletion_candidates, 1);
    assert!(matches!(&diff.changes[0], Change::DeletionCandidate(o) if o.key == key("ghost")));
    // The reconciler's live read: 404 → confirm.
    assert!(h.cache.confirm_deleted(&key("ghost"), "ug"));
    assert_eq!(h.cache.tombstone_count(), 0);
    // The lost DELETE shows up late, or history replays: nothing comes back.
    assert!(matches!(
        h.event(Deleted, obj("ghost", "ug", "350")),
        Outcome::Stale(_)
    ));
    assert!(matches!(
        h.event(Added, obj("ghost", "ug", "120")),
        Outcome::Stale(_)
    ));
    assert!(h.cache.get(&key("ghost")).is_none());
}

/// 7. A list is always consistent: Action::List never carries an RV (no
///    "0"); a stale list is never used for a deletion decision: objects newer
///    than the list are kept, older list items don't roll the cache back.
#[test]
fn case7_lists_are_consistent_and_a_stale_list_deletes_nothing() {
    let mut h = Harness::new();
    // Every path into a list: initial, 410, 500, continue-expired, connect.
    let mut lists = vec![h.machine.next_action()];
    h.page(
        vec![obj("a", "ua", "450"), obj("b", "ub", "480")],
        None,
        "500",
    );
    h.error_event(410, "Expired");
    lists.push(h.machine.next_action());
    h.page(
        vec![obj("a", "ua", "450"), obj("b", "ub", "480")],
        Some("c"),
        "500",
    );
    h.machine.on_list_error(ApiErrorKind::Expired);
    lists.push(h.machine.next_action());
    h.machine.on_connect_error();
    h.machine.on_backoff_elapsed();
    lists.push(h.machine.next_action());
    for action in lists {
        // The List action has no resourceVersion field at all: RV is unset.
        assert_eq!(
            action,
            Action::List {
                continue_token: None,
                limit: 500
            }
        );
    }
    // A list served from a stale cache (RV 300) cannot delete "b" (RV 480).
    h.page(
        vec![obj("a", "ua", "450"), obj("b", "ub", "480")],
        None,
        "500",
    );
    assert!(h.deletion_candidates().is_empty());
    let diff = h.cache.apply_list(vec![obj("a", "ua", "250")], "300");
    assert_eq!(diff.deletion_candidates, 0);
    assert_eq!(diff.kept_newer, 1);
    assert_eq!(diff.stale, vec![StaleReason::OlderRv]);
    assert_eq!(h.cache.len(), 2);
    assert_eq!(h.data("a").as_deref(), Some("a@450"));
}

/// 7b. An object missing from a list but created after its snapshot is kept.
#[test]
fn case7_object_newer_than_list_is_kept() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.event(Added, obj("new", "un", "260"));
    h.error_event(410, "Expired");
    h.page(vec![obj("a", "ua", "100")], None, "250");
    assert!(h.deletion_candidates().is_empty());
    assert!(h.cache.get(&key("new")).is_some());
    h.expect_watch("260");
}

/// 8. Connection cut mid-stream / server closed the watch / API server
///    restart → resume from the highest RV (after backoff for failures),
///    repeated failures keep backing off, nothing lost.
#[test]
fn case8_stream_end_resumes_from_highest_rv() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.machine.on_watch_started();
    h.event(Modified, obj("a", "ua", "130"));
    h.machine.on_bookmark("170");
    assert_eq!(h.machine.on_stream_end(), RestartReason::StreamEnded);
    h.expect_watch("170");
}

#[test]
fn case8_connection_cut_backs_off_then_resumes() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.machine.on_watch_started();
    h.event(Modified, obj("a", "ua", "130"));
    assert_eq!(h.machine.on_connect_error(), RestartReason::ConnectError);
    assert_eq!(
        h.machine.next_action(),
        Action::Backoff(Duration::from_secs(1))
    );
    h.machine.on_backoff_elapsed();
    h.expect_watch("130");
    // API server restarting: the watch request fails repeatedly.
    assert_eq!(
        h.machine.on_watch_start_error(ApiErrorKind::Connect),
        RestartReason::ConnectError
    );
    assert_eq!(
        h.machine.next_action(),
        Action::Backoff(Duration::from_secs(2))
    );
    h.machine.on_backoff_elapsed();
    h.machine.on_watch_start_error(ApiErrorKind::Transient(503));
    assert_eq!(
        h.machine.next_action(),
        Action::Backoff(Duration::from_secs(3))
    );
    h.machine.on_backoff_elapsed();
    h.expect_watch("130");
    // Back: events flow again, nothing was dropped from the cache meanwhile.
    h.machine.on_watch_started();
    h.event(Modified, obj("a", "ua", "140"));
    assert_eq!(h.data("a").as_deref(), Some("a@140"));
    // And if the RV was compacted during the outage: relist.
    h.machine.on_connect_error();
    h.machine.on_backoff_elapsed();
    h.machine.on_watch_start_error(ApiErrorKind::Expired);
    h.expect_list(None);
}

#[test]
fn case8_connect_error_before_first_list_relists() {
    let mut h = Harness::new();
    h.machine.on_connect_error();
    assert!(matches!(h.machine.next_action(), Action::Backoff(_)));
    h.machine.on_backoff_elapsed();
    h.expect_list(None);
}
