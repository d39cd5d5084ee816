//! The pod projection the caches keep instead of whole Pods: [`PodFields`]
//! to build and edit, packed into [`PodInfo`] (see `packed`) to keep.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodIP};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::pod_info::{Parts, PodInfo};

/// What a pod contributes to Endpoints, as owned fields: the form to build,
/// edit and compare in tests. The caches keep it packed, as [`PodInfo`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFields {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub phase: Option<String>,
    /// `status.podIPs` in order; `[status.podIP]` when podIPs is empty.
    ///
    /// The API server keeps the two consistent (`podIPs[0] == podIP`, podIPs filled
    /// from podIP), so the first entry also stands for `status.podIP` where
    /// upstream reads that field.
    pub pod_ips: Vec<String>,
    /// The first PodReady condition has status "True".
    pub ready: bool,
    /// lastTransitionTime of that Ready condition (upstream's trigger time source).
    pub ready_transition: Option<Timestamp>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    pub node_name: Option<String>,
    /// Named container ports, in the order upstream searches them for a named
    /// targetPort: `spec.containers`, then sidecars (`spec.initContainers` with
    /// `restartPolicy: Always`). Unnamed ports can never match a named
    /// targetPort, so they are not kept.
    pub container_ports: Vec<NamedPort>,
}

/// One named container port.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamedPort {
    pub name: String,
    pub container_port: i32,
    /// As written on the container; "" when absent (upstream compares Go strings).
    pub protocol: String,
}

const SIDECAR_RESTART_POLICY: &str = "Always";

impl PodFields {
    /// The packed form the caches keep.
    pub fn pack(&self) -> PodInfo {
        PodInfo::pack(&Parts {
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
            resource_version: &self.resource_version,
            phase: self.phase.as_deref(),
            hostname: self.hostname.as_deref(),
            subdomain: self.subdomain.as_deref(),
            node_name: self.node_name.as_deref(),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            pod_ips: self.pod_ips.iter().map(String::as_str).collect(),
            ports: self
                .container_ports
                .iter()
                .map(|p| (p.name.as_str(), p.container_port, p.protocol.as_str()))
                .collect(),
            ready: self.ready,
            terminating: self.terminating,
            ready_transition: self.ready_transition,
        })
    }
}

/// One container as the projection reads it.
pub struct ContainerView<'a> {
    pub ports: &'a [ContainerPort],
    pub restart_policy: Option<&'a str>,
}

impl<'a> ContainerView<'a> {
    fn of(container: &'a Container) -> Self {
        Self {
            ports: container.ports.as_deref().unwrap_or_default(),
            restart_policy: container.restart_policy.as_deref(),
        }
    }
}

/// What a pod's projection reads, from a whole `Pod` or from the watch's
/// slim decode (`crate::wire::PodWire`): one projection for both.
pub trait PodSource {
    fn meta(&self) -> &ObjectMeta;
    /// `spec.containers`.
    fn containers(&self) -> impl Iterator<Item = ContainerView<'_>>;
    /// `spec.initContainers`.
    fn init_containers(&self) -> impl Iterator<Item = ContainerView<'_>>;
    fn hostname(&self) -> Option<&str>;
    fn subdomain(&self) -> Option<&str>;
    fn node_name(&self) -> Option<&str>;
    fn phase(&self) -> Option<&str>;
    /// `status.podIP`.
    fn pod_ip(&self) -> Option<&str>;
    /// `status.podIPs`.
    fn pod_ips(&self) -> &[PodIP];
    /// `status.conditions`.
    fn conditions(&self) -> &[PodCondition];
}

/// The [`PodSource`] accessors that read `self.spec` and `self.status` by
/// field name: the same for `Pod` and for the watch's slim `PodWire`
/// (`src/wire/mod.rs`), whose spec and status keep those fields under the same
/// names and types.
macro_rules! spec_and_status_accessors {
    () => {
        fn hostname(&self) -> Option<&str> {
            self.spec.as_ref().and_then(|s| s.hostname.as_deref())
        }
        fn subdomain(&self) -> Option<&str> {
            self.spec.as_ref().and_then(|s| s.subdomain.as_deref())
        }
        fn node_name(&self) -> Option<&str> {
            self.spec.as_ref().and_then(|s| s.node_name.as_deref())
        }
        fn phase(&self) -> Option<&str> {
            self.status.as_ref().and_then(|s| s.phase.as_deref())
        }
        fn pod_ip(&self) -> Option<&str> {
            self.status.as_ref().and_then(|s| s.pod_ip.as_deref())
        }
        fn pod_ips(&self) -> &[PodIP] {
            self.status
                .as_ref()
                .and_then(|s| s.pod_ips.as_deref())
                .unwrap_or_default()
        }
        fn conditions(&self) -> &[PodCondition] {
            self.status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .unwrap_or_default()
        }
    };
}
pub(crate) use spec_and_status_accessors;

impl PodSource for Pod {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn containers(&self) -> impl Iterator<Item = ContainerView<'_>> {
        self.spec
            .iter()
            .flat_map(|s| s.containers.iter().map(ContainerView::of))
    }
    fn init_containers(&self) -> impl Iterator<Item = ContainerView<'_>> {
        self.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().map(ContainerView::of))
    }
    spec_and_status_accessors!();
}

impl PodInfo {
    /// Projects a Pod; `None` when it has no name or namespace.
    pub fn from_pod(pod: &Pod) -> Option<PodInfo> {
        Self::from_source(pod)
    }

    /// Projects what a pod's source shows; `None` when it has no name or
    /// namespace.
    pub fn from_source(pod: &impl PodSource) -> Option<PodInfo> {
        let meta = pod.meta();

        let mut pod_ips: Vec<&str> = pod.pod_ips().iter().map(|ip| ip.ip.as_str()).collect();
        if pod_ips.is_empty()
            && let Some(ip) = pod.pod_ip().filter(|ip| !ip.is_empty())
        {
            pod_ips.push(ip);
        }

        // Upstream looks at the first condition of type Ready only.
        let ready_condition = pod.conditions().iter().find(|c| c.type_ == "Ready");

        let sidecars = pod
            .init_containers()
            .filter(|c| c.restart_policy == Some(SIDECAR_RESTART_POLICY));
        let ports = pod
            .containers()
            .chain(sidecars)
            .flat_map(named_ports)
            .collect();

        Some(PodInfo::pack(&Parts {
            namespace: meta.namespace.as_deref()?,
            name: meta.name.as_deref()?,
            uid: meta.uid.as_deref().unwrap_or_default(),
            resource_version: meta.resource_version.as_deref().unwrap_or_default(),
            phase: pod.phase(),
            hostname: pod.hostname(),
            subdomain: pod.subdomain(),
            node_name: pod.node_name(),
            labels: meta
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            pod_ips,
            ports,
            ready: ready_condition.is_some_and(|c| c.status == "True"),
            terminating: meta.deletion_timestamp.is_some(),
            ready_transition: ready_condition
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
        }))
    }

    /// Upstream's ShouldPodBeInEndpoints: not terminal, has an IP, and not
    /// terminating unless terminating pods are wanted (publishNotReadyAddresses).
    pub(crate) fn should_be_in_endpoints(&self, include_terminating: bool) -> bool {
        let terminal = matches!(self.phase(), Some("Succeeded" | "Failed"));
        !terminal && self.pod_ips().next().is_some() && (include_terminating || !self.terminating())
    }
}

fn named_ports(container: ContainerView<'_>) -> impl Iterator<Item = (&str, i32, &str)> + '_ {
    container.ports.iter().filter_map(|port| {
        let name = port.name.as_deref().filter(|n| !n.is_empty())?;
        Some((
            name,
            port.container_port,
            port.protocol.as_deref().unwrap_or_default(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, PodCondition, PodIP, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    fn container(name: &str, ports: &[(&str, i32, &str)], restart: Option<&str>) -> Container {
        Container {
            name: name.into(),
            restart_policy: restart.map(str::to_string),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| ContainerPort {
                        name: (!n.is_empty()).then(|| n.to_string()),
                        container_port: *p,
                        protocol: Some(proto.to_string()),
                        ..ContainerPort::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        }
    }

    fn full_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("p".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                hostname: Some("h".into()),
                subdomain: Some("web".into()),
                node_name: Some("n".into()),
                containers: vec![container(
                    "main",
                    &[("http", 8080, "TCP"), ("", 9, "TCP")],
                    None,
                )],
                init_containers: Some(vec![
                    container("init", &[("http", 1, "TCP")], None),
                    container("sidecar", &[("metrics", 9100, "TCP")], Some("Always")),
                ]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.0.0.1".into()),
                pod_ips: Some(vec![
                    PodIP {
                        ip: "10.0.0.1".into(),
                    },
                    PodIP {
                        ip: "fd00::1".into(),
                    },
                ]),
                conditions: Some(vec![
                    PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(Timestamp::from_second(100).unwrap())),
                        ..PodCondition::default()
                    },
                    PodCondition {
                        type_: "Ready".into(),
                        status: "False".into(),
                        ..PodCondition::default()
                    },
                ]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn projection_keeps_what_endpoints_need() {
        let info = PodInfo::from_pod(&full_pod()).unwrap().fields();
        assert_eq!(info.pod_ips, vec!["10.0.0.1", "fd00::1"]);
        assert!(info.ready, "first Ready condition decides");
        assert_eq!(
            info.ready_transition,
            Some(Timestamp::from_second(100).unwrap())
        );
        assert_eq!(info.hostname.as_deref(), Some("h"));
        assert_eq!(info.uid, "u");
        assert!(!info.terminating);
        let names: Vec<_> = info
            .container_ports
            .iter()
            .map(|p| (p.name.as_str(), p.container_port))
            .collect();
        // Containers first, then sidecars only; plain init containers and unnamed ports never match.
        assert_eq!(names, vec![("http", 8080), ("metrics", 9100)]);
    }

    #[test]
    fn pod_ip_is_used_when_pod_ips_is_empty() {
        let mut pod = full_pod();
        if let Some(status) = pod.status.as_mut() {
            status.pod_ips = None;
        }
        assert_eq!(
            PodInfo::from_pod(&pod).unwrap().fields().pod_ips,
            vec!["10.0.0.1"]
        );
    }

    #[test]
    fn pods_without_name_or_namespace_are_not_projected() {
        let mut pod = full_pod();
        pod.metadata.namespace = None;
        assert_eq!(PodInfo::from_pod(&pod), None);
    }

    #[test]
    fn which_pods_belong_in_endpoints() {
        let base = PodInfo::from_pod(&full_pod()).unwrap().fields();
        let with = |f: fn(&mut PodFields)| {
            let mut p = base.clone();
            f(&mut p);
            p
        };
        let cases = [
            ("running pod with IP", base.clone(), false, true),
            (
                "phase Succeeded dropped",
                with(|p| p.phase = Some("Succeeded".into())),
                true,
                false,
            ),
            (
                "phase Failed dropped",
                with(|p| p.phase = Some("Failed".into())),
                true,
                false,
            ),
            (
                "pending pod with IP kept",
                with(|p| p.phase = Some("Pending".into())),
                false,
                true,
            ),
            ("no IP dropped", with(|p| p.pod_ips.clear()), true, false),
            (
                "terminating dropped",
                with(|p| p.terminating = true),
                false,
                false,
            ),
            (
                "terminating kept with publishNotReadyAddresses",
                with(|p| p.terminating = true),
                true,
                true,
            ),
        ];
        for (case, pod, include_terminating, expected) in cases {
            assert_eq!(
                pod.pack().should_be_in_endpoints(include_terminating),
                expected,
                "{case}"
            );
        }
    }
}
