//! desired_slices: ports and port sets, labels, owner reference, hint rule;
//! golden values re-express upstream's reconciler_test.go (k8s.io/endpointslice
//! v0.36.3) where they exist.

use k8s_openapi::api::discovery::v1::EndpointPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::compute_tests::only_group;
use super::testkit::{OURS, desire, pods, service_with, web_service};
use super::*;
use crate::desired::testkit::{named_port, service_port, spec_mut, string_map};
use crate::desired::{FeatureGates, KubeRelease, PodFields, PodInfo, Rules};

fn slice_port(name: &str, port: i32, protocol: &str, app: Option<&str>) -> EndpointPort {
    EndpointPort {
        name: Some(name.into()),
        port: Some(port),
        protocol: Some(protocol.into()),
        app_protocol: app.map(str::to_string),
    }
}

#[test]
fn ports_are_resolved_per_pod_and_group_endpoints() {
    let named =
        |name: &str, port: i32| service_port(name, port, Some(IntOrString::String(name.into())));
    let mut grpc = service_port("grpc", 9090, Some(IntOrString::Int(9090)));
    grpc.app_protocol = Some("kubernetes.io/h2c".into());
    let mut dns = named("dns", 53);
    dns.protocol = Some("UDP".into());
    let unnamed = service_port("", 80, Some(IntOrString::Int(80)));
    let svc = crate::desired::testkit::service(vec![named("http", 8080), grpc, dns, unnamed]);
    let mut svc = svc;
    svc.metadata.uid = Some("uid-web".into());
    let mut all = pods(3);
    all[0].container_ports = vec![
        named_port("http", 8080, "TCP"),
        named_port("dns", 5353, "UDP"),
    ];
    all[1].container_ports = vec![
        named_port("http", 8081, "TCP"),
        named_port("dns", 5353, "TCP"),
    ];
    all[2].container_ports = all[0].container_ports.clone();
    let desired = desire(&svc, &all);
    let groups: Vec<(Vec<EndpointPort>, usize)> = desired.address_types[0]
        .groups
        .iter()
        .map(|g| (g.ports.clone(), g.endpoints.len()))
        .collect();
    // Order within a set is upstream's digest order (golden from Go:
    // http:8080 < grpc < dns < "" < metrics); a name-less Service port gets
    // the empty name, and the UDP port is missing where only TCP "dns" exists.
    let full = vec![
        slice_port("http", 8080, "TCP", None),
        slice_port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
        slice_port("dns", 5353, "UDP", None),
        slice_port("", 80, "TCP", None),
    ];
    let partial = {
        let mut ports = vec![
            slice_port("http", 8081, "TCP", None),
            slice_port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
            slice_port("", 80, "TCP", None),
        ];
        super::compute::sort_ports(&mut ports, crate::desired::SpewHash::Fnv128a);
        ports
    };
    assert!(groups.contains(&(full, 2)), "{groups:?}");
    assert!(groups.contains(&(partial, 1)), "{groups:?}");
    assert_eq!(groups.len(), 2);
}

#[test]
fn pods_without_resolvable_ports_still_publish() {
    let svc = {
        let mut s = crate::desired::testkit::service(vec![service_port(
            "http",
            80,
            Some(IntOrString::String("missing".into())),
        )]);
        s.metadata.uid = Some("uid-web".into());
        s
    };
    let desired = desire(&svc, &pods(2));
    let group = only_group(&desired);
    assert!(
        group.ports.is_empty(),
        "no port resolves: an empty port set"
    );
    assert_eq!(group.endpoints.len(), 2, "upstream still lists the pods");

    // Upstream's TestReconcileHeadlessServiceNoPorts.
    let mut headless = web_service();
    let spec = spec_mut(&mut headless);
    spec.cluster_ip = Some("None".into());
    spec.ports = None;
    let desired = desire(&headless, &pods(1));
    assert!(only_group(&desired).ports.is_empty());
    assert_eq!(only_group(&desired).endpoints.len(), 1);
}

/// Upstream's TestReconcile1Pod label cases, and the owner reference.
#[test]
fn labels_and_owner() {
    let with = |labels: &[(&str, &str)], cluster_ip: &str| {
        let mut svc = web_service();
        svc.metadata.labels = Some(string_map(labels));
        spec_mut(&mut svc).cluster_ip = Some(cluster_ip.into());
        svc
    };
    let expected = |extra: &[(&str, &str)]| -> BTreeMap<String, String> {
        let mut labels = string_map(extra);
        labels.insert(LABEL_SERVICE_NAME.into(), "web".into());
        labels.insert(LABEL_SLICE_MANAGED_BY.into(), OURS.into());
        labels
    };
    let cases = [
        ("cluster IP, no labels", with(&[], "1.1.1.1"), expected(&[])),
        (
            "headless label without a cluster IP",
            with(&[], "None"),
            expected(&[("service.kubernetes.io/headless", "")]),
        ),
        (
            "empty cluster IP counts as headless",
            with(&[("foo", "bar")], ""),
            expected(&[("foo", "bar"), ("service.kubernetes.io/headless", "")]),
        ),
        (
            "reserved labels of the Service are ignored",
            with(
                &[
                    (LABEL_SERVICE_NAME, "bad"),
                    (LABEL_SLICE_MANAGED_BY, "actor"),
                    ("service.kubernetes.io/headless", "invalid"),
                ],
                "1.1.1.1",
            ),
            expected(&[]),
        ),
    ];
    for (case, svc, labels) in cases {
        assert_eq!(desire(&svc, &[]).labels, labels, "{case}");
    }
    let owner = desire(&web_service(), &[]).owner;
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Service", "web", "uid-web")
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
}

#[test]
fn hint_mode_from_annotations_and_traffic_distribution() {
    let with = service_with;
    let cases = [
        ("nothing", with(&[], None), HintMode::None),
        (
            "PreferClose",
            with(&[], Some("PreferClose")),
            HintMode::SameZone,
        ),
        (
            "PreferSameZone",
            with(&[], Some("PreferSameZone")),
            HintMode::SameZone,
        ),
        (
            "PreferSameNode",
            with(&[], Some("PreferSameNode")),
            HintMode::SameZoneAndNode,
        ),
        (
            "unknown value",
            with(&[], Some("Elsewhere")),
            HintMode::None,
        ),
        (
            "topology-mode Auto",
            with(&[(ANNOTATION_TOPOLOGY_MODE, "Auto")], None),
            HintMode::Auto,
        ),
        (
            "lower-case auto",
            with(&[(ANNOTATION_TOPOLOGY_MODE, "auto")], None),
            HintMode::Auto,
        ),
        (
            "other case",
            with(&[(ANNOTATION_TOPOLOGY_MODE, "AUTO")], None),
            HintMode::None,
        ),
        (
            "Auto wins over trafficDistribution",
            with(
                &[(ANNOTATION_TOPOLOGY_MODE, "Auto")],
                Some("PreferSameNode"),
            ),
            HintMode::Auto,
        ),
        (
            "the older annotation wins when both are set",
            with(
                &[
                    (ANNOTATION_TOPOLOGY_AWARE_HINTS, "Disabled"),
                    (ANNOTATION_TOPOLOGY_MODE, "Auto"),
                ],
                Some("PreferClose"),
            ),
            HintMode::SameZone,
        ),
        (
            "the older annotation alone",
            with(&[(ANNOTATION_TOPOLOGY_AWARE_HINTS, "auto")], None),
            HintMode::Auto,
        ),
    ];
    for (case, svc, mode) in cases {
        assert_eq!(desire(&svc, &[]).hints, mode, "{case}");
    }
}

/// kube-controller-manager 1.34 with PreferSameTrafficDistribution off
/// (`validTrafficDistribution` of k8s.io/endpointslice v0.34.4) hints
/// PreferClose only; the topology annotation is not behind the gate.
#[test]
fn without_prefer_same_traffic_distribution_only_prefer_close_gives_hints() {
    let gate_off = FeatureGates {
        prefer_same_traffic_distribution: Some(false),
    };
    let (Ok(off), on) = (
        Rules::with_gates(KubeRelease::V1_34, gate_off),
        Rules::of(KubeRelease::V1_34),
    ) else {
        panic!("the gate may be off on 1.34");
    };
    let with = service_with;
    let cases = [
        (
            "PreferClose",
            with(&[], Some("PreferClose")),
            HintMode::SameZone,
            HintMode::SameZone,
        ),
        (
            "PreferSameZone",
            with(&[], Some("PreferSameZone")),
            HintMode::None,
            HintMode::SameZone,
        ),
        (
            "PreferSameNode",
            with(&[], Some("PreferSameNode")),
            HintMode::None,
            HintMode::SameZoneAndNode,
        ),
        (
            "topology-mode Auto",
            with(
                &[(ANNOTATION_TOPOLOGY_MODE, "Auto")],
                Some("PreferSameNode"),
            ),
            HintMode::Auto,
            HintMode::Auto,
        ),
    ];
    for (case, svc, gate_off_mode, gate_on_mode) in cases {
        assert_eq!(hint_mode(&svc, off), gate_off_mode, "{case}, gate off");
        assert_eq!(hint_mode(&svc, on), gate_on_mode, "{case}, gate on");
        let pods = pods(2);
        let refs: Vec<PodInfo> = pods.iter().map(PodFields::pack).collect();
        let refs: Vec<&PodInfo> = refs.iter().collect();
        let desired = desired_slices(&svc, &refs, &super::testkit::nodes(), OURS, off);
        assert_eq!(
            desired.hints, gate_off_mode,
            "{case}: what desired_slices carries"
        );
    }
}

#[test]
fn deleting_service_is_flagged() {
    let mut svc = web_service();
    assert!(!desire(&svc, &[]).service_deleting);
    svc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    assert!(desire(&svc, &[]).service_deleting);
}
