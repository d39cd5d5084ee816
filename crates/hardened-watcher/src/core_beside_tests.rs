//! A resync listing beside the open watch (`core_beside.rs`), driven
//! through the [`WatchCore`](crate::core::WatchCore) as the driver drives
//! it: the watch's events and the list's answers interleaved.

use std::time::Duration;

use crate::cache::{Change, WatchEventKind::*};
use crate::core::Step;
use crate::core_beside::BesideStep;
use crate::machine::Action;
use crate::store::{Request, ResyncReport};
use crate::testkit::{Harness, api_error, key, obj, page, throttled_error};

/// A synced harness whose watch is open, asked for a resync: the watch
/// goes on and the resync's probe is the next request beside it.
fn resync_beside(
    items: Vec<crate::testkit::Obj>,
    list_rv: &str,
) -> (Harness, tokio::sync::oneshot::Receiver<ResyncReport>) {
    let mut h = Harness::synced_with(items, list_rv);
    h.core.on_watch_started();
    let (reply, answer) = tokio::sync::oneshot::channel();
    assert!(
        !h.core.on_request(Request::Resync(reply)),
        "the watch stays open"
    );
    assert_eq!(h.core.beside_step(), Some(BesideStep::Probe));
    assert_eq!(h.core.beside_step(), None, "one request at a time");
    (h, answer)
}

fn first_page(store_rv: &str) -> BesideStep {
    BesideStep::List {
        continue_token: None,
        limit: 500,
        exact_rv: Some(store_rv.to_owned()),
    }
}

/// The watch's events are applied while the list runs; the list, at the
/// probed revision, keeps what the watch brought past it, and makes a
/// candidate of what it lacks.
#[test]
fn events_flow_while_a_resync_lists_beside_the_watch() {
    let (mut h, mut answer) = resync_beside(
        vec![
            obj("a", "ua", "100"),
            obj("b", "ub", "110"),
            obj("ghost", "ug", "120"),
        ],
        "200",
    );
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    assert_eq!(h.core.beside_step(), Some(first_page("300")));
    // While the page is out: a changed past the list, b deleted past it,
    // c created past it. Each reaches the sink at once.
    h.event(Modified, obj("a", "ua", "310"));
    h.event(Deleted, obj("b", "ub", "320"));
    h.event(Added, obj("c", "uc", "330"));
    assert_eq!(h.take_changes().len(), 3);
    // The list at 300: a and b as they were then; the ghost's DELETE,
    // which the watch never delivered, is missing from it.
    let more = h.core.on_beside_page(
        Ok(page(
            vec![obj("a", "ua", "100"), obj("b", "ub", "110")],
            Some("c1"),
            "300",
        )),
        Duration::ZERO,
    );
    assert!(!more);
    assert_eq!(
        h.core.beside_step(),
        Some(BesideStep::List {
            continue_token: Some("c1".into()),
            limit: 500,
            exact_rv: None,
        })
    );
    assert!(
        !h.core
            .on_beside_page(Ok(page(vec![], None, "300")), Duration::ZERO)
    );
    assert_eq!(h.deletion_candidates(), vec![key("ghost")]);
    assert_eq!(h.data("a").as_deref(), Some("a@310"), "newer kept");
    assert!(
        h.store.get(&key("b")).is_none(),
        "its DELETE past the list stands"
    );
    assert!(
        h.store.get(&key("c")).is_some(),
        "created past the list: kept"
    );
    assert!(answer.try_recv().is_ok(), "the resync is answered");
    assert_eq!(h.core.beside_step(), None);
    // The watch was never closed: the driver goes on reading it.
    h.event(Modified, obj("a", "ua", "340"));
    assert_eq!(h.data("a").as_deref(), Some("a@340"));
}

/// An event at or below the list's revision that arrives after a page
/// overtook it explains what the page changed (watch lag, no drift); what
/// no event explains is drift once the watch passes the list.
#[test]
fn events_the_list_overtook_are_lag_not_drift() {
    let (mut h, _answer) = resync_beside(vec![obj("a", "ua", "100"), obj("b", "ub", "110")], "200");
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    // The list at 300 has a and b updated at 250 and 260: a's event is on
    // its way, b's was lost.
    h.core.on_beside_page(
        Ok(page(
            vec![obj("a", "ua", "250"), obj("b", "ub", "260")],
            Some("c1"),
            "300",
        )),
        Duration::ZERO,
    );
    h.event(Modified, obj("a", "ua", "250"));
    h.core.beside_step();
    h.core
        .on_beside_page(Ok(page(vec![], None, "300")), Duration::ZERO);
    assert_eq!(h.stale(), vec![], "overtaken events are not stale");
    h.bookmark("310");
    assert_eq!(h.count("drift/missed_update"), 1, "b only");
}

/// A watch that ends while the list runs takes the list with it: what its
/// pages upserted stays, nothing is taken for deleted, and the resync
/// starts over beside the next watch.
#[test]
fn a_watch_that_ends_takes_the_list_with_it() {
    let (mut h, mut answer) =
        resync_beside(vec![obj("a", "ua", "100"), obj("gone", "ug", "110")], "200");
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "250")], Some("c1"), "300")),
        Duration::ZERO,
    );
    h.core.beside_step();
    h.core.on_stream_end();
    assert!(h.deletion_candidates().is_empty());
    assert_eq!(h.data("a").as_deref(), Some("a@250"));
    assert!(answer.try_recv().is_err(), "not answered yet");
    // The answer of the request that was out is dropped with the watch.
    assert!(
        !h.core
            .on_beside_page(Ok(page(vec![], None, "300")), Duration::ZERO)
    );
    assert!(h.deletion_candidates().is_empty());
    // A watch that ended without an event resumes after a pause.
    assert!(matches!(h.step(), Step::Act(Action::Backoff(_))));
    h.core.on_backoff_elapsed();
    h.expect_watch("200");
    h.core.on_watch_started();
    assert_eq!(h.core.beside_step(), Some(BesideStep::Probe));
    assert!(!h.core.on_beside_probe(Ok("320".into())));
    assert_eq!(h.core.beside_step(), Some(first_page("320")));
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "250")], None, "320")),
        Duration::ZERO,
    );
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    assert!(answer.try_recv().is_ok());
}

/// The page out is answered 429 with a pause of `seconds`: the pause, then
/// `again`.
fn throttled_then_asked_again(h: &mut Harness, seconds: u32, again: BesideStep) {
    assert!(
        !h.core
            .on_beside_page(Err(throttled_error(seconds)), Duration::ZERO)
    );
    assert_eq!(
        h.core.beside_step(),
        Some(BesideStep::Pause(Duration::from_secs(u64::from(seconds))))
    );
    h.core.on_beside_pause_elapsed();
    assert_eq!(h.core.beside_step(), Some(again));
}

/// A throttled page is asked for again after the server's pause (the first
/// at exactly the probed revision again); the pages already applied stay
/// and the list does not start over.
#[test]
fn a_throttled_page_is_asked_for_again() {
    let (mut h, mut answer) =
        resync_beside(vec![obj("a", "ua", "100"), obj("gone", "ug", "110")], "200");
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    // The first page throttled: asked for again at exactly the revision.
    throttled_then_asked_again(&mut h, 2, first_page("300"));
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "100")], Some("c1"), "300")),
        Duration::ZERO,
    );
    h.core.beside_step();
    throttled_then_asked_again(
        &mut h,
        3,
        BesideStep::List {
            continue_token: Some("c1".into()),
            limit: 500,
            exact_rv: None,
        },
    );
    h.core
        .on_beside_page(Ok(page(vec![], None, "300")), Duration::ZERO);
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    assert!(answer.try_recv().is_ok());
}

/// What the list beside the watch cannot do alone, the list the watch
/// waits for does: a failed probe, a refused exact list, a store below
/// the cache's mark. The watch ends and that resync lists the latest
/// state, asking for no revision.
#[test]
fn what_it_cannot_do_beside_the_watch_it_does_without_it() {
    // The probe fails.
    let (mut h, mut answer) = resync_beside(vec![obj("a", "ua", "100")], "200");
    assert!(
        h.core
            .on_beside_probe(Err(api_error(503, "ServiceUnavailable")))
    );
    h.core.on_watch_closed();
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], None, "300");
    assert!(answer.try_recv().is_ok());
    h.expect_watch("200");
    // The exact list is refused.
    let (mut h, mut answer) = resync_beside(vec![obj("a", "ua", "100")], "200");
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    assert!(
        h.core
            .on_beside_page(Err(api_error(504, "Timeout")), Duration::ZERO)
    );
    h.core.on_watch_closed();
    h.expect_list(None);
    h.page(vec![obj("a", "ua", "100")], None, "310");
    assert!(answer.try_recv().is_ok());
    // The store is below what the cache has seen (a rewind).
    let (mut h, _answer) = resync_beside(vec![obj("a", "ua", "100")], "200");
    h.event(Modified, obj("a", "ua", "500"));
    assert!(h.core.on_beside_probe(Ok("150".into())));
    h.core.on_watch_closed();
    h.expect_list(None);
    // The next resync lists beside the watch again.
    h.page(vec![obj("a", "ua", "500")], None, "600");
    h.expect_watch("500");
    h.core.on_watch_started();
    let (reply, _answer) = tokio::sync::oneshot::channel();
    assert!(!h.core.on_request(Request::Resync(reply)));
    assert_eq!(h.core.beside_step(), Some(BesideStep::Probe));
}

/// A list item that contradicts the cache is settled by a live read, made
/// between watches: the watch ends, the read goes out, and the watch
/// resumes where it was.
#[test]
fn a_disputed_item_ends_the_watch_for_its_live_read() {
    let (mut h, mut answer) = resync_beside(vec![obj("a", "ua", "100")], "200");
    h.event(Modified, obj("a", "ua", "250"));
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    // a at 150 from a list at 300, where the cache saw it at 250 before:
    // a store that cannot produce it (or a watch cache that lost events).
    assert!(h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "150")], None, "300")),
        Duration::ZERO
    ));
    h.core.on_watch_closed();
    h.expect_read("a");
    h.read(crate::object::LiveRead::Found(obj("a", "ua", "250")));
    assert!(answer.try_recv().is_ok());
    assert_eq!(
        h.step(),
        Step::Act(Action::Watch {
            resource_version: "250".into()
        })
    );
    assert!(
        !h.changes()
            .iter()
            .any(|c| matches!(c, Change::DeletionCandidate(_)))
    );
}

fn next_page(token: &str) -> BesideStep {
    BesideStep::List {
        continue_token: Some(token.to_owned()),
        limit: 500,
        exact_rv: None,
    }
}

/// A paced resync (a scheduled one) pauses after each page but the last,
/// as long as the page took × (1 / share − 1), and the watch's events are
/// applied while it pauses.
#[test]
fn a_paced_resync_pauses_between_pages_while_events_apply() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("gone", "ug", "110")], "200");
    h.core.pace_resync_lists(0.05);
    h.core.on_watch_started();
    let (reply, mut answer) = tokio::sync::oneshot::channel();
    assert!(!h.core.on_request(Request::PacedResync(reply)));
    assert_eq!(h.core.beside_step(), Some(BesideStep::Probe));
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    assert_eq!(h.core.beside_step(), Some(first_page("300")));
    let took = Duration::from_millis(20);
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "100")], Some("c1"), "300")),
        took,
    );
    assert_eq!(
        h.core.beside_step(),
        Some(BesideStep::Pause(Duration::from_millis(380)))
    );
    // Nothing else is asked for while the pause runs; events apply.
    assert_eq!(h.core.beside_step(), None);
    h.event(Added, obj("new", "un", "310"));
    assert_eq!(h.take_changes().len(), 1);
    h.core.on_beside_pause_elapsed();
    assert_eq!(h.core.beside_step(), Some(next_page("c1")));
    h.core.on_beside_page(Ok(page(vec![], None, "300")), took);
    assert_eq!(h.core.beside_step(), None, "no pause after the last page");
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    assert!(answer.try_recv().is_ok());
}

/// A paced resync of many pages (the server counts what is left) pauses
/// less, so that it ends within the span; the next resync starts its span
/// afresh.
#[test]
fn a_paced_resync_of_many_pages_fits_them_into_the_span() {
    use crate::pace::PACED_LIST_SPAN;
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "200");
    h.core.pace_resync_lists(0.05);
    h.core.on_watch_started();
    let took = Duration::from_millis(100);
    let limit = u64::from(h.core.machine.page_limit());
    for round in 0..2 {
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        assert!(!h.core.on_request(Request::PacedResync(reply)));
        assert_eq!(h.core.beside_step(), Some(BesideStep::Probe));
        assert!(!h.core.on_beside_probe(Ok("300".into())));
        h.core.beside_step();
        // 999 pages left of 100 ms each, alone 99.9 s of the span's 240 s.
        let mut first = page(vec![obj("a", "ua", "100")], Some("c1"), "300");
        first.remaining_item_count = Some(i64::try_from(999 * limit).unwrap_or(i64::MAX));
        h.core.on_beside_page(Ok(first), took);
        let Some(BesideStep::Pause(pause)) = h.core.beside_step() else {
            panic!("round {round}: a paced resync pauses after its first page");
        };
        let fits = (PACED_LIST_SPAN - took) / 999 - took;
        assert_eq!(pause, fits, "round {round}");
        assert!(pause < crate::pace::pause_after(took, 0.05));
        h.core.on_beside_pause_elapsed();
        h.core.beside_step();
        h.core
            .on_beside_page(Ok(page(vec![obj("a", "ua", "100")], None, "300")), took);
        assert!(answer.try_recv().is_ok(), "round {round}");
    }
}

/// A resync asked for while a paced one lists (something suggests the
/// cache is wrong) joins it and lifts its pauses; a resync that is not
/// paced never pauses, whatever the share.
#[test]
fn an_urgent_resync_lifts_the_pauses_of_a_paced_one() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100")], "200");
    h.core.pace_resync_lists(0.05);
    h.core.on_watch_started();
    let (paced, mut paced_answer) = tokio::sync::oneshot::channel();
    assert!(!h.core.on_request(Request::PacedResync(paced)));
    h.core.beside_step();
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    let took = Duration::from_millis(20);
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "100")], Some("c1"), "300")),
        took,
    );
    assert!(matches!(h.core.beside_step(), Some(BesideStep::Pause(_))));
    let (urgent, mut urgent_answer) = tokio::sync::oneshot::channel();
    assert!(!h.core.on_request(Request::Resync(urgent)));
    h.core.on_beside_pause_elapsed();
    assert_eq!(h.core.beside_step(), Some(next_page("c1")));
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "100")], Some("c2"), "300")),
        took,
    );
    assert_eq!(h.core.beside_step(), Some(next_page("c2")), "no pause");
    h.core.on_beside_page(Ok(page(vec![], None, "300")), took);
    assert!(paced_answer.try_recv().is_ok());
    assert!(urgent_answer.try_recv().is_ok());
    // Not paced from the start: no pause.
    let (mut h, _answer) = resync_beside(vec![obj("a", "ua", "100")], "200");
    h.core.pace_resync_lists(0.05);
    assert!(!h.core.on_beside_probe(Ok("300".into())));
    h.core.beside_step();
    h.core.on_beside_page(
        Ok(page(vec![obj("a", "ua", "100")], Some("c1"), "300")),
        took,
    );
    assert_eq!(h.core.beside_step(), Some(next_page("c1")));
}

/// A resync that is not paced never pauses, whatever the share; a paced
/// one counts its pages and pauses, and fits the pages left into the span.
#[test]
fn only_a_paced_resync_pauses() {
    use crate::core_beside::Pace;
    use crate::pace::PACED_LIST_SPAN;
    let ms = Duration::from_millis;
    let mut paced = Pace {
        paced: true,
        share: 0.1,
        spent: Duration::ZERO,
    };
    assert_eq!(paced.pause_after(ms(10), Some(3)), ms(90));
    assert_eq!(paced.spent, ms(100));
    paced.spent = PACED_LIST_SPAN - ms(100);
    assert_eq!(paced.pause_after(ms(10), Some(3)), ms(20));
    let mut unpaced = Pace {
        paced: false,
        share: 0.1,
        spent: Duration::ZERO,
    };
    assert_eq!(unpaced.pause_after(ms(10), Some(3)), Duration::ZERO);
}

/// A paced resync asked for while no watch is open lists as any relist
/// does: a list the watch waits for is never paced.
#[test]
fn a_paced_resync_without_an_open_watch_lists_at_once() {
    let mut h = Harness::synced_with(vec![obj("a", "ua", "100"), obj("gone", "ug", "110")], "200");
    h.core.pace_resync_lists(0.05);
    let (reply, mut answer) = tokio::sync::oneshot::channel();
    assert!(h.core.on_request(Request::PacedResync(reply)));
    h.expect_resync_list("300");
    h.page(vec![obj("a", "ua", "100")], Some("c1"), "300");
    h.expect_list(Some("c1"));
    h.page(vec![], None, "300");
    assert_eq!(h.deletion_candidates(), vec![key("gone")]);
    assert!(answer.try_recv().is_ok());
}
