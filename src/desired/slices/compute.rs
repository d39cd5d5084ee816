//! The desired endpoints of a Service (upstream `reconcileByAddressType`'s
//! desired-state half, `podToEndpoint`, `getEndpointPorts`,
//! `getAddressTypesForService`, `setEndpointSliceLabels`, `newEndpointSlice`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::identity::{EndpointKey, conditions};
use super::{
    ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_MODE, AddressType, AddressTypeEndpoints,
    DesiredSlices, HintMode, LABEL_SERVICE_NAME, LABEL_SLICE_MANAGED_BY, NodeInfo, NodeLookup,
    PortGroup,
};
use crate::desired::ip::{GoIp, IpFamily, family_of_text};
use crate::desired::labels::has_cluster_ip;
use crate::desired::rules::SpewHash;
use crate::desired::spew::slice_port_digest;
use crate::desired::{LABEL_HEADLESS, PodInfo, Rules, pod_reference, ports, should_set_hostname};

/// Labels a slice gets from its controller, never from the Service.
const RESERVED_LABELS: [&str; 3] = [LABEL_SERVICE_NAME, LABEL_SLICE_MANAGED_BY, LABEL_HEADLESS];

/// The desired endpoints of `svc` from its candidate pods (already selected by
/// namespace and selector), with `nodes` for zones, `managed_by` as the
/// manager label and the port order and hint rule of `rules`' release. Which
/// Services get slices at all is decided before
/// (`crate::desired::scope::handling`).
///
/// A pod is kept when it is not terminal and has an IP (terminating pods are
/// kept too, with their conditions saying so) and its Node is known; a pod
/// whose Node is unknown is kept only with publishNotReadyAddresses, and is
/// listed in [`DesiredSlices::pods_on_unknown_nodes`] otherwise.
pub fn desired_slices(
    svc: &Service,
    pods: &[&PodInfo],
    nodes: &impl NodeLookup,
    managed_by: &str,
    rules: Rules,
) -> DesiredSlices {
    let spec = svc.spec.as_ref();
    let publish_not_ready = spec
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut unknown_nodes = BTreeSet::new();
    let mut address_types = Vec::new();
    for address_type in address_types_of(svc) {
        // Keyed by the port set; within a group, by endpoint identity (a later
        // pod with the same identity replaces an earlier one, as upstream's set does).
        let mut groups: BTreeMap<PortSetKey, (Vec<EndpointPort>, BTreeMap<EndpointKey, Endpoint>)> =
            BTreeMap::new();
        for pod in pods {
            if !pod.should_be_in_endpoints(true) {
                continue;
            }
            let ports = endpoint_ports(svc, pod, rules.port_order());
            // Upstream makes the group before looking at the Node or the
            // addresses, so a group may stay empty; the plan needs to know.
            let (_, endpoints) = groups
                .entry(port_set_key(&ports))
                .or_insert_with(|| (ports, BTreeMap::new()));
            let node = nodes.node(pod.node_name().unwrap_or(""));
            if node.is_none() && !publish_not_ready {
                unknown_nodes.insert(pod.name().to_string());
                continue;
            }
            let endpoint = pod_endpoint(svc, pod, node, address_type, publish_not_ready);
            if !endpoint.addresses.is_empty() {
                endpoints.insert(EndpointKey::of(&endpoint), endpoint);
            }
        }
        address_types.push(AddressTypeEndpoints {
            address_type,
            groups: groups
                .into_values()
                .map(|(ports, endpoints)| PortGroup {
                    ports,
                    endpoints: endpoints.into_values().collect(),
                })
                .collect(),
        });
    }
    let meta = &svc.metadata;
    DesiredSlices {
        namespace: meta.namespace.clone().unwrap_or_default(),
        service_name: meta.name.clone().unwrap_or_default(),
        service_uid: meta.uid.clone().unwrap_or_default(),
        service_deleting: meta.deletion_timestamp.is_some(),
        labels: slice_labels(svc, managed_by),
        owner: owner_reference(svc),
        hints: hint_mode(svc, rules),
        port_order: rules.port_order(),
        address_types,
        pods_on_unknown_nodes: unknown_nodes.into_iter().collect(),
    }
}

/// A port set, comparable: (name, port, protocol, appProtocol) in slice order.
pub(super) type PortSetKey = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;

pub(super) fn port_set_key(ports: &[EndpointPort]) -> PortSetKey {
    ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.port,
                p.protocol.clone(),
                p.app_protocol.clone(),
            )
        })
        .collect()
}

/// Sorts ports the way upstream keys and writes them (by their `spew` digest).
pub(crate) fn sort_ports(ports: &mut [EndpointPort], order: SpewHash) {
    ports.sort_by_cached_key(|port| slice_port_digest(port, order));
}

/// Upstream's getAddressTypesForService: one per entry of `spec.ipFamilies`;
/// without any, the cluster IP's family, and both for a headless Service.
fn address_types_of(svc: &Service) -> Vec<AddressType> {
    let spec = svc.spec.as_ref();
    let families = spec
        .and_then(|s| s.ip_families.as_deref())
        .unwrap_or_default();
    let mut types: Vec<AddressType> = families
        .iter()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some(AddressType::IPv4),
            "IPv6" => Some(AddressType::IPv6),
            _ => None,
        })
        .collect();
    types.sort();
    types.dedup();
    if !types.is_empty() {
        return types;
    }
    if has_cluster_ip(svc) {
        let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
        return match family_of_text(cluster_ip) {
            Some(IpFamily::V6) => vec![AddressType::IPv6],
            _ => vec![AddressType::IPv4],
        };
    }
    vec![AddressType::IPv4, AddressType::IPv6]
}

/// Upstream's getEndpointPorts: every Service port that resolves on this pod,
/// with name and protocol always set (to "" when the Service has none).
fn endpoint_ports(svc: &Service, pod: &PodInfo, order: SpewHash) -> Vec<EndpointPort> {
    let service_ports: &[ServicePort] = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let mut out: Vec<EndpointPort> = service_ports
        .iter()
        .filter_map(|sp| {
            let number = ports::resolve_target_port(sp, pod)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(number),
                protocol: Some(sp.protocol.clone().unwrap_or_default()),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect();
    sort_ports(&mut out, order);
    out
}

/// Upstream's podToEndpoint. `serving` is the pod's readiness, `terminating`
/// its deletionTimestamp, and `ready` is serving and not terminating, or
/// always true with publishNotReadyAddresses.
fn pod_endpoint(
    svc: &Service,
    pod: &PodInfo,
    node: Option<&NodeInfo>,
    address_type: AddressType,
    publish_not_ready: bool,
) -> Endpoint {
    let family = match address_type {
        AddressType::IPv4 => IpFamily::V4,
        AddressType::IPv6 => IpFamily::V6,
    };
    let serving = pod.ready();
    let terminating = pod.terminating();
    Endpoint {
        // Upstream reads status.podIPs; the projection's IPs are the same list.
        // Text that does not parse is skipped (the API server stores none).
        addresses: pod
            .pod_ips()
            .filter_map(GoIp::parse)
            .filter(|ip| ip.family() == family)
            .map(GoIp::to_go_string)
            .collect(),
        conditions: Some(conditions(
            publish_not_ready || (serving && !terminating),
            serving,
            terminating,
        )),
        hostname: should_set_hostname(svc, pod)
            .then(|| pod.hostname().map(str::to_string))
            .flatten(),
        target_ref: Some(pod_reference(pod)),
        node_name: pod
            .node_name()
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        zone: node.and_then(NodeInfo::endpoint_zone).map(str::to_string),
        hints: None,
        deprecated_topology: None,
    }
}

/// Upstream's setEndpointSliceLabels for a new slice: the Service's labels
/// without the reserved keys, the headless label when there is no cluster IP,
/// then service-name and managed-by.
fn slice_labels(svc: &Service, managed_by: &str) -> BTreeMap<String, String> {
    let mut labels = service_labels(svc.metadata.labels.as_ref());
    if !has_cluster_ip(svc) {
        labels.insert(LABEL_HEADLESS.to_string(), String::new());
    }
    labels.insert(
        LABEL_SERVICE_NAME.to_string(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_SLICE_MANAGED_BY.to_string(), managed_by.to_string());
    labels
}

/// The labels a slice mirrors from the Service or carries of its own: all but
/// the reserved ones.
pub(super) fn service_labels(
    labels: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    labels
        .into_iter()
        .flatten()
        .filter(|(key, _)| !RESERVED_LABELS.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Upstream's NewControllerRef for the Service.
fn owner_reference(svc: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_string(),
        kind: "Service".to_string(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The hint rule: the topology annotation (its older name first) set to `Auto`
/// or `auto` wins; otherwise `trafficDistribution`: `PreferClose` always,
/// `PreferSameZone` and `PreferSameNode` while the PreferSameTrafficDistribution
/// gate of `rules` is on (it may be off on 1.34 only; locked on from 1.35).
pub fn hint_mode(svc: &Service, rules: Rules) -> HintMode {
    let annotations = svc.metadata.annotations.as_ref();
    let topology = annotations.and_then(|a| {
        a.get(ANNOTATION_TOPOLOGY_AWARE_HINTS)
            .or_else(|| a.get(ANNOTATION_TOPOLOGY_MODE))
    });
    if matches!(topology.map(String::as_str), Some("Auto" | "auto")) {
        return HintMode::Auto;
    }
    let traffic_distribution = svc
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref());
    let prefer_same = rules.prefer_same_traffic_distribution();
    match traffic_distribution {
        Some("PreferClose") => HintMode::SameZone,
        Some("PreferSameZone") if prefer_same => HintMode::SameZone,
        Some("PreferSameNode") if prefer_same => HintMode::SameZoneAndNode,
        _ => HintMode::None,
    }
}
