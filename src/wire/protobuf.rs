//! [`PodWire`] from kube-apiserver's protobuf: the same fields the JSON
//! decode keeps, read from a Pod message (k8s.io/api core/v1
//! `generated.proto`; the envelope is the watcher's). Every message here is
//! written by hand and names only what [`PodInfo`](crate::desired::PodInfo)
//! is made of, with upstream's field numbers; prost skips the rest unbuilt.
//!
//! JSON and protobuf say "empty" differently: Go writes every string, list
//! and map field to protobuf, empty or not, where its JSON omits an empty
//! one (`omitempty`). So an empty string, list or map here reads as absent,
//! which is what the JSON decode sees; `tests/e2e/wire_agreement.rs` holds both
//! decodes to the same projection on objects from a real API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, PodCondition, PodIP};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use prost::Message;

use super::{ContainerWire, PodWire, SpecWire, StatusWire};

#[derive(Clone, PartialEq, Message)]
struct Pod {
    #[prost(message, optional, tag = "1")]
    metadata: Option<Meta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<Spec>,
    #[prost(message, optional, tag = "3")]
    status: Option<Status>,
}

#[derive(Clone, PartialEq, Message)]
struct Meta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<ProtoTime>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
}

/// metav1.Time: whole seconds (upstream writes no nanos, and its JSON has
/// none); a zero Go time is written as an empty message.
#[derive(Clone, PartialEq, Message)]
struct ProtoTime {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct Spec {
    #[prost(message, repeated, tag = "2")]
    containers: Vec<Container>,
    #[prost(string, optional, tag = "10")]
    node_name: Option<String>,
    #[prost(string, optional, tag = "16")]
    hostname: Option<String>,
    #[prost(string, optional, tag = "17")]
    subdomain: Option<String>,
    #[prost(message, repeated, tag = "20")]
    init_containers: Vec<Container>,
}

#[derive(Clone, PartialEq, Message)]
struct Container {
    #[prost(message, repeated, tag = "6")]
    ports: Vec<Port>,
    #[prost(string, optional, tag = "24")]
    restart_policy: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Port {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(int32, optional, tag = "3")]
    container_port: Option<i32>,
    #[prost(string, optional, tag = "4")]
    protocol: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(message, repeated, tag = "2")]
    conditions: Vec<Condition>,
    #[prost(string, optional, tag = "6")]
    pod_ip: Option<String>,
    #[prost(message, repeated, tag = "12")]
    pod_ips: Vec<ProtoPodIp>,
}

#[derive(Clone, PartialEq, Message)]
struct Condition {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(message, optional, tag = "4")]
    last_transition_time: Option<ProtoTime>,
}

#[derive(Clone, PartialEq, Message)]
struct ProtoPodIp {
    #[prost(string, optional, tag = "1")]
    ip: Option<String>,
}

/// An omitempty string: "" is absent.
fn text(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// An omitempty list: empty is absent.
fn list<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

/// A Time as its JSON reads: absent for a zero Go time.
fn time(t: Option<ProtoTime>) -> Result<Option<Time>, String> {
    let Some(seconds) = t.and_then(|t| t.seconds) else {
        return Ok(None);
    };
    Timestamp::from_second(seconds)
        .map(|ts| Some(Time(ts)))
        .map_err(|err| format!("time {seconds}: {err}"))
}

fn container(c: Container) -> ContainerWire {
    let ports = c
        .ports
        .into_iter()
        .map(|p| ContainerPort {
            name: text(p.name),
            container_port: p.container_port.unwrap_or_default(),
            protocol: text(p.protocol),
            ..ContainerPort::default()
        })
        .collect();
    ContainerWire {
        ports: list(ports),
        restart_policy: c.restart_policy,
    }
}

impl PodWire {
    /// A Pod's protobuf message (without the `k8s\0` envelope), as the JSON
    /// decode would have made it: what
    /// [`WatcherBuilder::protobuf`](hardened_watcher::WatcherBuilder::protobuf) takes.
    pub fn from_protobuf(raw: &[u8]) -> Result<PodWire, String> {
        let pod = Pod::decode(raw).map_err(|err| format!("protobuf Pod: {err}"))?;
        let meta = pod.metadata.unwrap_or_default();
        let metadata = ObjectMeta {
            name: text(meta.name),
            namespace: text(meta.namespace),
            uid: text(meta.uid),
            resource_version: text(meta.resource_version),
            labels: (!meta.labels.is_empty()).then_some(meta.labels),
            deletion_timestamp: time(meta.deletion_timestamp)?,
            ..ObjectMeta::default()
        };
        let spec = pod.spec.map(|spec| SpecWire {
            containers: list(spec.containers.into_iter().map(container).collect()),
            init_containers: list(spec.init_containers.into_iter().map(container).collect()),
            hostname: text(spec.hostname),
            subdomain: text(spec.subdomain),
            node_name: text(spec.node_name),
        });
        let status = match pod.status {
            None => None,
            Some(status) => {
                let mut conditions = Vec::with_capacity(status.conditions.len());
                for c in status.conditions {
                    conditions.push(PodCondition {
                        type_: c.kind.unwrap_or_default(),
                        status: c.status.unwrap_or_default(),
                        last_transition_time: time(c.last_transition_time)?,
                        ..PodCondition::default()
                    });
                }
                Some(StatusWire {
                    phase: text(status.phase),
                    pod_ip: text(status.pod_ip),
                    pod_ips: list(
                        status
                            .pod_ips
                            .into_iter()
                            .map(|ip| PodIP {
                                ip: ip.ip.unwrap_or_default(),
                            })
                            .collect(),
                    ),
                    conditions: list(conditions),
                })
            }
        };
        Ok(PodWire {
            metadata,
            spec,
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::PodInfo;

    /// A pod message with what the projection reads, as Go writes it:
    /// empty strings and a zero time present.
    fn message() -> Vec<u8> {
        let port = |name: &str, number, protocol: &str| Port {
            name: Some(name.to_owned()),
            container_port: Some(number),
            protocol: Some(protocol.to_owned()),
        };
        Pod {
            metadata: Some(Meta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                resource_version: Some("42".into()),
                deletion_timestamp: None,
                labels: BTreeMap::from([("app".into(), "web".into())]),
            }),
            spec: Some(Spec {
                containers: vec![Container {
                    ports: vec![port("http", 8080, "TCP"), port("", 9, "UDP")],
                    restart_policy: None,
                }],
                node_name: Some("node-a".into()),
                hostname: Some(String::new()),
                subdomain: Some(String::new()),
                init_containers: vec![Container {
                    ports: vec![port("metrics", 9100, "TCP")],
                    restart_policy: Some("Always".into()),
                }],
            }),
            status: Some(Status {
                phase: Some("Running".into()),
                conditions: vec![
                    Condition {
                        kind: Some("PodScheduled".into()),
                        status: Some("True".into()),
                        last_transition_time: Some(ProtoTime { seconds: None }),
                    },
                    Condition {
                        kind: Some("Ready".into()),
                        status: Some("True".into()),
                        last_transition_time: Some(ProtoTime {
                            seconds: Some(1_700_000_000),
                        }),
                    },
                ],
                pod_ip: Some("10.0.0.7".into()),
                pod_ips: vec![
                    ProtoPodIp {
                        ip: Some("10.0.0.7".into()),
                    },
                    ProtoPodIp {
                        ip: Some("fd00::7".into()),
                    },
                ],
            }),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_pod_message_projects_as_its_json_would() {
        let Ok(wire) = PodWire::from_protobuf(&message()) else {
            panic!("must decode")
        };
        let Some(info) = wire.project() else {
            panic!("must project")
        };
        let f = info.fields();
        assert_eq!((f.namespace.as_str(), f.name.as_str()), ("shop", "web-0"));
        assert_eq!((f.uid.as_str(), f.resource_version.as_str()), ("u1", "42"));
        assert_eq!(f.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(f.pod_ips, ["10.0.0.7", "fd00::7"]);
        assert!(f.ready && !f.terminating);
        assert_eq!(
            f.ready_transition.map(|t| t.as_second()),
            Some(1_700_000_000)
        );
        assert_eq!((f.hostname, f.subdomain), (None, None), "\"\" is absent");
        assert_eq!(f.node_name.as_deref(), Some("node-a"));
        let ports: Vec<_> = f
            .container_ports
            .iter()
            .map(|p| (p.name.as_str(), p.container_port, p.protocol.as_str()))
            .collect();
        assert_eq!(ports, [("http", 8080, "TCP"), ("metrics", 9100, "TCP")]);
        assert_eq!(
            PodInfo::from_source(&wire_of(&message())),
            Some(info),
            "decoding is deterministic"
        );
    }

    fn wire_of(raw: &[u8]) -> PodWire {
        PodWire::from_protobuf(raw).unwrap_or_default()
    }

    #[test]
    fn a_zero_deletion_timestamp_is_absent_and_a_real_one_terminates() {
        let with = |deletion: Option<ProtoTime>| {
            let mut pod = Pod::decode(message().as_slice()).unwrap_or_default();
            if let Some(meta) = pod.metadata.as_mut() {
                meta.deletion_timestamp = deletion;
            }
            wire_of(&pod.encode_to_vec())
                .project()
                .map(|info| info.fields().terminating)
        };
        assert_eq!(with(Some(ProtoTime { seconds: None })), Some(false));
        assert_eq!(with(Some(ProtoTime { seconds: Some(0) })), Some(true));
        assert_eq!(with(None), Some(false));
    }

    #[test]
    fn what_is_no_pod_message_is_an_error() {
        assert!(PodWire::from_protobuf(&[0x0a, 0x05, 0x01]).is_err());
        assert!(PodWire::from_protobuf(b"k8s\0garbage").is_err());
        // A nameless message decodes, and the projection rejects it.
        assert!(wire_of(&[]).project().is_none());
    }
}
