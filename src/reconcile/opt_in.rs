//! What the reconciles remember of Services between runs, for opt-in scope:
//! since when an opt-out has waited for upstream, where each opted-in
//! Service stands (gauges, and one Warning Event per change to a state
//! that needs a person), and which Endpoints of ours someone else deleted
//! (counted when made again).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use hardened_watcher::ObjectKey;
use prometheus::IntGaugeVec;

use crate::desired::scope::OptInState;
use crate::locks::lock;
use crate::reconcile::decide::Status;
use crate::settings::Controller;

/// The reason of the Warning Event of a selector restored on an opted-in
/// Service.
pub const SELECTOR_RESTORED: &str = "SelectorRestored";

/// Per Service key, since when this controller has kept objects of ours for
/// an opted-out Service waiting for upstream's to cover them, and whether
/// the wait was reported as stalled.
#[derive(Default)]
pub struct OptOutClock {
    since: Mutex<HashMap<ObjectKey, (Instant, bool)>>,
}

impl OptOutClock {
    /// Since when the opt-out of `key` has waited, if its wait started.
    pub fn since(&self, key: &ObjectKey) -> Option<Instant> {
        lock(&self.since).get(key).map(|(started, _)| *started)
    }

    /// Starts the wait of `key` at `at`, unless it started already.
    pub fn start(&self, key: &ObjectKey, at: Instant) {
        lock(&self.since).entry(key.clone()).or_insert((at, false));
    }

    /// Marks the wait of `key` reported; true the first time.
    pub fn report(&self, key: &ObjectKey) -> bool {
        lock(&self.since)
            .get_mut(key)
            .is_some_and(|(_, reported)| !std::mem::replace(reported, true))
    }

    /// The opt-out of `key` is over (done, or the Service opted in again).
    pub fn forget(&self, key: &ObjectKey) {
        lock(&self.since).remove(key);
    }
}

/// The more urgent of two controllers' views: what a user must hear about
/// wins over what is fine.
fn worse(a: Option<Status>, b: Option<Status>) -> Option<Status> {
    let rank = |s: &Option<Status>| {
        s.map(|s| match s.state() {
            OptInState::Protecting => 1,
            OptInState::OptingOut => 2,
            OptInState::LabelRemoved => 3,
            OptInState::BesideUpstream => 4,
            OptInState::SelectorRestored => 5,
            OptInState::Frozen => 6,
        })
    };
    if rank(&b) > rank(&a) { b } else { a }
}

/// Per Service key, where its opt-in stands as each controller last decided
/// it: the gauges `endpoints_guard_opted_in_services{state}` and
/// `endpoints_guard_opt_in_frozen_services{reason}` count Services by the
/// worse of the two views. A selector that comes back on a Service seen
/// protected is told apart from one that was never removed
/// ([`OptInState::SelectorRestored`]); this memory starts empty with the
/// process.
#[derive(Default)]
pub struct OptInStates {
    by_key: Mutex<HashMap<ObjectKey, [Option<Status>; 2]>>,
}

/// The gauges [`OptInStates`] keeps.
pub struct OptInGauges<'a> {
    pub states: &'a IntGaugeVec,
    pub frozen: &'a IntGaugeVec,
}

impl OptInGauges<'_> {
    fn add(&self, status: Option<Status>, by: i64) {
        let Some(status) = status else { return };
        self.states
            .with_label_values(&[status.state().metric_label()])
            .add(by);
        if let Status::Frozen(why) = status {
            self.frozen.with_label_values(&[why.metric_label()]).add(by);
        }
    }
}

impl OptInStates {
    /// Records where `controller` finds Service `key` now (`None`: not an
    /// opted-in Service, or gone) and moves the gauges. Returns the
    /// Service's status when it just changed to a new one: the moment for
    /// one Warning Event (both controllers record; only the first sees the
    /// change).
    pub fn record(
        &self,
        key: &ObjectKey,
        controller: Controller,
        now: Option<Status>,
        gauges: &OptInGauges<'_>,
    ) -> Option<Status> {
        let mut by_key = lock(&self.by_key);
        let slots = by_key.get(key).copied().unwrap_or_default();
        let before = worse(slots[0], slots[1]);
        // Beside upstream after having been protected: the selector is back.
        let was_protected = before.is_some_and(|s| {
            matches!(
                s.state(),
                OptInState::Protecting | OptInState::LabelRemoved | OptInState::SelectorRestored
            )
        });
        let now = match now {
            Some(Status::State(OptInState::BesideUpstream)) if was_protected => {
                Some(Status::State(OptInState::SelectorRestored))
            }
            other => other,
        };
        let mut slots = slots;
        slots[controller_slot(controller)] = now;
        let after = worse(slots[0], slots[1]);
        if slots == [None, None] {
            by_key.remove(key);
        } else {
            by_key.insert(key.clone(), slots);
        }
        if before == after {
            return None;
        }
        gauges.add(before, -1);
        gauges.add(after, 1);
        after
    }
}

impl OptInStates {
    /// Forgets every Service and takes the gauges back to 0: a replica
    /// that stops leading stops reconciling, and what it last saw would
    /// soon be wrong.
    pub fn clear(&self, gauges: &OptInGauges<'_>) {
        let mut by_key = lock(&self.by_key);
        for slots in by_key.values() {
            gauges.add(worse(slots[0], slots[1]), -1);
        }
        by_key.clear();
    }
}

fn controller_slot(controller: Controller) -> usize {
    match controller {
        Controller::Endpoints => 0,
        Controller::Endpointslices => 1,
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
    use crate::desired::scope::Invalid;
    use std::time::Duration;

    fn gauge() -> IntGaugeVec {
        IntGaugeVec::new(prometheus::Opts::new("frozen", "test"), &["reason"])
            .unwrap_or_else(|err| panic!("gauge: {err}"))
    }

    fn gauges() -> (IntGaugeVec, IntGaugeVec) {
        (gauge(), gauge())
    }

    #[test]
    fn states_report_each_change_once_by_the_worse_view() {
        let (states, frozen) = gauges();
        let g = OptInGauges {
            states: &states,
            frozen: &frozen,
        };
        let record = OptInStates::default();
        let key = ObjectKey::new("ns", "web");
        let protecting = Some(Status::State(OptInState::Protecting));
        let empty = Some(Status::Frozen(Invalid::SelectorEmpty));
        let count = |vec: &IntGaugeVec, label: &str| vec.with_label_values(&[label]).get();

        assert_eq!(
            record.record(&key, Controller::Endpoints, protecting, &g),
            protecting
        );
        assert_eq!(
            record.record(&key, Controller::Endpointslices, protecting, &g),
            None
        );
        assert_eq!(count(&states, "protecting"), 1);
        // One controller freezes it: the Service is frozen, once.
        assert_eq!(
            record.record(&key, Controller::Endpointslices, empty, &g),
            empty
        );
        assert_eq!(record.record(&key, Controller::Endpoints, empty, &g), None);
        assert_eq!(count(&states, "protecting"), 0);
        assert_eq!(count(&states, "frozen"), 1);
        assert_eq!(count(&frozen, "selector_empty"), 1);
        assert_eq!(record.record(&key, Controller::Endpoints, None, &g), None);
        assert_eq!(
            record.record(&key, Controller::Endpointslices, None, &g),
            None
        );
        assert_eq!(count(&states, "frozen"), 0);
        assert_eq!(count(&frozen, "selector_empty"), 0);
    }

    #[test]
    fn a_selector_back_after_protection_is_told_apart() {
        let (states, frozen) = gauges();
        let g = OptInGauges {
            states: &states,
            frozen: &frozen,
        };
        let record = OptInStates::default();
        let key = ObjectKey::new("ns", "web");
        let beside = Some(Status::State(OptInState::BesideUpstream));
        let restored = Some(Status::State(OptInState::SelectorRestored));
        let protecting = Some(Status::State(OptInState::Protecting));
        // The first step of an opt-in: beside upstream, nothing restored.
        assert_eq!(
            record.record(&key, Controller::Endpointslices, beside, &g),
            beside
        );
        assert_eq!(
            record.record(&key, Controller::Endpointslices, protecting, &g),
            protecting
        );
        // The selector comes back: both controllers call it restored.
        assert_eq!(
            record.record(&key, Controller::Endpointslices, beside, &g),
            restored
        );
        assert_eq!(record.record(&key, Controller::Endpoints, beside, &g), None);
        assert_eq!(states.with_label_values(&["selector_restored"]).get(), 1);
        assert_eq!(states.with_label_values(&["beside_upstream"]).get(), 0);
        record.clear(&g);
        assert_eq!(states.with_label_values(&["selector_restored"]).get(), 0);
        assert_eq!(
            record.record(&key, Controller::Endpoints, beside, &g),
            beside,
            "forgotten: a new leader starts afresh"
        );
    }

    #[test]
    fn the_opt_out_clock_starts_once() {
        let clock = OptOutClock::default();
        let key = ObjectKey::new("ns", "web");
        let t0 = Instant::now();
        assert_eq!(clock.since(&key), None, "not started");
        assert!(!clock.report(&key), "nothing to report before a wait");
        clock.start(&key, t0);
        clock.start(&key, t0 + Duration::from_secs(5));
        assert_eq!(clock.since(&key), Some(t0), "the first start stands");
        assert!(clock.report(&key));
        assert!(!clock.report(&key), "reported once");
        clock.forget(&key);
        assert_eq!(clock.since(&key), None, "forgotten");
        clock.start(&key, t0 + Duration::from_secs(9));
        assert_eq!(
            clock.since(&key),
            Some(t0 + Duration::from_secs(9)),
            "a new wait starts"
        );
        assert!(clock.report(&key), "and is reported anew");
    }
}
