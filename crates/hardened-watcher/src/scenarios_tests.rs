//! The cases of "What a hardened watcher must survive"
//! (the crate documentation's table of failures), each driven through the [`WatchCore`](super::core::WatchCore)
//! the driver runs: pages, events, bookmarks and live reads in; changes,
//! counters and the next step out.

use std::time::Duration;

use super::cache::{Change, DeletionSource, Outcome, StaleReason, WatchEventKind::*};
use super::core::Step;
use super::machine::{Action, Phase, RestartReason};
use super::object::LiveRead;
use super::testkit::{Harness, Logged, api_error, apply_list, key, logged, obj, throttled_error};

fn connect_error() -> kube::Error {
    kube::Error::Service("connection refused".into())
}

/// The one "the store was rewound" line among `events`.
fn rewind_line(events: &[Logged]) -> &Logged {
    let lines: Vec<&Logged> = events
        .iter()
        .filter(|e| e.message.starts_with("the store was rewound"))
        .collect();
    assert_eq!(lines.len(), 1, "{events:?}");
    lines[0]
}

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
    assert_eq!(h.stale(), vec![(StaleReason::OlderRv, 3)]);
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
    assert_eq!(h.count("rv_regression"), 1);
    assert_eq!(h.core.machine().resume_rv(), Some("1010"));
    // The server closes the watch: resume from the highest RV, not from 10.
    h.core.on_watch_started();
    h.core.on_stream_end();
    h.core.on_backoff_elapsed();
    h.expect_watch("1010");
    assert_eq!(h.store.read().highest_rv(), Some("1010"));
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
    assert!(h.deletion_candidates().is_empty(), "{:?}", h.changes());
    assert!(
        h.changes().is_empty(),
        "replay must change nothing: {:?}",
        h.changes()
    );
    assert_eq!(h.store.read().len(), 2);
    assert!(h.store.get(&key("ghost")).is_none());
    assert_eq!(h.data("a").as_deref(), Some("a@500"));
    let stale: Vec<_> = h.stale().into_iter().map(|(r, _)| r).collect();
    assert!(stale.contains(&StaleReason::OlderUid) && stale.contains(&StaleReason::AlreadyDeleted));
    assert_eq!(h.core.machine().resume_rv(), Some("700"));
}

/// 4. ERROR 410 during the watch → consistent relist applied as a diff,
///    page by page: never empty in between, a page never removes anything;
///    updated objects come out updated, removed ones become deletion
///    candidates when the list ends.
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
    assert_eq!(h.restarts(RestartReason::Expired), 1);
    h.expect_list(None);
    h.page(vec![obj("keep", "uk", "210")], Some("c1"), "900");
    assert_eq!(h.store.read().len(), 3, "never empty, never partial");
    h.expect_list(Some("c1"));
    h.page(
        vec![obj("change", "uc", "800"), obj("fresh", "uf", "850")],
        None,
        "900",
    );
    assert_eq!(h.store.read().len(), 3); // keep, change, fresh
    assert_eq!(h.data("keep").as_deref(), Some("keep@210"));
    assert_eq!(h.data("change").as_deref(), Some("change@800"));
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    let tomb = h
        .store
        .read()
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
    h.core.on_watch_start_error(&api_error(410, "Expired"));
    assert_eq!(h.restarts(RestartReason::Expired), 1);
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], None, "5000");
    assert!(h.changes().is_empty());
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
    assert_eq!(h.restarts(RestartReason::WatchError500), 1);
    assert!(matches!(h.core.machine().phase(), Phase::Relisting { .. }));
    h.expect_list(None); // not a watch
    h.page(vec![obj("a", "ua", "100")], None, "400");
    let last = h.changes().iter().find_map(|c| match c {
        Change::DeletionCandidate(o) => Some(o.data.clone()),
        _ => None,
    });
    assert_eq!(last.as_deref(), Some("b@250"), "last known state");
    assert!(h.store.get(&key("a")).is_some());
}

/// 6. A lost DELETE → found by the periodic resync, confirmed by a live
///    read, never resurrected by late or stale data, and counted as drift
///    only once the watch has passed the list without explaining it.
#[test]
fn case6_lost_delete_found_by_resync_and_confirmed() {
    let mut h = Harness::synced_with(
        vec![obj("a", "ua", "100"), obj("ghost", "ug", "120")],
        "200",
    );
    h.event(Modified, obj("a", "ua", "300"));
    // The watch cache dropped ghost's DELETE (kubernetes#123072). Resync,
    // exactly at the store's revision: the API server that knows its cache
    // is inconsistent answers from etcd, where ghost is gone.
    let (reply, _answer) = tokio::sync::oneshot::channel();
    h.core.on_request(super::store::Request::Resync(reply));
    h.expect_resync_list("300");
    h.page(vec![obj("a", "ua", "300")], None, "300");
    assert_eq!(h.deletion_candidates(), vec![key("ghost")]);
    h.expect_watch("300");
    // The reconciler's live read: 404 → confirm.
    assert!(
        h.store
            .confirm_deleted(&key("ghost"), "ug", super::cache::Confirmation::LiveRead)
    );
    assert_eq!(h.store.read().tombstone_count(), 0);
    // The lost DELETE shows up late, or history replays: nothing comes back.
    assert!(matches!(
        h.event(Deleted, obj("ghost", "ug", "350")),
        Outcome::Stale(_)
    ));
    assert!(matches!(
        h.event(Added, obj("ghost", "ug", "120")),
        Outcome::Stale(_)
    ));
    assert!(h.store.get(&key("ghost")).is_none());
}

/// 6c. Only a resync's first page asks for a resourceVersion, exactly the
///     store's revision as a one-item probe just read it: never a continue
///     page, never the first list or a relist after a watch error; a
///     refusal, a failed probe or a revision below the cache's mark (a
///     rewind) makes that resync list the latest state, and the next one
///     asks again.
#[test]
fn resync_lists_ask_for_the_stores_revision_exactly() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "200");
    h.event(Modified, obj("a", "ua", "250"));
    let resync = |h: &mut Harness| {
        let (reply, _answer) = tokio::sync::oneshot::channel();
        h.core.on_request(super::store::Request::Resync(reply));
    };
    resync(&mut h);
    h.expect_resync_list("270");
    h.page(vec![], Some("c1"), "270");
    h.expect_list(Some("c1"));
    h.page(vec![obj("a", "ua", "250")], None, "270");
    h.expect_watch("250");
    // Refused: the same resync lists the latest state.
    resync(&mut h);
    h.expect_resync_list("280");
    h.core.on_list_page(Err(api_error(410, "Expired")));
    assert!(matches!(h.step(), Step::Act(Action::Backoff(_))));
    h.core.on_backoff_elapsed();
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "250")], None, "290");
    h.expect_watch("250");
    // The probe fails: the latest state.
    resync(&mut h);
    assert_eq!(h.step(), Step::Act(Action::Probe));
    h.core.on_probe(Err(api_error(503, "ServiceUnavailable")));
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "250")], None, "290");
    h.expect_watch("250");
    // The store below the cache's mark: the latest state, where the rewind shows.
    resync(&mut h);
    h.probe("240");
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "250")], None, "290");
    h.expect_watch("250");
    // Asked again on the next resync.
    resync(&mut h);
    h.expect_resync_list("300");
    h.page(vec![obj("a", "ua", "250")], None, "300");
    h.expect_watch("250");
    // A watch error's relist is a recovery: the latest state, no probe.
    h.error_event(410, "Expired");
    h.expect_list(None);
}

/// 6e. A resync's first page that the server throttles (429) is asked for
///     again after its pause at exactly the same revision: the pause does
///     not turn the exact list into one of the latest state.
#[test]
fn a_throttled_first_page_of_a_resync_stays_exact() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "200");
    let (reply, _answer) = tokio::sync::oneshot::channel();
    h.core.on_request(super::store::Request::Resync(reply));
    h.expect_resync_list("210");
    h.core.on_list_page(Err(throttled_error(2)));
    assert_eq!(
        h.step(),
        Step::Act(Action::Backoff(std::time::Duration::from_secs(2)))
    );
    h.core.on_backoff_elapsed();
    h.expect_list_at(None, Some("210"));
    h.page(vec![obj("a", "ua", "100")], None, "210");
    assert_eq!(h.deletion_candidates(), vec![key("b")]);
}

/// 6d. A DELETE the watch never delivered, and nothing after it: the watch
///     is idle below the delete, yet the resync's list, at the store's
///     revision rather than the cache's mark, lacks the object.
#[test]
fn a_delete_the_watch_never_delivered_is_found_while_it_is_idle() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "200");
    let (reply, _answer) = tokio::sync::oneshot::channel();
    h.core.on_request(super::store::Request::Resync(reply));
    h.expect_resync_list("210");
    h.page(vec![obj("a", "ua", "100")], None, "210");
    assert_eq!(h.deletion_candidates(), vec![key("b")]);
    h.expect_watch("200");
}

/// 6b. The periodic resync (a resync request): the watch resumes from before
///     the list, so the events the list overtook arrive, explain the
///     differences they cause (no drift), and are not reported as stale;
///     what no event explains is drift once the watch passes the list.
#[test]
fn case6_resync_tells_watch_lag_from_drift() {
    let mut h = Harness::synced_with(
        vec![
            obj("a", "ua", "100"),
            obj("b", "ub", "110"),
            obj("c", "uc", "120"),
        ],
        "200",
    );
    h.event(Modified, obj("a", "ua", "250"));
    let (reply, mut answer) = tokio::sync::oneshot::channel();
    assert!(h.core.on_request(super::store::Request::Resync(reply)));
    // The exact list is refused (another API server behind the same
    // address, behind this one): the resync lists the latest state.
    h.expect_resync_list("400");
    h.core.on_list_page(Err(api_error(504, "Timeout")));
    assert!(matches!(h.step(), Step::Act(Action::Backoff(_))));
    h.core.on_backoff_elapsed();
    h.expect_list(None);
    // At 400: b deleted at 300 (DELETE in flight), c's DELETE at 280 lost,
    // d created at 350 (ADDED in flight).
    h.page(
        vec![obj("a", "ua", "250"), obj("d", "ud", "350")],
        None,
        "400",
    );
    assert!(answer.try_recv().is_ok(), "the resync is answered");
    assert!(h.store.is_synced());
    h.expect_watch("250");
    h.event(Deleted, obj("b", "ub", "300"));
    h.event(Added, obj("d", "ud", "350"));
    assert_eq!(h.stale(), vec![], "overtaken events are not stale");
    assert_eq!(h.count("drift/missed_delete"), 0);
    h.bookmark("410");
    assert_eq!(h.count("drift/missed_delete"), 1, "c: drift");
    assert_eq!(h.count("drift/missed_add"), 0, "d: lag");
    assert_eq!(h.store.read().pending_drift(), 0);
}

/// 7. A list is always consistent: Step::List never carries an RV (no "0"),
///    on every path into a list.
#[test]
fn case7_lists_are_consistent() {
    let mut h = Harness::new();
    let mut lists = vec![h.step()];
    h.page(
        vec![obj("a", "ua", "450"), obj("b", "ub", "480")],
        None,
        "500",
    );
    h.error_event(410, "Expired");
    lists.push(h.step());
    h.page(vec![obj("a", "ua", "450")], Some("c"), "500");
    h.core.on_list_page(Err(api_error(410, "Expired")));
    lists.push(h.step());
    h.core.on_connect_error();
    h.core.on_backoff_elapsed();
    lists.push(h.step());
    for step in lists {
        // The List step has no resourceVersion field at all: RV is unset.
        assert_eq!(
            step,
            Step::Act(Action::List {
                continue_token: None,
                limit: 500,
                exact_rv: None,
            })
        );
    }
}

/// 7b. A list taken while our own write came back is never used to delete
///     or roll back what the write returned.
#[test]
fn case7_object_written_during_a_list_is_kept() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.error_event(410, "Expired");
    h.expect_list(None);
    let stamp = h.store.read_stamp();
    h.store.restore(obj("new", "un", "260"), &stamp);
    h.page(vec![obj("a", "ua", "100")], None, "250");
    assert!(h.deletion_candidates().is_empty());
    assert!(h.store.get(&key("new")).is_some());
    // The write's own event (at 260) is still to come on the watch.
    h.expect_watch("250");
}

/// 8. Connection cut mid-stream / server closed the watch / API server
///    restart → resume from the highest RV (after backoff for failures),
///    repeated failures keep backing off, nothing lost.
#[test]
fn case8_stream_end_resumes_from_highest_rv() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.core.on_watch_started();
    h.event(Modified, obj("a", "ua", "130"));
    h.bookmark("170");
    h.core.on_stream_end();
    assert_eq!(h.restarts(RestartReason::StreamEnded), 1);
    h.expect_watch("170");
}

#[test]
fn case8_connection_cut_backs_off_then_resumes() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.core.on_watch_started();
    h.event(Modified, obj("a", "ua", "130"));
    h.core.on_connect_error();
    assert_eq!(h.restarts(RestartReason::ConnectError), 1);
    assert_eq!(h.step(), Step::Act(Action::Backoff(Duration::from_secs(1))));
    h.core.on_backoff_elapsed();
    // Before resuming, a one-item list checks the store has not gone back.
    h.probe("135");
    h.expect_watch("130");
    // API server restarting: the watch request fails repeatedly.
    h.core.on_watch_start_error(&connect_error());
    assert_eq!(h.step(), Step::Act(Action::Backoff(Duration::from_secs(2))));
    h.core.on_backoff_elapsed();
    // The probe itself cannot get through either: pause, probe again.
    assert_eq!(h.step(), Step::Act(Action::Probe));
    h.core.on_probe(Err(connect_error()));
    assert_eq!(h.step(), Step::Act(Action::Backoff(Duration::from_secs(3))));
    h.core.on_backoff_elapsed();
    h.probe("135");
    h.core
        .on_watch_start_error(&api_error(503, "ServiceUnavailable"));
    assert_eq!(h.step(), Step::Act(Action::Backoff(Duration::from_secs(4))));
    h.core.on_backoff_elapsed();
    h.probe("130");
    h.expect_watch("130");
    // Back: events flow again, nothing was dropped from the cache meanwhile.
    h.core.on_watch_started();
    h.event(Modified, obj("a", "ua", "140"));
    assert_eq!(h.data("a").as_deref(), Some("a@140"));
    // And if the RV was compacted during the outage: relist.
    h.core.on_connect_error();
    h.core.on_backoff_elapsed();
    h.probe("900");
    h.core.on_watch_start_error(&api_error(410, "Expired"));
    h.expect_list(None);
}

/// 8b. etcd restored from a backup while the API server was down: the store
///     comes back below the resume point. A watch from there would be
///     accepted and stay silent until the store caught up; the probe sees
///     the lower revision and the relist that follows starts the cache over.
#[test]
fn case8_a_store_back_below_the_resume_point_relists_at_once() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.core.on_watch_started();
    h.event(Modified, obj("a", "ua", "300"));
    h.core.on_connect_error();
    h.core.on_backoff_elapsed();
    h.probe("120");
    assert_eq!(h.restarts(RestartReason::RewindSuspected), 1);
    h.expect_list(None);
    // The restored store has a at its old RV: the cache takes it.
    h.page(vec![obj("a", "ua", "100")], None, "120");
    assert_eq!(h.data("a").as_deref(), Some("a@100"));
    h.expect_watch("120");
}

/// 8c. A probe the server refuses (LIST forbidden where WATCH is allowed)
///     does not hold the watch up: it resumes, the resync stays the bound.
#[test]
fn case8_a_refused_probe_resumes_the_watch() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "100");
    h.core.on_connect_error();
    h.core.on_backoff_elapsed();
    assert_eq!(h.step(), Step::Act(Action::Probe));
    h.core.on_probe(Err(api_error(403, "Forbidden")));
    h.expect_watch("100");
}

#[test]
fn case8_connect_error_before_first_list_relists() {
    let mut h = Harness::new();
    h.core.on_list_page(Err(connect_error()));
    assert!(matches!(h.step(), Step::Act(Action::Backoff(_))));
    h.core.on_backoff_elapsed();
    h.expect_list(None);
}

/// 9. A plain etcd restore: the store's revision went back. The watch from
///    the old resume point would hear nothing until the revision caught up;
///    the next consistent list (the resync) is below what the cache knew:
///    counted, the cache starts over from it (not synced meanwhile), the
///    watch resumes from the list, and changes flow again.
#[test]
fn case9_plain_restore_rewinds_to_the_list() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "120");
    h.event(Modified, obj("a", "ua", "5000"));
    h.event(Added, obj("late", "ul", "5100"));
    h.take_changes();
    let (reply, _answer) = tokio::sync::oneshot::channel();
    h.core.on_request(super::store::Request::Resync(reply));
    // The probe reads the restored store's revision, below the cache's
    // mark: the resync lists the latest state, where the rewind shows.
    h.probe("130");
    h.expect_list(None);
    let ((), events) = logged(|| h.page(vec![obj("a", "ua", "100")], Some("c1"), "130"));
    assert_eq!(h.count("store_rewind"), 1);
    // The log line shows the evidence: the store went back from 5100 to 130.
    let line = rewind_line(&events);
    assert_eq!(line.fields["list_rv"], "130");
    assert_eq!(line.fields["known_rv"], "5100");
    assert!(
        !h.store.is_synced(),
        "not ready while the cache starts over"
    );
    h.expect_list(Some("c1"));
    h.page(vec![obj("b", "ub", "110")], None, "130");
    assert!(h.store.is_synced());
    assert_eq!(h.data("a").as_deref(), Some("a@100"));
    assert_eq!(h.deletion_candidates(), vec![key("late")]);
    assert_eq!(h.core.machine().resume_rv(), Some("130"));
    h.expect_watch("130");
    h.event(Modified, obj("b", "ub", "140"));
    assert_eq!(h.data("b").as_deref(), Some("b@140"));
    assert_eq!(h.count("drift/missed_update"), 0, "a rewind is not drift");
    // `late` made again after the restore, at an RV below the one the lost
    // history gave it: a new object, not a replay of the deleted one.
    assert!(matches!(
        h.event(Added, obj("late", "ul", "150")),
        Outcome::Applied(_)
    ));
    assert_eq!(h.data("late").as_deref(), Some("late@150"));
}

/// 9b. `etcdutl snapshot restore --bump-revision --mark-compacted`: the watch
///     gets 410, the relist's RV is higher than anything known, but restored
///     objects keep their old RVs. The contradiction is read live; etcd
///     confirms the older state, so the cache starts over from a new list.
#[test]
fn case9_bump_revision_restore_is_confirmed_by_a_live_read() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "120");
    h.event(Modified, obj("a", "ua", "5000"));
    h.error_event(410, "Expired");
    h.expect_list(None);
    h.page(
        vec![obj("a", "ua", "100"), obj("b", "ub", "110")],
        None,
        "1000200",
    );
    assert_eq!(
        h.data("a").as_deref(),
        Some("a@5000"),
        "disputed: not applied"
    );
    h.expect_read("a");
    let ((), events) = logged(|| h.read(LiveRead::Found(obj("a", "ua", "100"))));
    assert_eq!(h.count("store_rewind"), 1);
    assert_eq!(h.restarts(RestartReason::StoreRewound), 1);
    // The list's RV is above anything known; the evidence is the object,
    // and the log line shows what the store held before the list.
    let line = rewind_line(&events);
    assert_eq!(line.fields["list_rv"], "1000200");
    assert_eq!(line.fields["known_rv"], "5000");
    h.expect_list(None);
    h.page(
        vec![obj("a", "ua", "100"), obj("b", "ub", "110")],
        None,
        "1000210",
    );
    assert_eq!(h.data("a").as_deref(), Some("a@100"));
    h.expect_watch("1000210");
    assert!(h.store.is_synced());
}

/// 10. A ghost in the API server's watch cache (it lost a DELETE): the
///     object is in every list, but a live read found it gone. Lists do not
///     bring it back; the contradiction is read live again (and, being
///     known, not counted again).
#[test]
fn case10_a_ghost_in_the_watch_cache_stays_out() {
    let mut h = Harness::synced_with(
        vec![obj("a", "ua", "100"), obj("ghost", "ug", "110")],
        "120",
    );
    assert!(h.store.evict_ghost(&key("ghost"), "ug").is_some());
    h.error_event(410, "Expired");
    h.expect_list(None);
    h.page(
        vec![obj("a", "ua", "100"), obj("ghost", "ug", "110")],
        None,
        "300",
    );
    h.expect_read("ghost");
    h.read(LiveRead::Gone);
    assert_eq!(h.count("ghost"), 0, "found by the ghost scan, not here");
    assert_eq!(h.count("store_rewind"), 0);
    assert!(h.store.get(&key("ghost")).is_none());
    h.expect_watch("300");
}

/// A read that fails leaves the dispute open: nothing applied, the watch goes on.
#[test]
fn case10_an_unanswered_dispute_changes_nothing() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "120");
    h.event(Modified, obj("a", "ua", "500"));
    h.error_event(410, "Expired");
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], None, "900");
    h.expect_read("a");
    h.core.on_read(Err(connect_error()));
    assert_eq!(h.data("a").as_deref(), Some("a@500"));
    h.expect_watch("900");
    // A list where every cached RV is at or below the list is what a
    // disputed item needs; applying the same list by hand shows the rule.
    let diff = apply_list(&mut h.store.write(), vec![obj("a", "ua", "100")], "900");
    assert_eq!(diff.disputes.len(), 1);
}

/// Our own write coming back on the watch: an event read only as far as its
/// metadata is the whole event when the cache holds exactly that state (the
/// resume point moves, nothing is delivered), and is decoded otherwise.
#[test]
fn an_event_known_from_its_metadata_moves_the_resume_point_only() {
    use super::decode::RawMeta;
    let meta = |uid: &str, rv: &str| RawMeta {
        key: key("web"),
        uid: uid.to_owned(),
        resource_version: rv.to_owned(),
    };
    let mut h = Harness::synced_with(vec![obj("web", "u1", "100")], "100");
    h.event(Modified, obj("web", "u1", "140"));
    // The answer to our write, cached before its event arrives.
    let stamp = h.store.read_stamp();
    h.store.restore(obj("web", "u1", "145"), &stamp);
    assert_eq!(h.core.machine().resume_rv(), Some("140"));
    let delivered = h.changes().len();
    assert!(h.core.on_known_event(&meta("u1", "145")));
    assert_eq!(h.changes().len(), delivered, "nothing delivered");
    assert_eq!(h.data("web").as_deref(), Some("web@145"));
    assert_eq!(h.core.machine().resume_rv(), Some("145"));
    // Another RV, another incarnation, an unknown key: decode and apply.
    for other in [meta("u1", "150"), meta("u1", "140"), meta("u2", "145")] {
        assert!(!h.core.on_known_event(&other), "{other:?}");
    }
    let unknown = RawMeta {
        key: key("new"),
        ..meta("u3", "160")
    };
    assert!(!h.core.on_known_event(&unknown));
    assert_eq!(h.core.machine().resume_rv(), Some("145"));
    assert!(h.stale().is_empty());
}

/// A page refused with 429 (API Priority and Fairness) is asked for again,
/// after the pause the server asked for: the pages before it stay applied,
/// the list goes on from where it was, nothing is taken for deleted and no
/// restart is counted.
#[test]
fn a_throttled_page_resumes_the_list_where_it_was() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "200");
    h.error_event(410, "Expired");
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], Some("c1"), "300");
    h.expect_list(Some("c1"));
    let throttled = throttled_error(2);
    let restarts_before = h.restarts(RestartReason::ListError);
    h.core.on_list_page(Err(throttled));
    assert_eq!(
        h.step(),
        Step::Act(Action::Backoff(std::time::Duration::from_secs(2)))
    );
    h.core.on_backoff_elapsed();
    h.expect_list(Some("c1"));
    h.page(vec![obj("b", "ub", "100")], None, "300");
    h.expect_watch("300");
    assert!(
        h.deletion_candidates().is_empty(),
        "nothing taken for deleted"
    );
    assert_eq!(h.restarts(RestartReason::ListError), restarts_before);
}
