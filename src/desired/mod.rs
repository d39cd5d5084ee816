//! Desired Endpoints: a pure function of (Service, candidate pods, trigger time,
//! the release's [`Rules`]).
//!
//! Everything here reproduces what kube-controller-manager's endpoints controller
//! (Kubernetes 1.34 to 1.37, as [`Rules`] say) writes, byte for byte, because a
//! differential test compares our objects with upstream's. Upstream sources the behaviour was taken from:
//! `pkg/controller/endpoint/endpoints_controller.go` (syncService, label check,
//! truncation), `pkg/api/v1/endpoints/util.go` (repacking and ordering),
//! `k8s.io/endpointslice` (`utils.go` FindPort, `util/controller_utils.go` pod
//! filter and hostname rule, `util/trigger_time_tracker.go`).
//!
//! Layout: `pod` projects Pods, `ports` resolves target ports, `ip`
//! normalises IP text, `repack` builds the canonical subset layout whose order
//! comes from `spew` digests, `capacity` applies the 1000-address cap,
//! `labels` builds the object and decides whether to write, `trigger` formats
//! the trigger time. `slices` does the same for EndpointSlices, reusing the
//! pod projection, port resolution, IP normalisation and hostname rule.
//!
//! Notes on the API contract:
//! - Upstream orders ports and subsets by MD5 (1.34) or FNV-1a 128 (1.35 and
//!   later) digests of a go-spew dump; see `spew` and `rules`.
//! - `needs_write` and `build_endpoints` take the managed-by value to check and
//!   write: upstream's label check requires `managed-by` to equal its own name,
//!   so the comparison is made against whatever this controller writes
//!   ([`ManagedBy`]: upstream's value by default).
//! - A Service port without targetPort resolves to its port (the API server's
//!   defaulting), although upstream's code alone would use 0; a Service read
//!   from the API server always has it set.
//! - Pod IPs that do not parse are skipped; upstream would write the text
//!   `<nil>` and fail validation. The API server never stores such pod IPs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, ObjectReference, Service};

mod capacity;
mod equality;
mod ip;
mod labels;
mod pod;
mod pod_info;
mod ports;
mod repack;
pub mod rules;
pub mod scope;
pub mod slices;
mod spew;
mod trigger;

#[cfg(test)]
mod compute_tests;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod testkit;

pub use capacity::{ANNOTATION_OVER_CAPACITY, MAX_ADDRESSES, OVER_CAPACITY_TRUNCATED};
pub use labels::{EndpointsMarks, LABEL_HEADLESS, build_endpoints, needs_write};
pub(crate) use pod::spec_and_status_accessors;
pub use pod::{ContainerView, NamedPort, PodFields, PodSource};
pub use pod_info::{NamedPortRef, PodInfo};
pub use rules::{FeatureGates, KubeRelease, Rules, ServerRelease, SpewHash};
pub use trigger::{ANNOTATION_LAST_CHANGE_TRIGGER_TIME, format_rfc3339_nano, trigger_time};

use ip::{GoIp, IpFamily, family_of_text};
use repack::{AppProtocolIdentity, repack_owned_subsets};

/// Label naming the controller that manages an Endpoints object.
pub const LABEL_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
/// The managed-by value kube-controller-manager's endpoints controller writes.
pub const UPSTREAM_MANAGER: &str = "endpoint-controller";
/// This controller's own managed-by value (written with `--managed-by own`).
pub const MANAGER: &str = "endpoints-guard";

/// Which `managed-by` values the written Endpoints and EndpointSlices carry
/// (`--managed-by`). Either way, objects labelled with either value are
/// recognised as this controller's (adopted, swept, guarded); see
/// `docs/endpointslices.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ManagedBy {
    /// Upstream's values, `endpoint-controller` and
    /// `endpointslice-controller.k8s.io`: what conformance specs and
    /// consumers that select on the label expect.
    #[default]
    Upstream,
    /// `endpoints-guard` on both kinds.
    Own,
}

impl ManagedBy {
    /// The `endpoints.kubernetes.io/managed-by` value written on Endpoints.
    pub fn endpoints(self) -> &'static str {
        match self {
            ManagedBy::Upstream => UPSTREAM_MANAGER,
            ManagedBy::Own => MANAGER,
        }
    }

    /// The `endpointslice.kubernetes.io/managed-by` value written on slices.
    pub fn slices(self) -> &'static str {
        match self {
            ManagedBy::Upstream => slices::UPSTREAM_SLICE_MANAGER,
            ManagedBy::Own => MANAGER,
        }
    }
}

/// Subsets in upstream's canonical layout and order, before the 1000-address
/// truncation (which [`build_endpoints`] applies; [`needs_write`] compares the
/// untruncated subsets, as upstream does).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComputedSubsets {
    pub subsets: Vec<EndpointSubset>,
}

/// A set of labels a selector can be matched against.
pub trait Labels {
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for PodInfo {
    fn label(&self, key: &str) -> Option<&str> {
        PodInfo::label(self, key)
    }
}

/// Equality-based selector match; an empty selector matches every label set.
pub fn selector_matches(selector: &BTreeMap<String, String>, labels: &impl Labels) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.label(key) == Some(value.as_str()))
}

/// Compute the Endpoints subsets of `svc` from its candidate pods (already
/// selected by namespace and selector): drops pods that must not appear, places
/// the rest as ready or not ready, resolves ports, then repacks and sorts in
/// the order of `rules`' release.
pub fn compute_subsets(svc: &Service, pods: &[&PodInfo], rules: Rules) -> ComputedSubsets {
    let spec = svc.spec.as_ref();
    let publish_not_ready = spec
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let service_ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let headless = spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None");

    // Like upstream: one single-address, single-port subset per (pod, port),
    // which repacking then merges.
    let mut expanded: Vec<EndpointSubset> = Vec::new();
    for pod in pods {
        if !pod.should_be_in_endpoints(publish_not_ready) {
            continue;
        }
        let Some(address) = endpoint_address(svc, pod) else {
            continue;
        };
        let ready = publish_not_ready || pod.ready();
        let single = |address: EndpointAddress, ports| {
            let addresses = Some(vec![address]);
            if ready {
                EndpointSubset {
                    addresses,
                    not_ready_addresses: None,
                    ports,
                }
            } else {
                EndpointSubset {
                    addresses: None,
                    not_ready_addresses: addresses,
                    ports,
                }
            }
        };
        if service_ports.is_empty() {
            // Only a headless Service ("None", not merely empty) lists pods without ports.
            if headless {
                expanded.push(single(address, None));
            }
            continue;
        }
        let pod_ports: Vec<_> = service_ports
            .iter()
            .filter_map(|service_port| {
                ports::resolve_target_port(service_port, pod)
                    .map(|number| ports::endpoint_port(service_port, number))
            })
            .collect();
        // A copy of the address for every port but the last, which takes it.
        let last = pod_ports.len();
        let mut address = Some(address);
        for (at, port) in pod_ports.into_iter().enumerate() {
            let copy = if at + 1 == last {
                address.take()
            } else {
                address.clone()
            };
            if let Some(copy) = copy {
                expanded.push(single(copy, Some(vec![port])));
            }
        }
    }
    ComputedSubsets {
        subsets: repack_owned_subsets(expanded, AppProtocolIdentity::ByValue, rules.port_order()),
    }
}

/// The address family this Service's Endpoints carry for `pod`: the first of
/// `spec.ipFamilies`; without it the cluster IP's family; for a headless Service
/// without either, the family of the pod's primary IP.
fn service_family(svc: &Service, pod: &PodInfo) -> IpFamily {
    let spec = svc.spec.as_ref();
    if let Some(first) = spec
        .and_then(|s| s.ip_families.as_ref())
        .and_then(|f| f.first())
    {
        return if first == "IPv6" {
            IpFamily::V6
        } else {
            IpFamily::V4
        };
    }
    let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
    let deciding_ip = if !cluster_ip.is_empty() && cluster_ip != "None" {
        cluster_ip
    } else {
        pod.pod_ips().next().unwrap_or("")
    };
    // Unparsable text counts as "not IPv6", i.e. IPv4.
    family_of_text(deciding_ip).unwrap_or(IpFamily::V4)
}

/// Upstream's podToEndpointAddressForService plus the hostname rule; `None` when
/// the pod has no IP of the Service's family.
fn endpoint_address(svc: &Service, pod: &PodInfo) -> Option<EndpointAddress> {
    let family = service_family(svc, pod);
    let ip = pod
        .pod_ips()
        .filter_map(GoIp::parse)
        .find(|ip| ip.family() == family)?;
    Some(EndpointAddress {
        ip: ip.to_go_string(),
        hostname: should_set_hostname(svc, pod)
            .then(|| pod.hostname().map(str::to_string))
            .flatten(),
        // Upstream points at the pod's nodeName field, so it is written even when "".
        node_name: Some(pod.node_name().unwrap_or_default().to_string()),
        target_ref: Some(pod_reference(pod)),
    })
}

/// The targetRef both controllers write for a pod: kind, namespace, name and
/// uid (an empty uid is omitted, as Go's `omitempty` does).
pub(crate) fn pod_reference(pod: &PodInfo) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".to_string()),
        namespace: Some(pod.namespace().to_string()),
        name: Some(pod.name().to_string()),
        uid: (!pod.uid().is_empty()).then(|| pod.uid().to_string()),
        ..ObjectReference::default()
    }
}

/// Upstream's ShouldSetHostname: a non-empty hostname and a subdomain equal to
/// the Service's name in the same namespace (headless or not).
pub(crate) fn should_set_hostname(svc: &Service, pod: &PodInfo) -> bool {
    let has_hostname = pod.hostname().is_some_and(|h| !h.is_empty());
    let service_name = svc.metadata.name.as_deref().unwrap_or("");
    let service_namespace = svc.metadata.namespace.as_deref().unwrap_or("");
    has_hostname
        && pod.subdomain().unwrap_or("") == service_name
        && service_namespace == pod.namespace()
}
