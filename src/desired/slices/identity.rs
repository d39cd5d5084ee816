//! Which existing endpoint is which desired one, and whether it changed
//! (upstream `util/endpointset.go` hashEndpoint and `EndpointsEqualBeyondHash`).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

use crate::desired::equality::references_equal_ignoring_resource_version;

/// An endpoint's identity: its addresses (sorted), hostname and the namespace
/// and name of its target. Upstream keys its endpoint sets by a digest of
/// exactly these; two endpoints with the same identity are one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EndpointKey {
    addresses: Vec<String>,
    hostname: String,
    namespace: String,
    name: String,
}

impl EndpointKey {
    pub(super) fn of(endpoint: &Endpoint) -> EndpointKey {
        let mut addresses = endpoint.addresses.clone();
        addresses.sort();
        let (namespace, name) = target_name(endpoint.target_ref.as_ref());
        EndpointKey {
            addresses,
            hostname: endpoint.hostname.clone().unwrap_or_default(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// The namespace and name of an endpoint's target, absent read as "" (Go strings).
fn target_name(reference: Option<&ObjectReference>) -> (&str, &str) {
    reference.map_or(("", ""), |r| {
        (
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_deref().unwrap_or(""),
        )
    })
}

/// Equal in what identity leaves out and a slice must be rewritten for:
/// nodeName, zone, the three conditions (absent differs from false) and the
/// target reference ignoring its resourceVersion. Hints are not compared here:
/// the hint step decides about them.
pub(super) fn same_beyond_identity(a: &Endpoint, b: &Endpoint) -> bool {
    let conditions = |e: &Endpoint| {
        let c = e.conditions.clone().unwrap_or_default();
        (c.ready, c.serving, c.terminating)
    };
    let references_equal = match (&a.target_ref, &b.target_ref) {
        (Some(x), Some(y)) => references_equal_ignoring_resource_version(x, y),
        (None, None) => true,
        _ => false,
    };
    a.node_name == b.node_name
        && a.zone == b.zone
        && conditions(a) == conditions(b)
        && references_equal
}

/// The conditions upstream writes: `ready`, `serving` and `terminating`, all set.
pub(super) fn conditions(ready: bool, serving: bool, terminating: bool) -> EndpointConditions {
    EndpointConditions {
        ready: Some(ready),
        serving: Some(serving),
        terminating: Some(terminating),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(ip: &str, name: &str) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(conditions(true, true, false)),
            node_name: Some("node-1".into()),
            zone: Some("zone-a".into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    #[test]
    fn identity_is_addresses_hostname_and_target_name() {
        let base = endpoint("10.0.0.1", "a");
        let mut other_uid = base.clone();
        if let Some(r) = other_uid.target_ref.as_mut() {
            r.uid = Some("another".into());
        }
        let mut not_ready = base.clone();
        not_ready.conditions = Some(conditions(false, false, true));
        let mut two = base.clone();
        two.addresses = vec!["10.0.0.2".into(), "10.0.0.1".into()];
        let mut two_sorted = base.clone();
        two_sorted.addresses = vec!["10.0.0.1".into(), "10.0.0.2".into()];
        let mut hostname = base.clone();
        hostname.hostname = Some("h".into());
        let mut empty_hostname = base.clone();
        empty_hostname.hostname = Some(String::new());
        let cases = [
            ("same pod, other uid", &base, &other_uid, true),
            ("conditions are not identity", &base, &not_ready, true),
            ("address order is not identity", &two, &two_sorted, true),
            (
                "absent hostname is the empty hostname",
                &base,
                &empty_hostname,
                true,
            ),
            ("hostname is identity", &base, &hostname, false),
            (
                "address is identity",
                &base,
                &endpoint("10.0.0.9", "a"),
                false,
            ),
            (
                "pod name is identity",
                &base,
                &endpoint("10.0.0.1", "b"),
                false,
            ),
        ];
        for (case, a, b, same) in cases {
            assert_eq!(EndpointKey::of(a) == EndpointKey::of(b), same, "{case}");
        }
    }

    #[test]
    fn changes_that_need_a_rewrite() {
        let base = endpoint("10.0.0.1", "a");
        type Edit = (&'static str, fn(&mut Endpoint), bool);
        let edits: [Edit; 9] = [
            ("nothing", |_| {}, true),
            (
                "hints are left to the hint step",
                |e| e.hints = Some(Default::default()),
                true,
            ),
            (
                "targetRef resourceVersion ignored",
                |e| {
                    if let Some(r) = e.target_ref.as_mut() {
                        r.resource_version = Some("9".into());
                    }
                },
                true,
            ),
            (
                "ready",
                |e| e.conditions = Some(conditions(false, true, false)),
                false,
            ),
            (
                "serving absent",
                |e| {
                    e.conditions = Some(EndpointConditions {
                        serving: None,
                        ..conditions(true, true, false)
                    })
                },
                false,
            ),
            (
                "terminating",
                |e| e.conditions = Some(conditions(true, true, true)),
                false,
            ),
            ("zone", |e| e.zone = None, false),
            ("nodeName", |e| e.node_name = Some("node-2".into()), false),
            (
                "targetRef uid",
                |e| {
                    if let Some(r) = e.target_ref.as_mut() {
                        r.uid = None;
                    }
                },
                false,
            ),
        ];
        for (case, edit, same) in edits {
            let mut changed = base.clone();
            edit(&mut changed);
            assert_eq!(same_beyond_identity(&base, &changed), same, "{case}");
        }
    }
}
