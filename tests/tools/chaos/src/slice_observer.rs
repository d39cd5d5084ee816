//! The direct watches of the EndpointSlice rows. A slice row is hurt when an
//! endpoint leaves the EndpointSlices of a Service at a resourceVersion at
//! which that Service existed and selected a live pod with that address:
//! the traffic of a live pod lost on a cache's word. Services, pods and
//! slices are watched straight from kube-apiserver (one etcd, one revision
//! order), their histories kept, and judged afterwards by [`History::removals`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};
use tokio::task::JoinHandle;

use super::observer::{Change, observe, provenance, unsure_before};

/// The label that ties a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

type Labels = BTreeMap<String, String>;

/// One version of an object at `rv` of `epoch`; `state` is `None` once it is
/// gone.
#[derive(Debug, Clone)]
struct Version<T> {
    name: String,
    epoch: u64,
    rv: u64,
    /// Found by a relist: the change happened after this RV (see
    /// [`Change::relisted_since`]).
    relisted_since: Option<u64>,
    state: Option<T>,
}

/// A live pod as far as slices go: its labels and IPs (none while it has no
/// address; terminal pods count as gone, no controller publishes them).
#[derive(Debug, Clone)]
struct PodState {
    labels: Labels,
    ips: BTreeSet<String>,
}

/// A slice: the Service it belongs to and every address it lists.
#[derive(Debug, Clone)]
struct SliceState {
    service: String,
    addresses: BTreeSet<String>,
}

/// What the watches saw; `removals` judges it.
#[derive(Debug, Default)]
pub struct History {
    /// Service selectors (`None` inside `Some` never happens: a Service
    /// without a selector is recorded with an empty map that selects nothing
    /// here, as no controller publishes endpoints for it).
    services: Vec<Version<Option<Labels>>>,
    pods: Vec<Version<PodState>>,
    slices: Vec<Version<SliceState>>,
}

fn version<K, T>(change: Change<K>, epoch: u64, state: impl FnOnce(&K) -> Option<T>) -> Version<T> {
    let state = match (&change.obj, change.kind) {
        (Some(obj), "ADDED" | "MODIFIED") => state(obj),
        _ => None,
    };
    Version {
        name: change.name,
        epoch,
        rv: change.rv,
        relisted_since: change.relisted_since,
        state,
    }
}

fn pod_state(pod: &Pod) -> Option<PodState> {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    let ips = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|ip| ip.ip.clone())
        .chain(status.and_then(|s| s.pod_ip.clone()))
        .collect();
    Some(PodState {
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ips,
    })
}

fn slice_state(slice: &EndpointSlice) -> Option<SliceState> {
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(SliceState {
        service: service.clone(),
        addresses: slice
            .endpoints
            .iter()
            .flatten()
            .flat_map(|e| e.addresses.iter().cloned())
            .collect(),
    })
}

fn lock(history: &Mutex<History>) -> std::sync::MutexGuard<'_, History> {
    history.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the three watches of `namespace` for `epoch`, recording into
/// `history`.
pub(super) fn spawn(
    client: &Client,
    namespace: &str,
    epoch: u64,
    history: &Arc<Mutex<History>>,
) -> Vec<JoinHandle<()>> {
    let (services, pods, slices) = (history.clone(), history.clone(), history.clone());
    vec![
        tokio::spawn(observe(
            Api::<Service>::namespaced(client.clone(), namespace),
            move |change: Change<Service>| {
                let v = version(change, epoch, |svc: &Service| {
                    Some(svc.spec.as_ref().and_then(|s| s.selector.clone()))
                });
                lock(&services).services.push(v);
            },
        )),
        tokio::spawn(observe(
            Api::<Pod>::namespaced(client.clone(), namespace),
            move |change: Change<Pod>| {
                let v = version(change, epoch, pod_state);
                lock(&pods).pods.push(v);
            },
        )),
        tokio::spawn(observe(
            Api::<EndpointSlice>::namespaced(client.clone(), namespace),
            move |change: Change<EndpointSlice>| {
                let v = version(change, epoch, slice_state);
                lock(&slices).slices.push(v);
            },
        )),
    ]
}

/// The versions of each name, in (epoch, rv) order.
fn by_name<T>(versions: &[Version<T>]) -> HashMap<&str, Vec<&Version<T>>> {
    let mut index: HashMap<&str, Vec<&Version<T>>> = HashMap::new();
    for v in versions {
        index.entry(v.name.as_str()).or_default().push(v);
    }
    for list in index.values_mut() {
        list.sort_by_key(|v| (v.epoch, v.rv));
    }
    index
}

/// The last of `versions` (in (epoch, rv) order) in `epoch` before `rv`;
/// `None` also when the next version was found by a relist that may have
/// happened before `rv` (the state at `rv` is then not known).
fn at<'a, T>(versions: &[&'a Version<T>], epoch: u64, rv: u64) -> Option<&'a T> {
    let end = versions.partition_point(|v| (v.epoch, v.rv) < (epoch, rv));
    let unsure = versions
        .get(end)
        .is_some_and(|next| next.epoch == epoch && unsure_before(next.relisted_since, rv));
    if unsure {
        return None;
    }
    versions[..end]
        .last()
        .filter(|v| v.epoch == epoch)
        .and_then(|v| v.state.as_ref())
}

/// The histories indexed for the judgement: by name, and pod names by every
/// address they ever had.
struct Index<'a> {
    services: HashMap<&'a str, Vec<&'a Version<Option<Labels>>>>,
    pods: HashMap<&'a str, Vec<&'a Version<PodState>>>,
    pods_by_ip: HashMap<&'a str, BTreeSet<&'a str>>,
}

impl Index<'_> {
    /// Whether, at `rv` of `epoch`, Service `service` selected a live pod
    /// that has `ip`.
    fn wanted(&self, service: &str, ip: &str, epoch: u64, rv: u64) -> bool {
        let Some(Some(selector)) = self.services.get(service).and_then(|v| at(v, epoch, rv)) else {
            return false;
        };
        self.pods_by_ip
            .get(ip)
            .into_iter()
            .flatten()
            .filter_map(|name| self.pods.get(name).and_then(|v| at(v, epoch, rv)))
            .any(|pod| {
                pod.ips.contains(ip) && selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
            })
    }
}

/// A slice event and the addresses of its Service's slices after it.
type Union<'a> = (&'a Version<SliceState>, BTreeSet<&'a str>);

impl History {
    /// Every version of Service `name` the watches saw, one per line: what a
    /// failed judgement needs to be checked by hand.
    pub fn service_versions(&self, name: &str) -> String {
        let mut out = String::new();
        for v in by_name(&self.services).get(name).into_iter().flatten() {
            out.push_str(&format!(
                "  epoch {} rv {}: {}{}\n",
                v.epoch,
                v.rv,
                if v.state.is_some() { "exists" } else { "gone" },
                v.relisted_since
                    .map(|s| format!(" (relist, after rv {s})"))
                    .unwrap_or_default()
            ));
        }
        out
    }

    /// Every endpoint removed from a Service's slices while that Service
    /// selected a live pod with its address. An address that leaves one
    /// slice and is back in the Service's next slice event (moved between
    /// slices) is not a removal.
    pub fn removals(&self) -> Vec<String> {
        let mut pods_by_ip: HashMap<&str, BTreeSet<&str>> = HashMap::new();
        for pod in &self.pods {
            for ip in pod.state.iter().flat_map(|p| &p.ips) {
                pods_by_ip.entry(ip).or_default().insert(&pod.name);
            }
        }
        let index = Index {
            services: by_name(&self.services),
            pods: by_name(&self.pods),
            pods_by_ip,
        };
        let mut events: Vec<&Version<SliceState>> = self.slices.iter().collect();
        events.sort_by_key(|v| (v.epoch, v.rv));
        // Replay, per (epoch, Service): its slices now, and the union of
        // their addresses after each of its slice events, in order.
        let mut owner: HashMap<(u64, &str), &str> = HashMap::new();
        let mut slices: HashMap<(u64, &str), BTreeMap<&str, &SliceState>> = HashMap::new();
        let mut unions: BTreeMap<(u64, &str), Vec<Union>> = BTreeMap::new();
        for v in events {
            let key = (v.epoch, v.name.as_str());
            let service = match (&v.state, owner.get(&key)) {
                (Some(now), _) => now.service.as_str(),
                (None, Some(before)) => before,
                (None, None) => continue,
            };
            let of_service = slices.entry((v.epoch, service)).or_default();
            match &v.state {
                Some(state) => {
                    owner.insert(key, state.service.as_str());
                    of_service.insert(&v.name, state);
                }
                None => {
                    owner.remove(&key);
                    of_service.remove(v.name.as_str());
                }
            }
            let union = of_service
                .values()
                .flat_map(|s| s.addresses.iter().map(String::as_str))
                .collect();
            unions
                .entry((v.epoch, service))
                .or_default()
                .push((v, union));
        }
        let mut found = Vec::new();
        for ((_, service), history) in &unions {
            for (i, window) in history.windows(2).enumerate() {
                let [(_, before), (v, after)] = window else {
                    continue;
                };
                let next = history.get(i + 2).map(|(_, u)| u);
                for ip in before.difference(after) {
                    if next.is_some_and(|n| n.contains(ip)) {
                        continue;
                    }
                    if index.wanted(service, ip, v.epoch, v.rv) {
                        found.push(format!(
                            "{ip} left the slices of {service} at rv {}{}",
                            v.rv,
                            provenance(v.epoch, v.relisted_since)
                        ));
                    }
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, rv: u64, app: Option<&str>) -> Version<Option<Labels>> {
        Version {
            name: name.into(),
            epoch: 0,
            rv,
            relisted_since: None,
            state: app.map(|a| Some(Labels::from([("app".to_string(), a.to_string())]))),
        }
    }

    fn pod(name: &str, rv: u64, app: &str, ip: Option<&str>) -> Version<PodState> {
        Version {
            name: name.into(),
            epoch: 0,
            rv,
            relisted_since: None,
            state: ip.map(|ip| PodState {
                labels: Labels::from([("app".to_string(), app.to_string())]),
                ips: BTreeSet::from([ip.to_string()]),
            }),
        }
    }

    fn slice(name: &str, rv: u64, service: &str, ips: Option<&[&str]>) -> Version<SliceState> {
        Version {
            name: name.into(),
            epoch: 0,
            rv,
            relisted_since: None,
            state: ips.map(|ips| SliceState {
                service: service.into(),
                addresses: ips.iter().map(|s| s.to_string()).collect(),
            }),
        }
    }

    #[test]
    fn a_removal_is_wrong_only_while_the_service_selects_a_live_pod_with_that_address() {
        let history = History {
            services: vec![
                svc("a", 1, Some("a")),
                svc("a", 20, Some("none")),
                svc("a", 30, Some("a")),
            ],
            pods: vec![
                pod("a-0", 2, "a", Some("10.0.0.1")),
                pod("a-1", 3, "a", Some("10.0.0.2")),
                pod("a-1", 10, "a", None),
            ],
            slices: vec![
                slice("a-x", 5, "a", Some(&["10.0.0.1", "10.0.0.2"])),
                // The deleted pod leaves: right.
                slice("a-x", 11, "a", Some(&["10.0.0.1"])),
                // The selector matched nothing at 20: emptying at 21 is right.
                slice("a-x", 21, "a", Some(&[])),
                slice("a-x", 31, "a", Some(&["10.0.0.1"])),
                // Emptied while the selector again matches a-0: wrong.
                slice("a-x", 40, "a", Some(&[])),
            ],
        };
        assert_eq!(
            history.removals(),
            vec!["10.0.0.1 left the slices of a at rv 40"]
        );
    }

    #[test]
    fn a_slice_deleted_while_its_service_lives_is_a_removal_and_a_move_is_not() {
        let history = History {
            services: vec![svc("a", 1, Some("a"))],
            pods: vec![
                pod("a-0", 2, "a", Some("10.0.0.1")),
                pod("a-1", 2, "a", Some("10.0.0.2")),
            ],
            slices: vec![
                slice("a-x", 5, "a", Some(&["10.0.0.1", "10.0.0.2"])),
                // 10.0.0.2 moves to a-y.
                slice("a-x", 6, "a", Some(&["10.0.0.1"])),
                slice("a-y", 7, "a", Some(&["10.0.0.2"])),
                slice("a-x", 9, "a", None),
            ],
        };
        assert_eq!(
            history.removals(),
            vec!["10.0.0.1 left the slices of a at rv 9"]
        );
    }

    #[test]
    fn a_removal_inside_a_relist_window_of_its_pods_deletion_is_not_judged_wrong() {
        // The pod watch broke at rv 10 and its relist at rv 30 found a-1
        // gone: the pod was deleted somewhere in (10, 30]. Its endpoint left
        // at 20, inside that window: not provably wrong. a-0's endpoint left
        // at 40, after the window, while a-0 lived: wrong.
        let mut gone = pod("a-1", 30, "a", None);
        gone.relisted_since = Some(10);
        let history = History {
            services: vec![svc("a", 1, Some("a"))],
            pods: vec![
                pod("a-0", 2, "a", Some("10.0.0.1")),
                pod("a-1", 3, "a", Some("10.0.0.2")),
                gone,
            ],
            slices: vec![
                slice("a-x", 5, "a", Some(&["10.0.0.1", "10.0.0.2"])),
                slice("a-x", 20, "a", Some(&["10.0.0.1"])),
                slice("a-x", 40, "a", Some(&[])),
            ],
        };
        assert_eq!(
            history.removals(),
            vec!["10.0.0.1 left the slices of a at rv 40"]
        );
    }
}
