//! compute_subsets and Service selection, one case per rule of parity.md §1–§5.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointSubset, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::testkit::{RULES_1_36, pod, service, service_port, spec_mut};
use super::*;

/// (ready IPs, not-ready IPs, port numbers) per subset, in output order.
type Shape = Vec<(Vec<String>, Vec<String>, Option<Vec<i32>>)>;

fn shape(subsets: &[EndpointSubset]) -> Shape {
    let ips = |list: &Option<Vec<EndpointAddress>>| -> Vec<String> {
        list.iter().flatten().map(|a| a.ip.clone()).collect()
    };
    subsets
        .iter()
        .map(|s| {
            (
                ips(&s.addresses),
                ips(&s.not_ready_addresses),
                s.ports.as_ref().map(|p| p.iter().map(|p| p.port).collect()),
            )
        })
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn ready_only(ips: &[&str], ports: &[i32]) -> Shape {
    vec![(strings(ips), vec![], Some(ports.to_vec()))]
}

fn not_ready_only(ips: &[&str], ports: &[i32]) -> Shape {
    vec![(vec![], strings(ips), Some(ports.to_vec()))]
}

fn http_service() -> Service {
    service(vec![service_port("http", 80, Some(IntOrString::Int(8080)))])
}

fn compute(svc: &Service, pods: &[PodFields]) -> Vec<EndpointSubset> {
    let packed: Vec<PodInfo> = pods.iter().map(PodFields::pack).collect();
    let refs: Vec<&PodInfo> = packed.iter().collect();
    compute_subsets(svc, &refs, RULES_1_36).subsets
}

#[test]
fn which_services_are_handled() {
    let plain = http_service();
    let mut external = http_service();
    spec_mut(&mut external).type_ = Some("ExternalName".into());
    let mut no_selector = http_service();
    spec_mut(&mut no_selector).selector = None;
    let mut empty_selector = http_service();
    spec_mut(&mut empty_selector).selector = Some(BTreeMap::new());
    let cases = [
        ("selector service handled", &plain, true),
        ("ExternalName skipped", &external, false),
        ("nil selector skipped", &no_selector, false),
        ("empty selector handled", &empty_selector, true),
    ];
    for (case, svc, handled) in cases {
        assert_eq!(
            crate::desired::scope::spec_selector(svc).is_some(),
            handled,
            "{case}"
        );
    }
}

#[test]
fn selector_matching() {
    let labels = BTreeMap::from([
        ("app".to_string(), "web".to_string()),
        ("tier".to_string(), "a".to_string()),
    ]);
    let sel = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let cases = [
        ("empty selector selects all", sel(&[]), true),
        ("subset of labels matches", sel(&[("app", "web")]), true),
        (
            "all labels match",
            sel(&[("app", "web"), ("tier", "a")]),
            true,
        ),
        ("different value", sel(&[("app", "db")]), false),
        ("missing key", sel(&[("zone", "x")]), false),
    ];
    for (case, selector, expected) in cases {
        assert_eq!(selector_matches(&selector, &labels), expected, "{case}");
    }
}

#[test]
fn pod_filtering_and_placement() {
    let svc = http_service();
    let mut publishing = http_service();
    spec_mut(&mut publishing).publish_not_ready_addresses = Some(true);
    let with = |f: fn(&mut PodFields)| {
        let mut p = pod("a", "10.0.0.1");
        f(&mut p);
        p
    };
    let nothing: Shape = vec![];
    let cases = [
        (
            "ready pod in addresses",
            &svc,
            with(|_| {}),
            ready_only(&["10.0.0.1"], &[8080]),
        ),
        (
            "not-ready pod in notReadyAddresses",
            &svc,
            with(|p| p.ready = false),
            not_ready_only(&["10.0.0.1"], &[8080]),
        ),
        (
            "pending pod with IP is not ready",
            &svc,
            with(|p| {
                p.phase = Some("Pending".into());
                p.ready = false;
            }),
            not_ready_only(&["10.0.0.1"], &[8080]),
        ),
        (
            "succeeded pod dropped",
            &svc,
            with(|p| p.phase = Some("Succeeded".into())),
            nothing.clone(),
        ),
        (
            "failed pod dropped",
            &svc,
            with(|p| p.phase = Some("Failed".into())),
            nothing.clone(),
        ),
        (
            "pod without IP dropped",
            &svc,
            with(|p| p.pod_ips.clear()),
            nothing.clone(),
        ),
        (
            "terminating pod dropped",
            &svc,
            with(|p| p.terminating = true),
            nothing.clone(),
        ),
        (
            "publishNotReadyAddresses: not-ready pod in addresses",
            &publishing,
            with(|p| p.ready = false),
            ready_only(&["10.0.0.1"], &[8080]),
        ),
        (
            "publishNotReadyAddresses: terminating pod kept",
            &publishing,
            with(|p| p.terminating = true),
            ready_only(&["10.0.0.1"], &[8080]),
        ),
    ];
    for (case, svc, pod, expected) in cases {
        assert_eq!(shape(&compute(svc, &[pod])), expected, "{case}");
    }
}

#[test]
fn ip_family_choice() {
    let dual = |name: &str, first: &str, second: &str| {
        let mut p = pod(name, first);
        p.pod_ips.push(second.to_string());
        p
    };
    let with_spec = |families: Option<&[&str]>, cluster_ip: &str| {
        let mut svc = http_service();
        let spec = spec_mut(&mut svc);
        spec.ip_families = families.map(strings);
        spec.cluster_ip = Some(cluster_ip.to_string());
        svc
    };
    let cases = [
        (
            "ipFamilies[0] IPv4",
            with_spec(Some(&["IPv4", "IPv6"]), "10.96.0.1"),
            dual("a", "10.0.0.1", "fd00::1"),
            "10.0.0.1",
        ),
        (
            "ipFamilies[0] IPv6 picks the IPv6 pod IP",
            with_spec(Some(&["IPv6", "IPv4"]), "fd00:96::1"),
            dual("a", "10.0.0.1", "fd00::1"),
            "fd00::1",
        ),
        (
            "no ipFamilies: cluster IP family",
            with_spec(None, "fd00:96::1"),
            dual("a", "10.0.0.1", "fd00::1"),
            "fd00::1",
        ),
        (
            "headless without ipFamilies: podIP family",
            with_spec(None, "None"),
            dual("a", "fd00::1", "10.0.0.1"),
            "fd00::1",
        ),
        (
            "IP text normalised",
            with_spec(Some(&["IPv6"]), "None"),
            pod("a", "FD00:0:0:0:0:0:0:1"),
            "fd00::1",
        ),
        (
            "IPv4 with leading zeros normalised",
            with_spec(Some(&["IPv4"]), "10.96.0.1"),
            pod("a", "010.000.000.001"),
            "10.0.0.1",
        ),
    ];
    for (case, svc, pod, expected_ip) in cases {
        assert_eq!(
            shape(&compute(&svc, &[pod])),
            ready_only(&[expected_ip], &[8080]),
            "{case}"
        );
    }
    // A pod without an IP of the Service's family is skipped.
    let v6_service = with_spec(Some(&["IPv6"]), "fd00:96::1");
    assert!(
        compute(&v6_service, &[pod("a", "10.0.0.1")]).is_empty(),
        "no IP of the family"
    );
}

#[test]
fn ports_and_grouping() {
    let mut named = service(vec![
        service_port("http", 80, Some(IntOrString::String("http".into()))),
        service_port("admin", 81, Some(IntOrString::String("admin".into()))),
    ]);
    spec_mut(&mut named)
        .ports
        .iter_mut()
        .flatten()
        .for_each(|p| p.protocol = Some("TCP".into()));
    let mut with_admin = pod("b", "10.0.0.2");
    with_admin.container_ports.push(NamedPort {
        name: "admin".into(),
        container_port: 9000,
        protocol: "TCP".into(),
    });
    let mut no_ports_match = pod("c", "10.0.0.3");
    no_ports_match.container_ports.clear();

    // Pod a offers only http, pod b offers both: two subsets; pod c offers nothing.
    let got = shape(&compute(
        &named,
        &[pod("a", "10.0.0.1"), with_admin.clone(), no_ports_match],
    ));
    let mut want: Shape = vec![
        (strings(&["10.0.0.1", "10.0.0.2"]), vec![], Some(vec![8080])),
        (strings(&["10.0.0.2"]), vec![], Some(vec![9000])),
    ];
    want.sort();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    assert_eq!(
        got_sorted, want,
        "unresolvable port skipped for that pod only"
    );

    let mut headless_no_ports = http_service();
    spec_mut(&mut headless_no_ports).ports = None;
    spec_mut(&mut headless_no_ports).cluster_ip = Some("None".into());
    let mut cluster_ip_no_ports = http_service();
    spec_mut(&mut cluster_ip_no_ports).ports = Some(vec![]);
    let mut unset_target = service(vec![service_port("http", 80, None)]);
    spec_mut(&mut unset_target)
        .ports
        .iter_mut()
        .flatten()
        .for_each(|p| p.app_protocol = Some("http".into()));
    let p = pod("a", "10.0.0.1");
    assert_eq!(
        shape(&compute(&headless_no_ports, std::slice::from_ref(&p))),
        vec![(strings(&["10.0.0.1"]), vec![], None)],
        "headless without ports: addresses, ports nil"
    );
    assert!(
        compute(&cluster_ip_no_ports, std::slice::from_ref(&p)).is_empty(),
        "non-headless without ports: empty subsets"
    );
    let ports = compute(&unset_target, &[p])[0]
        .ports
        .clone()
        .unwrap_or_default();
    assert_eq!(
        ports,
        vec![k8s_openapi::api::core::v1::EndpointPort {
            name: Some("http".into()),
            port: 80,
            protocol: Some("TCP".into()),
            app_protocol: Some("http".into()),
        }],
        "unset targetPort = port; name, protocol, appProtocol copied"
    );
}

#[test]
fn address_fields() {
    let svc = http_service();
    let mut headless = http_service();
    spec_mut(&mut headless).cluster_ip = Some("None".into());
    let with = |f: fn(&mut PodFields)| {
        let mut p = pod("a", "10.0.0.1");
        p.hostname = Some("web-0".into());
        p.subdomain = Some("web".into());
        f(&mut p);
        p
    };
    let cases = [
        (
            "hostname set when subdomain is the service name",
            &svc,
            with(|_| {}),
            Some("web-0"),
        ),
        (
            "hostname rule also for headless",
            &headless,
            with(|_| {}),
            Some("web-0"),
        ),
        (
            "no hostname when subdomain differs",
            &svc,
            with(|p| p.subdomain = Some("other".into())),
            None,
        ),
        (
            "no hostname when subdomain unset",
            &svc,
            with(|p| p.subdomain = None),
            None,
        ),
        (
            "no hostname when hostname empty",
            &svc,
            with(|p| p.hostname = Some(String::new())),
            None,
        ),
        (
            "no hostname across namespaces",
            &svc,
            with(|p| p.namespace = "other".into()),
            None,
        ),
    ];
    for (case, svc, pod, hostname) in cases {
        let subsets = compute(svc, &[pod]);
        let address = subsets[0].addresses.as_ref().map(|a| a[0].clone());
        assert_eq!(
            address.and_then(|a| a.hostname).as_deref(),
            hostname,
            "{case}"
        );
    }

    let mut unscheduled = pod("a", "10.0.0.1");
    unscheduled.node_name = None;
    unscheduled.resource_version = "99".into();
    let subsets = compute(&svc, &[unscheduled]);
    let address = subsets[0].addresses.as_ref().map(|a| a[0].clone());
    assert_eq!(
        address,
        Some(EndpointAddress {
            ip: "10.0.0.1".into(),
            hostname: None,
            node_name: Some(String::new()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("default".into()),
                name: Some("a".into()),
                uid: Some("uid-a".into()),
                ..ObjectReference::default()
            }),
        }),
        "nodeName written even when empty; targetRef without resourceVersion"
    );
}

#[test]
fn output_is_independent_of_pod_order() {
    let svc = http_service();
    let mut pods: Vec<PodFields> = (1..=20)
        .map(|i| pod(&format!("p{i}"), &format!("10.0.0.{i}")))
        .collect();
    pods.iter_mut().step_by(3).for_each(|p| p.ready = false);
    let forward = compute(&svc, &pods);
    pods.reverse();
    assert_eq!(compute(&svc, &pods), forward);
}
