//! The convergence oracle, independent of the controller: from a live list of
//! Services and pods (straight from kube-apiserver), what the Endpoints and
//! EndpointSlices of a namespace must hold, compared with what they hold.
//!
//! For each Service with a selector: the ready addresses are the IPs of the
//! pods whose labels match the selector, that run (phase not Succeeded or
//! Failed), are not terminating, have an IP and a `Ready=True` condition.
//! - Endpoints: the same ready IPs; above 1,000 (the Endpoints API's
//!   capacity), exactly 1,000 of them, all from that set. Their ports are the
//!   Service's target ports (numeric here) whenever there is an address.
//! - EndpointSlices (label `kubernetes.io/service-name`): the union of their
//!   ready endpoints is exactly the ready IPs (slices have no cap).
//! - No Endpoints nor slices for a Service that does not exist.
//!
//! A pod whose DELETE kube-apiserver's watch cache missed (the etcd-level
//! lost DELETE) is still in every LIST: the names in `ghosts` are read with a
//! GET (served by etcd), and left out when it answers 404.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

/// The Endpoints API's capacity.
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;

/// Whether the pod counts as a ready address.
pub fn pod_ready_ip(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    status.pod_ip.clone()
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What the oracle found in one pass.
#[derive(Debug, Clone, Default)]
pub struct Check {
    /// Services with a selector checked.
    pub services: usize,
    /// Ready addresses called for, over all Services.
    pub addresses: usize,
    /// What differs (empty: converged).
    pub problems: Vec<String>,
}

impl Check {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The first few problems, for a log line or the report.
    pub fn summary(&self) -> String {
        let mut s: Vec<String> = self.problems.iter().take(4).cloned().collect();
        if self.problems.len() > 4 {
            s.push(format!("… {} more", self.problems.len() - 4));
        }
        s.join("; ")
    }
}

/// One pass of the oracle over namespace `ns`.
pub async fn check(client: &Client, ns: &str, ghosts: &BTreeSet<String>) -> Result<Check> {
    let lp = ListParams::default();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let mut pods = pods_api.list(&lp).await?.items;
    let endpoints = Api::<Endpoints>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let mut gone = BTreeSet::new();
    for name in ghosts {
        if pods.iter().any(|p| &p.name_any() == name) && pods_api.get_opt(name).await?.is_none() {
            gone.insert(name.clone());
        }
    }
    pods.retain(|p| !gone.contains(&p.name_any()));

    let mut result = Check::default();
    let endpoints: BTreeMap<String, &Endpoints> =
        endpoints.iter().map(|e| (e.name_any(), e)).collect();
    let mut slice_ips: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for slice in &slices {
        let Some(service) = slice.labels().get("kubernetes.io/service-name") else {
            continue;
        };
        let ips = slice_ips.entry(service.clone()).or_default();
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if ready {
                ips.extend(endpoint.addresses.iter().cloned());
            }
        }
    }
    let mut names = BTreeSet::new();
    for svc in &services {
        let name = svc.name_any();
        names.insert(name.clone());
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        result.services += 1;
        let want: BTreeSet<String> = pods
            .iter()
            .filter(|p| selects(selector, p))
            .filter_map(pod_ready_ip)
            .collect();
        result.addresses += want.len();
        let want_ports: BTreeSet<i32> = spec
            .ports
            .iter()
            .flatten()
            .map(|p| match &p.target_port {
                Some(IntOrString::Int(n)) => *n,
                _ => p.port,
            })
            .collect();
        match endpoints.get(&name) {
            None => result.problems.push(format!("{name}: no Endpoints")),
            Some(ep) => {
                let have: BTreeSet<String> = eg_harness::ready_ips(ep).into_iter().collect();
                if want.len() <= MAX_ENDPOINTS_ADDRESSES {
                    if have != want {
                        result
                            .problems
                            .push(format!("{name}: Endpoints {}", diff(&have, &want)));
                    }
                } else if have.len() != MAX_ENDPOINTS_ADDRESSES || !have.is_subset(&want) {
                    result.problems.push(format!(
                        "{name}: over capacity, Endpoints hold {} addresses ({} not ready or gone) for {} ready",
                        have.len(),
                        have.difference(&want).count(),
                        want.len()
                    ));
                }
                if !want.is_empty() {
                    let have_ports: BTreeSet<i32> = ep
                        .subsets
                        .iter()
                        .flatten()
                        .flat_map(|s| s.ports.iter().flatten())
                        .map(|p| p.port)
                        .collect();
                    if have_ports != want_ports {
                        result.problems.push(format!(
                            "{name}: Endpoints ports {have_ports:?} != {want_ports:?}"
                        ));
                    }
                }
            }
        }
        let have = slice_ips.get(&name).cloned().unwrap_or_default();
        if have != want {
            result
                .problems
                .push(format!("{name}: EndpointSlices {}", diff(&have, &want)));
        }
    }
    for name in endpoints.keys() {
        if !names.contains(name) {
            result
                .problems
                .push(format!("{name}: Endpoints of a deleted Service remain"));
        }
    }
    for name in slice_ips.keys() {
        if !names.contains(name) {
            result.problems.push(format!(
                "{name}: EndpointSlices of a deleted Service remain"
            ));
        }
    }
    Ok(result)
}

fn diff(have: &BTreeSet<String>, want: &BTreeSet<String>) -> String {
    let extra: Vec<&String> = have.difference(want).take(3).collect();
    let missing: Vec<&String> = want.difference(have).take(3).collect();
    format!(
        "{} ready, {} called for; extra {:?}{}, missing {:?}{}",
        have.len(),
        want.len(),
        extra,
        if have.difference(want).count() > 3 {
            "…"
        } else {
            ""
        },
        missing,
        if want.difference(have).count() > 3 {
            "…"
        } else {
            ""
        },
    )
}
