//! desired_slices: address types, which pods and every
//! endpoint field, one table per rule; the golden values re-express upstream's
//! own expectations (reconciler_test.go, utils_test.go of k8s.io/endpointslice
//! v0.36.3) where they exist.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

use super::testkit::{OURS, desire, nodes, pods, web_service};
use super::*;
use crate::desired::testkit::spec_mut;
use crate::desired::{PodFields, PodInfo};

pub(super) fn only_group(desired: &DesiredSlices) -> &PortGroup {
    assert_eq!(desired.address_types.len(), 1, "one address type");
    assert_eq!(desired.address_types[0].groups.len(), 1, "one port set");
    &desired.address_types[0].groups[0]
}

fn conditions_of(endpoint: &Endpoint) -> (Option<bool>, Option<bool>, Option<bool>) {
    let c = endpoint.conditions.clone().unwrap_or_default();
    (c.ready, c.serving, c.terminating)
}

#[test]
fn one_address_type_per_service_family() {
    use AddressType::{IPv4, IPv6};
    let with = |families: Option<&[&str]>, cluster_ip: &str| {
        let mut svc = web_service();
        let spec = spec_mut(&mut svc);
        spec.ip_families = families.map(|f| f.iter().map(|s| s.to_string()).collect());
        spec.cluster_ip = Some(cluster_ip.into());
        svc
    };
    let cases = [
        ("IPv4", with(Some(&["IPv4"]), "10.96.0.1"), vec![IPv4]),
        ("IPv6", with(Some(&["IPv6"]), "fd00::1"), vec![IPv6]),
        (
            "dual-stack, IPv6 first",
            with(Some(&["IPv6", "IPv4"]), "fd00::1"),
            vec![IPv4, IPv6],
        ),
        (
            "no families: the cluster IP's family (upstream golden no-family-service)",
            with(None, "10.0.0.10"),
            vec![IPv4],
        ),
        (
            "no families, IPv6 cluster IP",
            with(None, "1234::5678:0000:0000:9abc:def1"),
            vec![IPv6],
        ),
        (
            "no families, headless: both",
            with(None, "None"),
            vec![IPv4, IPv6],
        ),
        (
            "no families, no cluster IP: both",
            with(None, ""),
            vec![IPv4, IPv6],
        ),
    ];
    for (case, svc, expected) in cases {
        let desired = desire(&svc, &[]);
        let types: Vec<AddressType> = desired
            .address_types
            .iter()
            .map(|a| a.address_type)
            .collect();
        assert_eq!(types, expected, "{case}");
    }
}

/// Upstream's TestReconcile1Pod golden: a dual-stack pod with an irregular
/// IPv6 text, a hostname but no subdomain, on a Node with a zone.
#[test]
fn endpoint_fields_match_upstream_golden() {
    let mut svc = web_service();
    let spec = spec_mut(&mut svc);
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let mut pod = crate::desired::testkit::pod("pod1", "1.2.3.4");
    pod.namespace = "default".into();
    pod.uid = String::new();
    pod.pod_ips = vec!["1.2.3.4".into(), "1234::5678:0000:0000:9abc:def0".into()];
    pod.hostname = Some("example-hostname".into());
    pod.node_name = Some("node-0".into());
    let desired = desire(&svc, &[pod]);
    let expected = |address: &str| Endpoint {
        addresses: vec![address.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        zone: Some("zone-a".into()),
        node_name: Some("node-0".into()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some("pod1".into()),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    };
    let endpoints: Vec<(AddressType, Vec<Endpoint>)> = desired
        .address_types
        .iter()
        .map(|a| {
            (
                a.address_type,
                a.groups.iter().flat_map(|g| g.endpoints.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        endpoints,
        vec![
            (AddressType::IPv4, vec![expected("1.2.3.4")]),
            (
                AddressType::IPv6,
                vec![expected("1234::5678:0:0:9abc:def0")]
            ),
        ]
    );
}

#[test]
fn which_pods_are_endpoints_and_their_conditions() {
    let base = pods(1).remove(0);
    let with = |f: fn(&mut PodFields)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    // (case, pod, publishNotReadyAddresses, expected (ready, serving, terminating))
    type Case = (&'static str, PodFields, bool, Option<(bool, bool, bool)>);
    let cases: Vec<Case> = vec![
        ("ready", base.clone(), false, Some((true, true, false))),
        (
            "not ready",
            with(|p| p.ready = false),
            false,
            Some((false, false, false)),
        ),
        (
            "pending with an IP",
            with(|p| {
                p.phase = Some("Pending".into());
                p.ready = false;
            }),
            false,
            Some((false, false, false)),
        ),
        (
            "terminating and ready: serving but not ready",
            with(|p| p.terminating = true),
            false,
            Some((false, true, true)),
        ),
        (
            "terminating, not ready",
            with(|p| {
                p.terminating = true;
                p.ready = false;
            }),
            false,
            Some((false, false, true)),
        ),
        (
            "publishNotReadyAddresses makes everything ready",
            with(|p| {
                p.terminating = true;
                p.ready = false;
            }),
            true,
            Some((true, false, true)),
        ),
        (
            "Succeeded",
            with(|p| p.phase = Some("Succeeded".into())),
            true,
            None,
        ),
        (
            "Failed",
            with(|p| p.phase = Some("Failed".into())),
            true,
            None,
        ),
        ("no IP", with(|p| p.pod_ips.clear()), true, None),
    ];
    for (case, pod, publish, expected) in cases {
        let mut svc = web_service();
        spec_mut(&mut svc).publish_not_ready_addresses = Some(publish);
        let desired = desire(&svc, &[pod]);
        let found: Vec<(Option<bool>, Option<bool>, Option<bool>)> = desired.address_types[0]
            .groups
            .iter()
            .flat_map(|g| g.endpoints.iter().map(conditions_of))
            .collect();
        let expected: Vec<_> = expected
            .map(|(r, s, t)| (Some(r), Some(s), Some(t)))
            .into_iter()
            .collect();
        assert_eq!(found, expected, "{case}");
    }
}

#[test]
fn addresses_follow_the_address_type() {
    let mut svc = web_service();
    spec_mut(&mut svc).ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
    let mut dual = pods(1).remove(0);
    dual.pod_ips = vec!["FD00:0:0:0:0:0:0:7".into(), "010.000.000.007".into()];
    let mut v4_only = pods(2).remove(1);
    v4_only.pod_ips = vec!["10.0.0.8".into()];
    let desired = desire(&svc, &[dual, v4_only]);
    let addresses = |t: usize| -> Vec<Vec<String>> {
        desired.address_types[t]
            .groups
            .iter()
            .flat_map(|g| g.endpoints.iter().map(|e| e.addresses.clone()))
            .collect()
    };
    // Normalised like Go's net.IP.String(); a pod without an address of the
    // type is simply not in that type's slices.
    assert_eq!(
        addresses(0),
        vec![vec!["10.0.0.7".to_string()], vec!["10.0.0.8".to_string()]]
    );
    assert_eq!(addresses(1), vec![vec!["fd00::7".to_string()]]);
    // The port set exists for the IPv6 type too: upstream makes it before
    // looking at addresses.
    assert_eq!(desired.address_types[1].groups.len(), 1);
}

#[test]
fn hostname_node_name_and_zone() {
    let base = pods(1).remove(0);
    let with = |f: fn(&mut PodFields)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    // (case, pod, hostname, nodeName, zone)
    type Case = (
        &'static str,
        PodFields,
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "plain pod on node-0",
            base.clone(),
            None,
            Some("node-0"),
            Some("zone-a"),
        ),
        (
            "hostname with the Service as subdomain",
            with(|p| {
                p.hostname = Some("h".into());
                p.subdomain = Some("web".into());
            }),
            Some("h"),
            Some("node-0"),
            Some("zone-a"),
        ),
        (
            "hostname with another subdomain",
            with(|p| {
                p.hostname = Some("h".into());
                p.subdomain = Some("other".into());
            }),
            None,
            Some("node-0"),
            Some("zone-a"),
        ),
        (
            "subdomain without hostname",
            with(|p| p.subdomain = Some("web".into())),
            None,
            Some("node-0"),
            Some("zone-a"),
        ),
        (
            "node-2 is in zone-c",
            with(|p| p.node_name = Some("node-2".into())),
            None,
            Some("node-2"),
            Some("zone-c"),
        ),
    ];
    for (case, pod, hostname, node, zone) in cases {
        let desired = desire(&web_service(), &[pod]);
        let endpoint = &only_group(&desired).endpoints[0];
        assert_eq!(endpoint.hostname.as_deref(), hostname, "{case}: hostname");
        assert_eq!(endpoint.node_name.as_deref(), node, "{case}: nodeName");
        assert_eq!(endpoint.zone.as_deref(), zone, "{case}: zone");
    }
}

#[test]
fn zone_comes_only_from_a_non_empty_node_label() {
    let mut lookup = nodes();
    if let Some(n) = lookup.get_mut("node-1") {
        n.zone = Some(String::new());
    }
    if let Some(n) = lookup.get_mut("node-2") {
        n.zone = None;
    }
    let pods: Vec<PodInfo> = pods(3).iter().map(PodFields::pack).collect();
    let refs: Vec<&PodInfo> = pods.iter().collect();
    let desired = desired_slices(
        &web_service(),
        &refs,
        &lookup,
        OURS,
        crate::desired::testkit::RULES_1_36,
    );
    let zones: Vec<Option<String>> = only_group(&desired)
        .endpoints
        .iter()
        .map(|e| e.zone.clone())
        .collect();
    assert_eq!(zones, vec![Some("zone-a".to_string()), None, None]);
}

/// Upstream's TestReconcilerPodMissingNode: a pod on a Node the cache does not
/// know is left out (and the Service retried) unless publishNotReadyAddresses.
#[test]
fn pods_on_unknown_nodes() {
    let mut all = pods(3);
    all[1].node_name = Some("gone".into());
    all[2].node_name = None;
    for (publish, expected_pods, unknown) in [
        (false, vec!["pod-0"], vec!["pod-1", "pod-2"]),
        (true, vec!["pod-0", "pod-1", "pod-2"], vec![]),
    ] {
        let mut svc = web_service();
        spec_mut(&mut svc).publish_not_ready_addresses = Some(publish);
        let desired = desire(&svc, &all);
        let names: Vec<String> = only_group(&desired)
            .endpoints
            .iter()
            .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
            .collect();
        assert_eq!(names, expected_pods, "publish {publish}");
        assert_eq!(desired.pods_on_unknown_nodes, unknown, "publish {publish}");
    }
    // Kept without a node: no zone; no nodeName when the pod has none.
    let mut svc = web_service();
    spec_mut(&mut svc).publish_not_ready_addresses = Some(true);
    let desired = desire(&svc, &all);
    let fields: Vec<(Option<String>, Option<String>)> = only_group(&desired)
        .endpoints
        .iter()
        .map(|e| (e.node_name.clone(), e.zone.clone()))
        .collect();
    assert_eq!(
        fields,
        vec![
            (Some("node-0".into()), Some("zone-a".into())),
            (Some("gone".into()), None),
            (None, None),
        ]
    );
}
