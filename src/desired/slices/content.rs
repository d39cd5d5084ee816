//! Whether two slices say the same thing, the way Go's semantic equality sees
//! it: an absent list or map equals an empty one, an absent `conditions` equals
//! one with nothing set, absent strings inside a targetRef equal "" (they are
//! Go strings), while the optional fields that are Go pointers keep absent and
//! "" apart.

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice};

use crate::desired::ANNOTATION_LAST_CHANGE_TRIGGER_TIME;
use crate::desired::equality::references_equal_ignoring_resource_version;

/// True when `a` and `b` carry the same labels, annotations (the trigger time
/// aside), owner references, address type, ports and endpoints (in order, every
/// field, the targetRef's resourceVersion aside). Names, resourceVersions and
/// the rest of the metadata are not compared.
pub fn same_slice_content(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    let annotations = |s: &EndpointSlice| {
        let mut map = s.metadata.annotations.clone().unwrap_or_default();
        map.remove(ANNOTATION_LAST_CHANGE_TRIGGER_TIME);
        map
    };
    let empty = BTreeMap::new();
    a.metadata.labels.as_ref().unwrap_or(&empty) == b.metadata.labels.as_ref().unwrap_or(&empty)
        && annotations(a) == annotations(b)
        && a.metadata.owner_references.as_deref().unwrap_or_default()
            == b.metadata.owner_references.as_deref().unwrap_or_default()
        && a.address_type == b.address_type
        && a.ports.as_deref().unwrap_or_default() == b.ports.as_deref().unwrap_or_default()
        && endpoints_equal(
            a.endpoints.as_deref().unwrap_or_default(),
            b.endpoints.as_deref().unwrap_or_default(),
        )
}

fn endpoints_equal(a: &[Endpoint], b: &[Endpoint]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| endpoint_equal(x, y))
}

/// Every field of an endpoint, Go semantics.
pub(super) fn endpoint_equal(a: &Endpoint, b: &Endpoint) -> bool {
    let references_equal = match (&a.target_ref, &b.target_ref) {
        (Some(x), Some(y)) => references_equal_ignoring_resource_version(x, y),
        (None, None) => true,
        _ => false,
    };
    let empty = BTreeMap::new();
    a.addresses == b.addresses
        && a.conditions.clone().unwrap_or_default() == b.conditions.clone().unwrap_or_default()
        && a.hostname == b.hostname
        && references_equal
        && a.deprecated_topology.as_ref().unwrap_or(&empty)
            == b.deprecated_topology.as_ref().unwrap_or(&empty)
        && a.node_name == b.node_name
        && a.zone == b.zone
        && hints_equal(a.hints.as_ref(), b.hints.as_ref())
}

fn hints_equal(a: Option<&EndpointHints>, b: Option<&EndpointHints>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            x.for_zones.as_deref().unwrap_or_default() == y.for_zones.as_deref().unwrap_or_default()
                && x.for_nodes.as_deref().unwrap_or_default()
                    == y.for_nodes.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointPort, ForZone};

    use super::*;

    fn slice() -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![Endpoint {
                addresses: vec!["10.0.0.1".into()],
                conditions: Some(EndpointConditions::default()),
                target_ref: Some(ObjectReference {
                    name: Some("p".into()),
                    ..ObjectReference::default()
                }),
                ..Endpoint::default()
            }]),
            ports: Some(vec![EndpointPort {
                name: Some(String::new()),
                port: Some(80),
                ..EndpointPort::default()
            }]),
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn go_semantics() {
        type Edit = (&'static str, fn(&mut EndpointSlice), bool);
        let edits: [Edit; 12] = [
            (
                "name is not content",
                |s| s.metadata.name = Some("x".into()),
                true,
            ),
            (
                "trigger time is not content",
                |s| {
                    s.metadata.annotations = Some(BTreeMap::from([(
                        ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_string(),
                        "t".to_string(),
                    )]))
                },
                true,
            ),
            (
                "absent labels equal empty labels",
                |s| s.metadata.labels = Some(BTreeMap::new()),
                true,
            ),
            (
                "absent conditions equal empty ones",
                |s| {
                    if let Some(e) = s.endpoints.as_mut().and_then(|e| e.first_mut()) {
                        e.conditions = None;
                    }
                },
                true,
            ),
            (
                "targetRef kind absent equals empty",
                |s| {
                    if let Some(r) = s
                        .endpoints
                        .as_mut()
                        .and_then(|e| e.first_mut())
                        .and_then(|e| e.target_ref.as_mut())
                    {
                        r.kind = Some(String::new());
                    }
                },
                true,
            ),
            (
                "hints without zones still differ from no hints",
                |s| {
                    if let Some(e) = s.endpoints.as_mut().and_then(|e| e.first_mut()) {
                        e.hints = Some(EndpointHints {
                            for_zones: Some(vec![]),
                            for_nodes: None,
                        });
                    }
                },
                false,
            ),
            (
                "hints differ",
                |s| {
                    if let Some(e) = s.endpoints.as_mut().and_then(|e| e.first_mut()) {
                        e.hints = Some(EndpointHints {
                            for_zones: Some(vec![ForZone { name: "a".into() }]),
                            for_nodes: None,
                        });
                    }
                },
                false,
            ),
            (
                "port name absent differs from empty",
                |s| {
                    if let Some(p) = s.ports.as_mut().and_then(|p| p.first_mut()) {
                        p.name = None;
                    }
                },
                false,
            ),
            ("address type", |s| s.address_type = "IPv6".into(), false),
            (
                "other annotation",
                |s| {
                    s.metadata.annotations =
                        Some(BTreeMap::from([("a".to_string(), String::new())]))
                },
                false,
            ),
            ("endpoints absent", |s| s.endpoints = None, false),
            (
                "ready set",
                |s| {
                    if let Some(e) = s.endpoints.as_mut().and_then(|e| e.first_mut()) {
                        e.conditions = Some(EndpointConditions {
                            ready: Some(false),
                            ..EndpointConditions::default()
                        });
                    }
                },
                false,
            ),
        ];
        for (case, edit, same) in edits {
            let mut changed = slice();
            edit(&mut changed);
            assert_eq!(same_slice_content(&slice(), &changed), same, "{case}");
        }
        let mut no_ports = slice();
        no_ports.ports = None;
        let mut empty_ports = slice();
        empty_ports.ports = Some(vec![]);
        assert!(
            same_slice_content(&no_ports, &empty_ports),
            "absent ports equal no ports"
        );
        // Hints present but empty differ from no hints: a Go nil pointer is not
        // a pointer to an empty struct.
        let mut empty_hints = slice();
        if let Some(e) = empty_hints.endpoints.as_mut().and_then(|e| e.first_mut()) {
            e.hints = Some(EndpointHints::default());
        }
        assert!(!same_slice_content(&slice(), &empty_hints));
        // Inside hints, an empty zone list equals an absent one.
        let mut empty_zones = slice();
        if let Some(e) = empty_zones.endpoints.as_mut().and_then(|e| e.first_mut()) {
            e.hints = Some(EndpointHints {
                for_zones: Some(vec![]),
                for_nodes: None,
            });
        }
        assert!(same_slice_content(&empty_hints, &empty_zones));
    }
}
