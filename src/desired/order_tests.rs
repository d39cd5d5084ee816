//! The order of each release: the same inputs sorted by kube-controller-manager
//! 1.34 (MD5) and 1.35 and later (FNV-1a 128). The golden orders were printed
//! by upstream's own code of k8s.io/kubernetes v1.34.4 and v1.35.4
//! (`pkg/api/v1/endpoints` SortSubsets and RepackSubsets, k8s.io/endpointslice
//! NewPortMapKey); v1.36.3 printed the same as v1.35.4.

use k8s_openapi::api::core::v1::EndpointSubset;
use k8s_openapi::api::discovery::v1::EndpointPort as SlicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::repack::sort_subsets;
use super::slices::sort_ports;
use super::testkit::{address, named_port, pod, pod_ref, port, service, service_port, subset};
use super::{KubeRelease, PodFields, PodInfo, Rules, compute_subsets};

const MD5_RELEASES: [KubeRelease; 1] = [KubeRelease::V1_34];
const FNV_RELEASES: [KubeRelease; 3] = [KubeRelease::V1_35, KubeRelease::V1_36, KubeRelease::V1_37];

/// The ports of the digest tests in `spew_tests`, named so their order reads.
fn ports() -> Vec<k8s_openapi::api::core::v1::EndpointPort> {
    vec![
        port("http", 80, "TCP", None),
        port("", 8080, "TCP", None),
        port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
        port("dns", 53, "UDP", None),
        port("sctp", 3868, "SCTP", Some("")),
        port("x", 1, "", None),
    ]
}

#[test]
fn ports_of_a_subset_in_each_release_order() {
    for (releases, want) in [
        (&MD5_RELEASES[..], ["dns", "grpc", "sctp", "x", "http", ""]),
        (&FNV_RELEASES[..], ["sctp", "http", "grpc", "x", "", "dns"]),
    ] {
        for release in releases {
            let one = subset(
                Some(vec![address("10.0.0.9", None, None)]),
                None,
                Some(ports()),
            );
            let sorted = sort_subsets(vec![one], Rules::of(*release).port_order());
            let names: Vec<&str> = sorted[0]
                .ports
                .iter()
                .flatten()
                .map(|p| p.name.as_deref().unwrap_or(""))
                .collect();
            assert_eq!(names, want, "{release}");
        }
    }
}

/// The subsets of the digest tests in `spew_tests`, numbered.
fn subsets() -> Vec<EndpointSubset> {
    let mut with_hostname = address("10.0.0.2", Some(""), Some(pod_ref("ns", "web-0", "uid-b")));
    with_hostname.hostname = Some("web-0".into());
    let mut with_resource_version = pod_ref("ns", "p3", "u3");
    with_resource_version.resource_version = Some("123".into());
    vec![
        subset(
            Some(vec![address(
                "10.0.0.1",
                Some("node-a"),
                Some(pod_ref("ns", "pod-a", "uid-a")),
            )]),
            None,
            Some(vec![port("http", 80, "TCP", None)]),
        ),
        subset(
            None,
            Some(vec![with_hostname]),
            Some(vec![
                port("http", 80, "TCP", None),
                port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
            ]),
        ),
        subset(Some(vec![address("fd00::1", None, None)]), None, None),
        subset(Some(vec![]), None, Some(vec![])),
        subset(
            Some(vec![
                address("10.0.0.3", Some("n1"), Some(with_resource_version)),
                address("10.0.0.4", None, Some(pod_ref("ns", "p4", "u4"))),
            ]),
            Some(vec![address(
                "10.0.0.5",
                Some("n2"),
                Some(pod_ref("ns", "p5", "u5")),
            )]),
            Some(vec![port("dns", 53, "UDP", None)]),
        ),
    ]
}

#[test]
fn subsets_in_each_release_order() {
    for (releases, want) in [
        (&MD5_RELEASES[..], [2, 0, 1, 4, 3]),
        (&FNV_RELEASES[..], [3, 2, 0, 1, 4]),
    ] {
        for release in releases {
            let original = subsets();
            let sorted = sort_subsets(original.clone(), Rules::of(*release).port_order());
            // Told apart by their addresses: sorting reorders ports inside.
            let order: Vec<usize> = sorted
                .iter()
                .filter_map(|s| {
                    original.iter().position(|o| {
                        (&o.addresses, &o.not_ready_addresses)
                            == (&s.addresses, &s.not_ready_addresses)
                    })
                })
                .collect();
            assert_eq!(order, want, "{release}");
        }
    }
}

#[test]
fn slice_ports_in_each_release_order() {
    let slice_port =
        |name: Option<&str>, number: Option<i32>, protocol: Option<&str>, app: Option<&str>| {
            SlicePort {
                name: name.map(str::to_string),
                port: number,
                protocol: protocol.map(str::to_string),
                app_protocol: app.map(str::to_string),
            }
        };
    let given = || {
        vec![
            slice_port(Some("http"), Some(8080), Some("TCP"), None),
            slice_port(Some(""), Some(80), Some("TCP"), None),
            slice_port(Some("dns"), Some(5353), Some("UDP"), None),
            slice_port(
                Some("grpc"),
                Some(9090),
                Some("TCP"),
                Some("kubernetes.io/h2c"),
            ),
            slice_port(Some("metrics"), Some(9100), Some("TCP"), Some("")),
            slice_port(None, None, None, None),
        ]
    };
    // NewPortMapKey's order, as JSON.
    let md5 = r#"[{"name":"http","protocol":"TCP","port":8080},{"name":"metrics","protocol":"TCP","port":9100,"appProtocol":""},{"name":"","protocol":"TCP","port":80},{},{"name":"dns","protocol":"UDP","port":5353},{"name":"grpc","protocol":"TCP","port":9090,"appProtocol":"kubernetes.io/h2c"}]"#;
    let fnv = r#"[{"name":"http","protocol":"TCP","port":8080},{"name":"grpc","protocol":"TCP","port":9090,"appProtocol":"kubernetes.io/h2c"},{"name":"dns","protocol":"UDP","port":5353},{"name":"","protocol":"TCP","port":80},{},{"name":"metrics","protocol":"TCP","port":9100,"appProtocol":""}]"#;
    for (releases, want) in [(&MD5_RELEASES[..], md5), (&FNV_RELEASES[..], fnv)] {
        let want: Vec<SlicePort> = serde_json::from_str(want).unwrap_or_else(|e| panic!("{e}"));
        for release in releases {
            let mut ports = given();
            sort_ports(&mut ports, Rules::of(*release).port_order());
            assert_eq!(ports, want, "{release}");
        }
    }
}

/// Pods offering different sets of a Service's three ports, one not ready:
/// what `compute_subsets` writes is RepackSubsets of their single-port
/// subsets, in the order of the release.
#[test]
fn endpoints_of_several_port_sets_in_each_release_order() {
    let named = |target: &str| Some(IntOrString::String(target.to_string()));
    let svc = service(vec![
        service_port("web", 80, named("web")),
        service_port("metrics", 9100, named("metrics")),
        service_port("admin", 9000, named("admin")),
    ]);
    let member = |name: &str, ip: &str, ready: bool, offered: &[(&str, i32)]| {
        let mut pod: PodFields = pod(name, ip);
        pod.namespace = "ns".into();
        pod.ready = ready;
        pod.container_ports = offered
            .iter()
            .map(|(port, number)| named_port(port, *number, "TCP"))
            .collect();
        pod.pack()
    };
    let pods: Vec<PodInfo> = vec![
        member(
            "a",
            "10.1.0.1",
            true,
            &[("web", 8080), ("metrics", 9100), ("admin", 9000)],
        ),
        member("b", "10.1.0.2", true, &[("web", 8080), ("metrics", 9100)]),
        member("c", "10.1.0.3", false, &[("web", 8080), ("admin", 9000)]),
        member("d", "10.1.0.4", true, &[("metrics", 9100)]),
    ];
    let refs: Vec<&PodInfo> = pods.iter().collect();
    let address = |ip: &str, pod: &str| {
        format!(
            r#"{{"ip":"{ip}","nodeName":"node-1","targetRef":{{"kind":"Pod","namespace":"ns","name":"{pod}","uid":"uid-{pod}"}}}}"#
        )
    };
    let (a, b, c, d) = (
        address("10.1.0.1", "a"),
        address("10.1.0.2", "b"),
        address("10.1.0.3", "c"),
        address("10.1.0.4", "d"),
    );
    let admin = format!(
        r#"{{"addresses":[{a}],"notReadyAddresses":[{c}],"ports":[{{"name":"admin","port":9000,"protocol":"TCP"}}]}}"#
    );
    let metrics = format!(
        r#"{{"addresses":[{a},{b},{d}],"ports":[{{"name":"metrics","port":9100,"protocol":"TCP"}}]}}"#
    );
    let web = format!(
        r#"{{"addresses":[{a},{b}],"notReadyAddresses":[{c}],"ports":[{{"name":"web","port":8080,"protocol":"TCP"}}]}}"#
    );
    // RepackSubsets' answers, as JSON.
    let md5 = format!("[{admin},{metrics},{web}]");
    let fnv = format!("[{admin},{web},{metrics}]");
    for (releases, want) in [(&MD5_RELEASES[..], md5), (&FNV_RELEASES[..], fnv)] {
        let want: Vec<EndpointSubset> =
            serde_json::from_str(&want).unwrap_or_else(|e| panic!("{e}"));
        for release in releases {
            let computed = compute_subsets(&svc, &refs, Rules::of(*release));
            assert_eq!(computed.subsets, want, "{release}");
        }
    }
}
