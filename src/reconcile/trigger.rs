//! The `endpoints.kubernetes.io/last-change-trigger-time` bookkeeping, as upstream's
//! trigger-time tracker does it: per Service, remember the Ready-transition time of
//! each pod and the Service's creation time seen at the last sync; the annotation is
//! the earliest of those that moved forward since.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use crate::desired::PodInfo;
use crate::locks::lock;
use hardened_watcher::ObjectKey;

/// What one sync of a Service saw: each pod's Ready-transition time and
/// the Service's creation time. The next sync's trigger time is the
/// earliest of those that moved forward since.
#[derive(Debug, Default)]
pub struct Seen {
    pod_times: HashMap<String, Timestamp>,
    service_time: Option<Timestamp>,
}

#[derive(Default)]
pub struct TriggerTimes {
    states: Mutex<HashMap<ObjectKey, Seen>>,
}

impl TriggerTimes {
    /// The trigger time for this sync of `key`, and what it saw, for
    /// [`TriggerTimes::remember`] once the reconcile is over. Reads only.
    pub fn compute(
        &self,
        key: &ObjectKey,
        service_created: Option<Timestamp>,
        pods: &[&PodInfo],
    ) -> (Option<Timestamp>, Seen) {
        let states = lock(&self.states);
        let previous = states.get(key);
        let mut next = Seen {
            pod_times: HashMap::with_capacity(pods.len()),
            service_time: service_created,
        };
        let mut earliest: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| {
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        };
        for pod in pods {
            let Some(t) = pod.ready_transition() else {
                continue;
            };
            let seen = previous.and_then(|p| p.pod_times.get(pod.name()));
            if seen.is_none_or(|seen| t > *seen) {
                consider(t);
            }
            next.pod_times.insert(pod.name().to_string(), t);
        }
        if let Some(t) = service_created
            && previous
                .and_then(|p| p.service_time)
                .is_none_or(|seen| t > seen)
        {
            consider(t);
        }
        // Upstream reports a Service it sees for the first time by its
        // creation time alone, whatever its pods did.
        let trigger = if previous.is_none() {
            service_created
        } else {
            earliest
        };
        (trigger, next)
    }

    /// Keeps what a sync of `key` saw, for the next one to compare with.
    pub fn remember(&self, key: &ObjectKey, seen: Seen) {
        lock(&self.states).insert(key.clone(), seen);
    }

    pub fn forget(&self, key: &ObjectKey) {
        lock(&self.states).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::PodFields;

    fn pod(name: &str, ready_at: Option<i64>) -> PodInfo {
        PodFields {
            name: name.into(),
            ready_transition: ready_at.map(|s| Timestamp::from_second(s).expect("ts")),
            ..PodFields::default()
        }
        .pack()
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("ts")
    }

    /// One sync: its trigger time, what it saw remembered.
    fn sync(t: &TriggerTimes, key: &ObjectKey, pods: &[&PodInfo]) -> Option<Timestamp> {
        let (trigger, seen) = t.compute(key, Some(ts(100)), pods);
        t.remember(key, seen);
        trigger
    }

    #[test]
    fn first_sync_is_the_creation_time_then_changed_pods() {
        let t = TriggerTimes::default();
        let key = ObjectKey {
            namespace: "ns".into(),
            name: "svc".into(),
        };
        let (a, b) = (pod("a", Some(50)), pod("b", Some(150)));
        // Computing remembers nothing: a sync whose effects were not
        // applied leaves the next one where it was.
        assert_eq!(t.compute(&key, Some(ts(100)), &[&a, &b]).0, Some(ts(100)));
        // First sight: the creation time alone, although pod a is earlier.
        assert_eq!(sync(&t, &key, &[&a, &b]), Some(ts(100)));
        // Nothing moved: no trigger time.
        assert_eq!(sync(&t, &key, &[&a, &b]), None);
        // Pod b became ready again later: its new transition time.
        let b2 = pod("b", Some(300));
        assert_eq!(sync(&t, &key, &[&a, &b2]), Some(ts(300)));
        // A new pod without a Ready condition contributes nothing.
        let c = pod("c", None);
        assert_eq!(sync(&t, &key, &[&a, &b2, &c]), None);
        // Forgotten (its objects deleted): first sight again.
        t.forget(&key);
        assert_eq!(sync(&t, &key, &[&a, &b2, &c]), Some(ts(100)));
    }
}
