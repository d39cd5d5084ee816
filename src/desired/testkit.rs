//! Builders shared by the unit tests of this module.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, ObjectReference, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{NamedPort, PodFields};

pub fn port(name: &str, number: i32, protocol: &str, app_protocol: Option<&str>) -> EndpointPort {
    EndpointPort {
        name: (!name.is_empty()).then(|| name.to_string()),
        port: number,
        protocol: (!protocol.is_empty()).then(|| protocol.to_string()),
        app_protocol: app_protocol.map(str::to_string),
    }
}

pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

pub fn address(
    ip: &str,
    node: Option<&str>,
    reference: Option<ObjectReference>,
) -> EndpointAddress {
    EndpointAddress {
        ip: ip.into(),
        hostname: None,
        node_name: node.map(str::to_string),
        target_ref: reference,
    }
}

pub fn subset(
    ready: Option<Vec<EndpointAddress>>,
    not_ready: Option<Vec<EndpointAddress>>,
    ports: Option<Vec<EndpointPort>>,
) -> EndpointSubset {
    EndpointSubset {
        addresses: ready,
        not_ready_addresses: not_ready,
        ports,
    }
}

/// A ready, running pod in namespace "default" with one IPv4 address.
pub fn pod(name: &str, ip: &str) -> PodFields {
    PodFields {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
        phase: Some("Running".into()),
        pod_ips: vec![ip.to_string()],
        ready: true,
        node_name: Some("node-1".into()),
        container_ports: vec![NamedPort {
            name: "http".into(),
            container_port: 8080,
            protocol: "TCP".into(),
        }],
        ..PodFields::default()
    }
}

/// A label or annotation map from pairs.
pub fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A named container port.
pub fn named_port(name: &str, number: i32, protocol: &str) -> NamedPort {
    NamedPort {
        name: name.into(),
        container_port: number,
        protocol: protocol.into(),
    }
}

pub fn service_port(name: &str, number: i32, target: Option<IntOrString>) -> ServicePort {
    ServicePort {
        name: (!name.is_empty()).then(|| name.to_string()),
        port: number,
        protocol: Some("TCP".into()),
        target_port: target,
        ..ServicePort::default()
    }
}

/// A ClusterIP Service "web" in "default" selecting app=web, IPv4.
pub fn service(ports: Vec<ServicePort>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            ip_families: Some(vec!["IPv4".into()]),
            selector: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

pub fn spec_mut(svc: &mut Service) -> &mut ServiceSpec {
    svc.spec.get_or_insert_with(ServiceSpec::default)
}

/// The rules of Kubernetes 1.36, whose code printed the golden values of
/// these tests.
pub const RULES_1_36: super::Rules = super::Rules::of(super::KubeRelease::V1_36);
