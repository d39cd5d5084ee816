//! What the reconciles remember of Services between runs, for opt-in scope:
//! since when an opt-out has waited for upstream, which Services are frozen
//! by an unusable opt-in (a gauge and one Warning Event each), and which
//! Endpoints of ours someone else deleted (counted when made again).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hardened_watcher::ObjectKey;
use prometheus::IntGaugeVec;

use crate::desired::scope::Invalid;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each use is one map update: a panic elsewhere leaves it consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Per Service key, when this controller first saw its opt-out confirmed.
#[derive(Default)]
pub struct OptOutClock {
    since: Mutex<HashMap<ObjectKey, Instant>>,
}

impl OptOutClock {
    /// How long the opt-out of `key` has waited (zero if it has not started).
    pub fn waited(&self, key: &ObjectKey, now: Instant) -> Duration {
        lock(&self.since).get(key).map_or(Duration::ZERO, |since| {
            now.saturating_duration_since(*since)
        })
    }

    /// Starts the wait of `key`, unless it has started.
    pub fn start(&self, key: &ObjectKey, now: Instant) {
        lock(&self.since).entry(key.clone()).or_insert(now);
    }

    /// The opt-out of `key` is over (done, or the Service opted in again).
    pub fn forget(&self, key: &ObjectKey) {
        lock(&self.since).remove(key);
    }
}

/// The Services frozen by an unusable opt-in, with why: the gauge
/// `endpoints_guard_opt_in_frozen_services{reason}` follows it.
#[derive(Default)]
pub struct FrozenServices {
    reasons: Mutex<HashMap<ObjectKey, Invalid>>,
}

impl FrozenServices {
    /// Records why `key` is frozen now (`None`: it is not) and sets the
    /// gauge. Returns true when `key` just became frozen or changed reason:
    /// the moment for one Warning Event (both controllers record; only the
    /// first sees the change).
    pub fn record(&self, key: &ObjectKey, now: Option<Invalid>, gauge: &IntGaugeVec) -> bool {
        let mut reasons = lock(&self.reasons);
        let before = match now {
            Some(why) => reasons.insert(key.clone(), why),
            None => reasons.remove(key),
        };
        if before == now {
            return false;
        }
        for why in Invalid::ALL {
            let count = reasons.values().filter(|r| **r == why).count();
            gauge
                .with_label_values(&[why.metric_label()])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        now.is_some()
    }
}

/// Endpoints keys whose Endpoints of ours were deleted by someone else while
/// their Service was handled: the create that follows is a restore.
#[derive(Default)]
pub struct Restores {
    keys: Mutex<HashSet<ObjectKey>>,
}

impl Restores {
    pub fn note(&self, key: ObjectKey) {
        lock(&self.keys).insert(key);
    }

    /// Whether `key` was noted (and no longer is).
    pub fn take(&self, key: &ObjectKey) -> bool {
        lock(&self.keys).remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge() -> IntGaugeVec {
        IntGaugeVec::new(prometheus::Opts::new("frozen", "test"), &["reason"])
            .unwrap_or_else(|err| panic!("gauge: {err}"))
    }

    #[test]
    fn frozen_services_report_each_change_once() {
        let gauge = gauge();
        let frozen = FrozenServices::default();
        let key = ObjectKey::new("ns", "web");
        let empty = Invalid::SelectorEmpty.metric_label();
        assert!(frozen.record(&key, Some(Invalid::SelectorEmpty), &gauge));
        assert!(
            !frozen.record(&key, Some(Invalid::SelectorEmpty), &gauge),
            "the other controller sees no change"
        );
        assert_eq!(gauge.with_label_values(&[empty]).get(), 1);
        assert!(frozen.record(&key, Some(Invalid::SelectorMissing), &gauge));
        assert_eq!(gauge.with_label_values(&[empty]).get(), 0);
        assert!(!frozen.record(&key, None, &gauge));
        let missing = Invalid::SelectorMissing.metric_label();
        assert_eq!(gauge.with_label_values(&[missing]).get(), 0);
    }

    #[test]
    fn the_opt_out_clock_starts_once() {
        let clock = OptOutClock::default();
        let key = ObjectKey::new("ns", "web");
        let t0 = Instant::now();
        assert_eq!(clock.waited(&key, t0), Duration::ZERO);
        clock.start(&key, t0);
        clock.start(&key, t0 + Duration::from_secs(5));
        assert_eq!(
            clock.waited(&key, t0 + Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        clock.forget(&key);
        assert_eq!(
            clock.waited(&key, t0 + Duration::from_secs(9)),
            Duration::ZERO
        );
    }
}
