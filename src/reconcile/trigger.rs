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

#[derive(Default)]
struct ServiceState {
    pod_times: HashMap<String, Timestamp>,
    service_time: Option<Timestamp>,
}

#[derive(Default)]
pub struct TriggerTimes {
    states: Mutex<HashMap<ObjectKey, ServiceState>>,
}

impl TriggerTimes {
    /// The trigger time for this sync of `key`, updating the remembered state.
    pub fn compute(
        &self,
        key: &ObjectKey,
        service_created: Option<Timestamp>,
        pods: &[&PodInfo],
    ) -> Option<Timestamp> {
        let mut states = lock(&self.states);
        let previous = states.remove(key);
        let first_sync = previous.is_none();
        let mut previous = previous.unwrap_or_default();
        let mut next = ServiceState {
            pod_times: HashMap::with_capacity(pods.len()),
            service_time: None,
        };
        let mut earliest: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| {
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        };
        for pod in pods {
            let Some(t) = pod.ready_transition() else {
                continue;
            };
            // A pod's name moves from the previous state to the next (a
            // reconcile per pod flip; pod names are unique in a namespace).
            let (name, seen) = match previous.pod_times.remove_entry(pod.name()) {
                Some((name, seen)) => (name, Some(seen)),
                None => (pod.name().to_string(), None),
            };
            if seen.is_none_or(|seen| t > seen) {
                consider(t);
            }
            next.pod_times.insert(name, t);
        }
        if let Some(t) = service_created {
            if previous.service_time.is_none_or(|seen| t > seen) {
                consider(t);
            }
            next.service_time = Some(t);
        }
        states.insert(key.clone(), next);
        // Upstream reports a Service it sees for the first time by its creation
        // time alone, whatever its pods did.
        if first_sync {
            return service_created;
        }
        earliest
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

    #[test]
    fn first_sync_is_the_creation_time_then_changed_pods() {
        let t = TriggerTimes::default();
        let key = ObjectKey {
            namespace: "ns".into(),
            name: "svc".into(),
        };
        let (a, b) = (pod("a", Some(50)), pod("b", Some(150)));
        // First sight: the creation time alone, although pod a is earlier.
        assert_eq!(t.compute(&key, Some(ts(100)), &[&a, &b]), Some(ts(100)));
        // Nothing moved: no trigger time.
        assert_eq!(t.compute(&key, Some(ts(100)), &[&a, &b]), None);
        // Pod b became ready again later: its new transition time.
        let b2 = pod("b", Some(300));
        assert_eq!(t.compute(&key, Some(ts(100)), &[&a, &b2]), Some(ts(300)));
        // A new pod without a Ready condition contributes nothing.
        let c = pod("c", None);
        assert_eq!(t.compute(&key, Some(ts(100)), &[&a, &b2, &c]), None);
    }
}
