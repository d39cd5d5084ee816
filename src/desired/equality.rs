//! Upstream's subset comparison: apimachinery semantic DeepEqual with
//! ObjectReference compared ignoring resourceVersion.
//!
//! Go's shapes decide what counts as equal: an absent slice equals an empty one;
//! fields that are plain Go strings cannot be absent, so absent equals ""; fields
//! that are Go pointers (`nodeName`, `appProtocol`) keep absent and "" apart.

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, ObjectReference};

fn go_str(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("")
}

fn slices_equal<T>(a: &Option<Vec<T>>, b: &Option<Vec<T>>, equal: fn(&T, &T) -> bool) -> bool {
    let a = a.as_deref().unwrap_or_default();
    let b = b.as_deref().unwrap_or_default();
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equal(x, y))
}

/// True when both lists are equal the way upstream's skip-the-write check sees it.
pub(crate) fn subsets_equal_ignoring_resource_version(
    a: &[EndpointSubset],
    b: &[EndpointSubset],
) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| subset_equal(x, y))
}

fn subset_equal(a: &EndpointSubset, b: &EndpointSubset) -> bool {
    slices_equal(&a.addresses, &b.addresses, address_equal)
        && slices_equal(
            &a.not_ready_addresses,
            &b.not_ready_addresses,
            address_equal,
        )
        && slices_equal(&a.ports, &b.ports, port_equal)
}

fn address_equal(a: &EndpointAddress, b: &EndpointAddress) -> bool {
    a.ip == b.ip
        && go_str(&a.hostname) == go_str(&b.hostname)
        && a.node_name == b.node_name
        && match (&a.target_ref, &b.target_ref) {
            (Some(x), Some(y)) => references_equal_ignoring_resource_version(x, y),
            (None, None) => true,
            _ => false,
        }
}

/// Upstream's ObjectReference comparison for both controllers: every field the
/// Go way (absent is ""), except resourceVersion.
pub(crate) fn references_equal_ignoring_resource_version(
    a: &ObjectReference,
    b: &ObjectReference,
) -> bool {
    go_str(&a.kind) == go_str(&b.kind)
        && go_str(&a.namespace) == go_str(&b.namespace)
        && go_str(&a.name) == go_str(&b.name)
        && go_str(&a.uid) == go_str(&b.uid)
        && go_str(&a.api_version) == go_str(&b.api_version)
        && go_str(&a.field_path) == go_str(&b.field_path)
}

fn port_equal(a: &EndpointPort, b: &EndpointPort) -> bool {
    go_str(&a.name) == go_str(&b.name)
        && a.port == b.port
        && go_str(&a.protocol) == go_str(&b.protocol)
        && a.app_protocol == b.app_protocol
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testkit::{address, pod_ref, port, subset};

    fn one(address: EndpointAddress, port: EndpointPort) -> Vec<EndpointSubset> {
        vec![subset(Some(vec![address]), None, Some(vec![port]))]
    }

    #[test]
    fn equality_rules() {
        let base_address = address("10.0.0.1", Some("n"), Some(pod_ref("ns", "a", "u")));
        let http = port("http", 80, "TCP", None);
        let base = one(base_address.clone(), http.clone());

        let mut with_rv = base_address.clone();
        if let Some(r) = with_rv.target_ref.as_mut() {
            r.resource_version = Some("42".into());
        }
        let mut empty_hostname = base_address.clone();
        empty_hostname.hostname = Some(String::new());
        let mut empty_node = base_address.clone();
        empty_node.node_name = Some(String::new());
        let mut no_node = base_address.clone();
        no_node.node_name = None;
        let no_node_copy = no_node.clone();
        let mut other_uid = base_address.clone();
        other_uid.target_ref = Some(pod_ref("ns", "a", "v"));

        let cases = [
            ("identical", base.clone(), true),
            (
                "targetRef resourceVersion ignored",
                one(with_rv, http.clone()),
                true,
            ),
            (
                "absent hostname equals empty hostname",
                one(empty_hostname, http.clone()),
                true,
            ),
            (
                "nodeName absent differs from set",
                one(no_node, http.clone()),
                false,
            ),
            ("targetRef uid differs", one(other_uid, http.clone()), false),
            (
                "appProtocol \"\" differs from absent",
                one(base_address.clone(), port("http", 80, "TCP", Some(""))),
                false,
            ),
            (
                "port number differs",
                one(base_address.clone(), port("http", 81, "TCP", None)),
                false,
            ),
        ];
        for (case, other, expected) in cases {
            assert_eq!(
                subsets_equal_ignoring_resource_version(&base, &other),
                expected,
                "{case}"
            );
        }
        // A Go pointer to "" is not a nil pointer.
        assert!(!subsets_equal_ignoring_resource_version(
            &one(empty_node, http.clone()),
            &one(no_node_copy, http),
        ));
    }

    #[test]
    fn absent_lists_equal_empty_lists() {
        let a = vec![subset(
            Some(vec![address("10.0.0.1", None, None)]),
            None,
            None,
        )];
        let b = vec![subset(
            Some(vec![address("10.0.0.1", None, None)]),
            Some(vec![]),
            Some(vec![]),
        )];
        assert!(subsets_equal_ignoring_resource_version(&a, &b));
        assert!(subsets_equal_ignoring_resource_version(&[], &[]));
        assert!(!subsets_equal_ignoring_resource_version(&a, &[]));
    }
}
