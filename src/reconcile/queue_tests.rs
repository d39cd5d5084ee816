use super::*;

/// The key of a [`Taken`], for tests that do not look at instants.
fn key<K>(taken: Option<Taken<K>>) -> Option<K> {
    taken.map(|t| t.key)
}

#[test]
fn one_entry_per_key_however_many_adds() {
    let mut s = State::new(MAX_RETRIES);
    assert!(s.add("a", None));
    assert!(!s.add("a", None));
    assert!(s.add("b", None));
    assert_eq!(key(s.take()), Some("a"));
    assert_eq!(key(s.take()), Some("b"));
    assert_eq!(key(s.take()), None);
}

#[test]
fn key_in_processing_is_not_handed_out_twice_but_requeued_after() {
    let mut s = State::new(MAX_RETRIES);
    s.add("a", None);
    assert_eq!(key(s.take()), Some("a"));
    // An event arrives while a worker holds "a".
    assert!(!s.add("a", None));
    assert_eq!(
        key(s.take()),
        None,
        "a second worker must not get a key in flight"
    );
    assert!(s.done(&"a"));
    assert_eq!(key(s.take()), Some("a"));
    assert!(!s.done(&"a"));
}

#[test]
fn a_key_queued_by_several_events_carries_the_earliest() {
    let t0 = Instant::now();
    let (t1, t2) = (t0 + Duration::from_millis(1), t0 + Duration::from_millis(2));
    let mut s = State::new(MAX_RETRIES);
    // Out of order on purpose: two watchers (pods, services) feed one queue.
    s.add("a", Some(t1));
    s.add("a", Some(t0));
    s.add("a", Some(t2));
    s.add("a", None);
    assert_eq!(
        s.take(),
        Some(Taken {
            key: "a",
            received: Some(t0)
        })
    );
}

#[test]
fn events_during_processing_wait_for_the_next_run_and_earlier_ones_leave_with_the_key() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_millis(1);
    let mut s = State::new(MAX_RETRIES);
    s.add("a", Some(t0));
    assert_eq!(key(s.take()), Some("a"));
    // The running reconcile reads caches that may predate this event.
    s.add("a", Some(t1));
    assert!(s.done(&"a"));
    assert_eq!(
        s.take(),
        Some(Taken {
            key: "a",
            received: Some(t1)
        })
    );
    s.done(&"a");
    // Queued by a resync only: no event to measure from.
    s.add("a", None);
    assert_eq!(
        s.take(),
        Some(Taken {
            key: "a",
            received: None
        })
    );
}

#[test]
fn keys_keep_their_own_instants() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_millis(1);
    let mut s = State::new(MAX_RETRIES);
    s.add("a", Some(t1));
    s.add("b", Some(t0));
    s.add("c", None);
    let taken: Vec<_> = std::iter::from_fn(|| s.take())
        .map(|t| (t.key, t.received))
        .collect();
    assert_eq!(taken, vec![("a", Some(t1)), ("b", Some(t0)), ("c", None)]);
}

#[test]
fn nothing_is_recorded_after_shutdown() {
    let mut s = State::new(MAX_RETRIES);
    s.shutting_down = true;
    assert!(!s.add("a", Some(Instant::now())));
    assert!(s.received.is_empty());
}

#[test]
fn a_delayed_key_waits_once_for_the_earliest_instant() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut s = State::new(MAX_RETRIES);
    s.add_at("a", at(100), None);
    s.add_at("a", at(50), Some(at(3)));
    s.add_at("a", at(200), Some(at(1)));
    assert_eq!(s.delayed.len(), 1);
    assert_eq!(s.next_due(), Some(at(50)));
    assert!(!s.add_due(at(49)));
    assert_eq!(key(s.take()), None);
    assert!(s.add_due(at(50)));
    assert_eq!(
        s.take(),
        Some(Taken {
            key: "a",
            received: Some(at(1))
        })
    );
    assert_eq!(s.next_due(), None);
}

#[test]
fn delayed_keys_come_due_in_order_of_their_earliest_instant() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut s = State::new(MAX_RETRIES);
    for k in 0..1000u32 {
        s.add_at(k, at(u64::from(1000 - k)), None);
    }
    // Moved earlier, kept when asked for later, and taken out by an add.
    s.add_at(500, at(0), None);
    s.add_at(999, at(5000), None);
    s.add(10, None);
    assert_eq!(s.delayed.len(), 999);
    assert_eq!(s.due_order.len(), 999);
    assert_eq!(s.next_due(), Some(at(0)));
    assert!(s.add_due(at(0)));
    assert_eq!(key(s.take()), Some(10));
    assert_eq!(key(s.take()), Some(500));
    assert_eq!(s.next_due(), Some(at(1)), "999's earlier instant stays");
    assert!(s.add_due(at(2)));
    assert_eq!(key(s.take()), Some(999));
    assert_eq!(key(s.take()), Some(998));
    assert_eq!(key(s.take()), None);
    assert!(s.add_due(at(1000)));
    assert!(s.delayed.is_empty() && s.due_order.is_empty());
    assert_eq!(s.next_due(), None);
    assert_eq!(s.waiting, 996);
}

#[test]
fn an_add_ends_the_wait_and_keeps_its_events() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut s = State::new(MAX_RETRIES);
    s.add_at("a", at(100), Some(at(1)));
    s.add("a", Some(at(2)));
    assert_eq!(s.next_due(), None, "no second run at the old instant");
    assert_eq!(
        s.take(),
        Some(Taken {
            key: "a",
            received: Some(at(1))
        })
    );
}

#[test]
fn backoff_doubles_from_5ms_and_gives_up_after_15() {
    let mut s: State<&str> = State::new(MAX_RETRIES);
    let delays: Vec<_> = (0..MAX_RETRIES).map(|_| s.next_retry(&"a")).collect();
    assert_eq!(delays[0], Some(Duration::from_millis(5)));
    assert_eq!(delays[1], Some(Duration::from_millis(10)));
    assert_eq!(delays[14], Some(Duration::from_millis(5 << 14)));
    assert_eq!(s.next_retry(&"a"), None);
    // After giving up the count starts over.
    assert_eq!(s.next_retry(&"a"), Some(Duration::from_millis(5)));
}

#[tokio::test]
async fn workers_wake_for_added_keys_and_stop_on_shutdown() {
    let q: Arc<WorkQueue<u32>> = WorkQueue::new(MAX_RETRIES);
    let worker = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(taken) = q.next().await {
                seen.push(taken.key);
                q.done(&taken.key);
                if seen.len() == 3 {
                    break;
                }
            }
            seen
        })
    };
    q.add(1, None);
    q.add(2, None);
    q.add(2, None);
    q.add(3, None);
    let seen = tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect("worker finished")
        .expect("worker task");
    assert_eq!(seen, vec![1, 2, 3]);
    q.shutdown();
    assert_eq!(q.next().await, None);
}

#[tokio::test]
async fn an_idle_worker_wakes_for_a_key_added_after_a_delay() {
    let q: Arc<WorkQueue<&str>> = WorkQueue::new(MAX_RETRIES);
    let worker = {
        let q = q.clone();
        tokio::spawn(async move { q.next().await.map(|t| t.key) })
    };
    tokio::task::yield_now().await;
    q.add_after("a", Duration::from_millis(20));
    q.add_after("a", Duration::from_millis(10));
    let taken = tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect("woken when the key was due")
        .expect("worker task");
    assert_eq!(taken, Some("a"));
    assert!(q.lock().delayed.is_empty());
}

#[tokio::test]
async fn a_retried_key_keeps_the_instant_of_the_event_it_has_not_served() {
    let q: Arc<WorkQueue<&str>> = WorkQueue::new(MAX_RETRIES);
    let t0 = Instant::now();
    q.add("a", Some(t0));
    let taken = q.next().await.expect("queued");
    assert_eq!(q.retry(taken.key, taken.received), Retry::After(BASE_DELAY));
    q.done(&taken.key);
    let again = tokio::time::timeout(Duration::from_secs(5), q.next())
        .await
        .expect("requeued after its 5 ms backoff")
        .expect("queue open");
    assert_eq!(
        again,
        Taken {
            key: "a",
            received: Some(t0)
        }
    );
}

#[test]
fn an_event_goes_ahead_of_keys_a_resync_queued() {
    let t0 = Instant::now();
    let mut s = State::new(MAX_RETRIES);
    for k in ["r1", "r2", "r3"] {
        s.add(k, None);
    }
    s.add("flip", Some(t0));
    assert_eq!(key(s.take()), Some("flip"));
    assert_eq!(key(s.take()), Some("r1"));
    assert_eq!(s.waiting, 2);
}

#[test]
fn an_event_moves_a_resync_queued_key_up_once() {
    let t0 = Instant::now();
    let mut s = State::new(MAX_RETRIES);
    for k in ["r1", "r2", "r3"] {
        s.add(k, None);
    }
    assert!(!s.add("r3", Some(t0)), "r3 was available already");
    assert_eq!(s.waiting, 3);
    let first = s.take().expect("a key");
    assert_eq!((first.key, first.received), ("r3", Some(t0)));
    // Its stale place in the background lane hands out nothing.
    assert_eq!(key(s.take()), Some("r1"));
    assert_eq!(key(s.take()), Some("r2"));
    assert_eq!(key(s.take()), None);
    assert_eq!(s.waiting, 0);
}

#[test]
fn a_key_in_process_moved_up_comes_back_in_the_event_lane() {
    let t0 = Instant::now();
    let mut s = State::new(MAX_RETRIES);
    s.add("a", None);
    s.add("b", None);
    assert_eq!(key(s.take()), Some("a"));
    // A resync and then an event touch "a" while a worker holds it.
    s.add("a", None);
    s.add("a", Some(t0));
    assert_eq!(s.waiting, 1, "only b waits; a is in process");
    assert!(s.done(&"a"));
    assert_eq!(key(s.take()), Some("a"));
    assert_eq!(key(s.take()), Some("b"));
    assert_eq!(key(s.take()), None);
}

#[test]
fn steady_events_leave_the_background_lane_its_share() {
    let t0 = Instant::now();
    let mut s = State::new(MAX_RETRIES);
    s.add(1000, None);
    s.add(1001, None);
    let mut taken = Vec::new();
    for i in 0..40 {
        s.add(i, Some(t0));
        let k = key(s.take()).expect("a key");
        s.done(&k);
        taken.push(k);
    }
    let background: Vec<usize> = taken
        .iter()
        .enumerate()
        .filter(|(_, k)| **k >= 1000)
        .map(|(i, _)| i)
        .collect();
    let share = BACKGROUND_SHARE as usize;
    assert_eq!(background, vec![share - 1, 2 * share - 1]);
}
