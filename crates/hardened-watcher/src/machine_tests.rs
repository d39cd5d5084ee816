//! State machine tests: pagination, restarts, backoff, resume point.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::ApiErrorKind;
use crate::machine::{Action, Machine, PageOutcome, Phase, RestartReason};
use crate::testkit::{TestBackoff, machine};

fn watching(m: &mut Machine, list_rv: &str) {
    assert_eq!(
        m.on_list_page(None, list_rv),
        PageOutcome::Complete {
            list_rv: list_rv.to_owned()
        }
    );
    m.watch_from_list(list_rv);
}

#[test]
fn starts_with_a_consistent_first_page() {
    let m = machine();
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: None,
            limit: 500,
            exact_rv: None,
        }
    );
}

#[test]
fn pages_follow_continue_tokens_and_the_list_completes_at_its_first_rv() {
    let mut m = machine();
    assert!(m.starts_list());
    assert_eq!(m.on_list_page(Some("c1".into()), "100"), PageOutcome::More);
    assert!(!m.starts_list());
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: Some("c1".into()),
            limit: 500,
            exact_rv: None,
        }
    );
    // All pages belong to the first page's snapshot.
    assert_eq!(
        m.on_list_page(None, "100"),
        PageOutcome::Complete {
            list_rv: "100".into()
        }
    );
    m.watch_from_list("100");
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "100".into()
        }
    );
}

#[test]
fn expired_continue_token_restarts_the_list_from_scratch() {
    let mut m = machine();
    m.on_list_page(Some("c1".into()), "100");
    assert_eq!(
        m.on_list_error(ApiErrorKind::Expired),
        RestartReason::ContinueExpired
    );
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: None,
            limit: 500,
            exact_rv: None,
        }
    );
    // The new list stands alone: its RV is its own first page's.
    assert_eq!(
        m.on_list_page(None, "200"),
        PageOutcome::Complete {
            list_rv: "200".into()
        }
    );
}

#[test]
fn after_a_list_the_watch_starts_from_the_list_resumes_or_rewinds() {
    // A relist: from the list's RV (or a higher one already seen).
    let mut m = machine();
    watching(&mut m, "100");
    m.on_watch_event("150");
    m.request_relist(RestartReason::Resync);
    assert_eq!(
        m.on_list_page(None, "300"),
        PageOutcome::Complete {
            list_rv: "300".into()
        }
    );
    // A resync: the watch resumes from before the list, to receive the
    // events the list overtook.
    m.resume_after_list();
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "150".into()
        }
    );
    // A rewound store: back to the list's RV, below everything seen.
    m.request_relist(RestartReason::StoreRewound);
    assert_eq!(
        m.on_list_page(None, "40"),
        PageOutcome::Complete {
            list_rv: "40".into()
        }
    );
    m.rewind_to("40");
    assert_eq!(m.resume_rv(), Some("40"));
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "40".into()
        }
    );
}

#[test]
fn list_errors_back_off_then_relist_from_scratch() {
    let mut m = machine();
    m.on_list_page(Some("c1".into()), "100");
    assert_eq!(
        m.on_list_error(ApiErrorKind::Transient(503)),
        RestartReason::ListError
    );
    assert_eq!(m.next_action(), Action::Backoff(Duration::from_secs(1)));
    m.on_backoff_elapsed();
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: None,
            limit: 500,
            exact_rv: None,
        }
    );
}

#[test]
fn a_throttled_page_is_asked_for_again_after_the_servers_pause() {
    let mut m = machine();
    m.on_list_page(Some("c1".into()), "100");
    m.on_list_throttled(Duration::from_secs(3));
    assert_eq!(m.next_action(), Action::Backoff(Duration::from_secs(3)));
    m.on_backoff_elapsed();
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: Some("c1".into()),
            limit: 500,
            exact_rv: None,
        },
        "the same page, not the first"
    );
    // The list goes on with the first page's snapshot.
    assert_eq!(
        m.on_list_page(None, "100"),
        PageOutcome::Complete {
            list_rv: "100".into()
        }
    );
    // A pause the server did not give, or an absurd one, is bounded.
    let mut m = machine();
    m.on_list_throttled(Duration::ZERO);
    assert_eq!(m.next_action(), Action::Backoff(Duration::from_secs(1)));
    m.on_list_throttled(Duration::from_secs(3600));
    assert_eq!(m.next_action(), Action::Backoff(Duration::from_secs(60)));
}

#[test]
fn list_without_resource_version_is_not_watched_from() {
    let mut m = machine();
    assert_eq!(m.on_list_page(None, ""), PageOutcome::Invalid);
    assert!(matches!(m.next_action(), Action::Backoff(_)));
}

#[test]
fn bookmarks_advance_the_resume_point() {
    let mut m = machine();
    watching(&mut m, "100");
    m.on_bookmark("180");
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "180".into()
        }
    );
    m.on_stream_end();
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "180".into()
        }
    );
}

#[test]
fn error_events_relist_and_repeated_ones_back_off() {
    let mut m = machine();
    watching(&mut m, "100");
    assert_eq!(
        m.on_watch_error_event(500, "InternalError"),
        RestartReason::WatchError500
    );
    assert_eq!(
        m.next_action(),
        Action::List {
            continue_token: None,
            limit: 500,
            exact_rv: None,
        }
    );
    watching(&mut m, "200");
    // Errors again before any event: no hot relist loop.
    assert_eq!(
        m.on_watch_error_event(400, "BadRequest"),
        RestartReason::OtherWatchError
    );
    assert!(matches!(m.next_action(), Action::Backoff(_)));
    m.on_backoff_elapsed();
    assert!(matches!(
        m.phase(),
        Phase::Relisting {
            reason: RestartReason::OtherWatchError
        }
    ));
}

#[test]
fn watch_start_errors_classified() {
    let mut m = machine();
    watching(&mut m, "100");
    assert_eq!(
        m.on_watch_start_error(ApiErrorKind::Expired),
        RestartReason::Expired
    );
    assert!(matches!(
        m.phase(),
        Phase::Relisting {
            reason: RestartReason::Expired
        }
    ));
    watching(&mut m, "200");
    assert_eq!(
        m.on_watch_start_error(ApiErrorKind::Rejected(403)),
        RestartReason::WatchRejected
    );
    m.on_backoff_elapsed();
    assert!(matches!(
        m.next_action(),
        Action::List {
            continue_token: None,
            ..
        }
    ));
}

#[test]
fn stream_end_without_events_pauses_before_resuming() {
    let mut m = machine();
    watching(&mut m, "100");
    m.on_watch_started();
    m.on_stream_end();
    assert!(matches!(m.next_action(), Action::Backoff(_)));
    m.on_backoff_elapsed();
    assert_eq!(
        m.next_action(),
        Action::Watch {
            resource_version: "100".into()
        }
    );
}

#[test]
fn backoff_resets_after_a_successful_list() {
    let backoff = TestBackoff::default();
    let resets = backoff.resets.clone();
    let mut m = Machine::new(500, Box::new(backoff));
    m.on_list_error(ApiErrorKind::Connect);
    m.on_backoff_elapsed();
    watching(&mut m, "100");
    assert!(resets.load(Ordering::SeqCst) >= 1);
}

#[test]
fn restart_reasons_have_bounded_labels() {
    let all = RestartReason::ALL;
    let labels: std::collections::HashSet<_> =
        all.iter().map(RestartReason::metric_label).collect();
    assert_eq!(labels.len(), all.len());
    assert!(!RestartReason::StreamEnded.relists() && RestartReason::Expired.relists());
}
