//! Golden values printed by upstream Go code (k8s.io/kubernetes v1.36.3:
//! `hashutil.DeepHashObject` with `fnv.New128a()` and `dump.ForHash`; the MD5
//! digests and the orders by k8s.io/kubernetes v1.34.4 and v1.35.4, with
//! `md5.New()`, SortSubsets, RepackSubsets and k8s.io/endpointslice's
//! NewPortMapKey) for the same inputs (discovery ports: `dump.ForHash` of a
//! `discovery/v1.EndpointPort`, the value upstream's NewPortMapKey sorts by);
//! our rendering, digests and orders must match them exactly.

use super::*;
use crate::desired::testkit::{address, pod_ref, port, subset};

fn hex(digest: Digest) -> String {
    format!("{digest:032x}")
}

#[test]
fn md5_reference_vectors() {
    // RFC 1321's test suite.
    assert_eq!(hex(md5_128(b"")), "d41d8cd98f00b204e9800998ecf8427e");
    assert_eq!(hex(md5_128(b"abc")), "900150983cd24fb0d6963f7d28e17f72");
    assert_eq!(
        hex(md5_128(
            b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
        )),
        "57edf4a22be3c955ac49da2e2107b67a"
    );
}

#[test]
fn fnv1a_128_reference_vectors() {
    // Published FNV-1a 128-bit test vectors.
    assert_eq!(hex(fnv1a_128(b"")), "6c62272e07bb014262b821756295c58d");
    assert_eq!(hex(fnv1a_128(b"a")), "d228cb696f1a8caf78912b704e4a8964");
}

#[test]
fn port_renderings_and_digests_match_upstream() {
    let cases = [
        (
            "named port, no appProtocol",
            port("http", 80, "TCP", None),
            "(v1.EndpointPort){Name:(string)http Port:(int32)80 Protocol:(v1.Protocol)TCP AppProtocol:(*string)<nil>}",
            "754b003f50f133a539c60d18cfb30a55",
            "a0afc9289a5b862f31961966cd661a6e",
        ),
        (
            "unnamed port",
            port("", 8080, "TCP", None),
            "(v1.EndpointPort){Name:(string) Port:(int32)8080 Protocol:(v1.Protocol)TCP AppProtocol:(*string)<nil>}",
            "b09ff368df0fc81442c7b7a3ab2dbca5",
            "ca90e29ee3665e5029fabda7c226b84c",
        ),
        (
            "appProtocol set",
            port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
            "(v1.EndpointPort){Name:(string)grpc Port:(int32)9090 Protocol:(v1.Protocol)TCP AppProtocol:(*string)kubernetes.io/h2c}",
            "9e14b1366e902def1e42b1a55f645e26",
            "47f5e6ef2c829427338e8d12225f9503",
        ),
        (
            "udp",
            port("dns", 53, "UDP", None),
            "(v1.EndpointPort){Name:(string)dns Port:(int32)53 Protocol:(v1.Protocol)UDP AppProtocol:(*string)<nil>}",
            "cf684d8c2a0def1ba31f64600b9051ae",
            "3e9daf8e22f0b0da6aaa1a1b052ee929",
        ),
        (
            "appProtocol pointer to empty string",
            port("sctp", 3868, "SCTP", Some("")),
            "(v1.EndpointPort){Name:(string)sctp Port:(int32)3868 Protocol:(v1.Protocol)SCTP AppProtocol:(*string)}",
            "2084400e4265fd07374e430c1160c6a4",
            "504ffdbcfa05a3e22e53bd075c893f6f",
        ),
        (
            "protocol unset",
            port("x", 1, "", None),
            "(v1.EndpointPort){Name:(string)x Port:(int32)1 Protocol:(v1.Protocol) AppProtocol:(*string)<nil>}",
            "9ef819d360124be9f7343bb88f2fda01",
            "76c248cb6f6c2d0d56a5cfa1ea670106",
        ),
    ];
    for (case, value, rendering, fnv, md5) in cases {
        assert_eq!(render_port(&value), rendering, "{case}");
        assert_eq!(hex(port_digest(&value, SpewHash::Fnv128a)), fnv, "{case}");
        assert_eq!(hex(port_digest(&value, SpewHash::Md5)), md5, "{case}");
    }
}

#[test]
fn subset_renderings_and_digests_match_upstream() {
    let mut with_hostname = address("10.0.0.2", Some(""), Some(pod_ref("ns", "web-0", "uid-b")));
    with_hostname.hostname = Some("web-0".into());
    let mut with_resource_version = pod_ref("ns", "p3", "u3");
    with_resource_version.resource_version = Some("123".into());
    let cases = [
        (
            "one ready address with nodeName",
            subset(
                Some(vec![address(
                    "10.0.0.1",
                    Some("node-a"),
                    Some(pod_ref("ns", "pod-a", "uid-a")),
                )]),
                None,
                Some(vec![port("http", 80, "TCP", None)]),
            ),
            "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)[{IP:(string)10.0.0.1 Hostname:(string) NodeName:(*string)node-a TargetRef:(*v1.ObjectReference){Kind:(string)Pod Namespace:(string)ns Name:(string)pod-a UID:(types.UID)uid-a APIVersion:(string) ResourceVersion:(string) FieldPath:(string)}}] NotReadyAddresses:([]v1.EndpointAddress)<nil> Ports:([]v1.EndpointPort)[{Name:(string)http Port:(int32)80 Protocol:(v1.Protocol)TCP AppProtocol:(*string)<nil>}]}",
            "48de5997baf859f08689f702e98f6cf2",
            "4ef5a519082da98ec74a9c4a4108cf65",
        ),
        (
            "not-ready address with hostname and empty nodeName",
            subset(
                None,
                Some(vec![with_hostname]),
                Some(vec![
                    port("http", 80, "TCP", None),
                    port("grpc", 9090, "TCP", Some("kubernetes.io/h2c")),
                ]),
            ),
            "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)<nil> NotReadyAddresses:([]v1.EndpointAddress)[{IP:(string)10.0.0.2 Hostname:(string)web-0 NodeName:(*string) TargetRef:(*v1.ObjectReference){Kind:(string)Pod Namespace:(string)ns Name:(string)web-0 UID:(types.UID)uid-b APIVersion:(string) ResourceVersion:(string) FieldPath:(string)}}] Ports:([]v1.EndpointPort)[{Name:(string)http Port:(int32)80 Protocol:(v1.Protocol)TCP AppProtocol:(*string)<nil>} {Name:(string)grpc Port:(int32)9090 Protocol:(v1.Protocol)TCP AppProtocol:(*string)kubernetes.io/h2c}]}",
            "4cd69084964d68dbdf0ef7cbfc0850f8",
            "2ab0183e76c1f5de04377784c8c242bf",
        ),
        (
            "nil nodeName, nil targetRef, nil ports",
            subset(Some(vec![address("fd00::1", None, None)]), None, None),
            "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)[{IP:(string)fd00::1 Hostname:(string) NodeName:(*string)<nil> TargetRef:(*v1.ObjectReference)<nil>}] NotReadyAddresses:([]v1.EndpointAddress)<nil> Ports:([]v1.EndpointPort)<nil>}",
            "2faba91a4d3ac50a4a12936ac5cda230",
            "1262a7739fdc265d0cf395c8bd30d5c3",
        ),
        (
            "empty but non-nil slices",
            subset(Some(vec![]), None, Some(vec![])),
            "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)[] NotReadyAddresses:([]v1.EndpointAddress)<nil> Ports:([]v1.EndpointPort)[]}",
            "1ec89e8bb6a85ed50869ee728127548d",
            "e05b4d83c8813c6a96756767462cd486",
        ),
        (
            "several addresses, targetRef resourceVersion",
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
            "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)[{IP:(string)10.0.0.3 Hostname:(string) NodeName:(*string)n1 TargetRef:(*v1.ObjectReference){Kind:(string)Pod Namespace:(string)ns Name:(string)p3 UID:(types.UID)u3 APIVersion:(string) ResourceVersion:(string)123 FieldPath:(string)}} {IP:(string)10.0.0.4 Hostname:(string) NodeName:(*string)<nil> TargetRef:(*v1.ObjectReference){Kind:(string)Pod Namespace:(string)ns Name:(string)p4 UID:(types.UID)u4 APIVersion:(string) ResourceVersion:(string) FieldPath:(string)}}] NotReadyAddresses:([]v1.EndpointAddress)[{IP:(string)10.0.0.5 Hostname:(string) NodeName:(*string)n2 TargetRef:(*v1.ObjectReference){Kind:(string)Pod Namespace:(string)ns Name:(string)p5 UID:(types.UID)u5 APIVersion:(string) ResourceVersion:(string) FieldPath:(string)}}] Ports:([]v1.EndpointPort)[{Name:(string)dns Port:(int32)53 Protocol:(v1.Protocol)UDP AppProtocol:(*string)<nil>}]}",
            "55f51c33f9d19d9219815c6fce980331",
            "c7d3e58817966ddbd7b9186e0fb86b38",
        ),
    ];
    for (case, value, rendering, fnv, md5) in cases {
        assert_eq!(render_subset(&value), rendering, "{case}");
        assert_eq!(hex(subset_digest(&value, SpewHash::Fnv128a)), fnv, "{case}");
        assert_eq!(hex(subset_digest(&value, SpewHash::Md5)), md5, "{case}");
    }
}

#[test]
fn slice_port_renderings_and_digests_match_upstream() {
    let slice_port = |name: Option<&str>,
                      number: Option<i32>,
                      protocol: Option<&str>,
                      app: Option<&str>| SlicePort {
        name: name.map(str::to_string),
        port: number,
        protocol: protocol.map(str::to_string),
        app_protocol: app.map(str::to_string),
    };
    let cases = [
        (
            "named TCP port",
            slice_port(Some("http"), Some(8080), Some("TCP"), None),
            "(v1.EndpointPort){Name:(*string)http Protocol:(*v1.Protocol)TCP Port:(*int32)8080 AppProtocol:(*string)<nil>}",
            "0e874d5677090ee5c32afa85f637c347",
            "3a668b0e210f1dc6528e2da191cd41d4",
        ),
        (
            "name pointing at the empty string",
            slice_port(Some(""), Some(80), Some("TCP"), None),
            "(v1.EndpointPort){Name:(*string) Protocol:(*v1.Protocol)TCP Port:(*int32)80 AppProtocol:(*string)<nil>}",
            "73b52e075e78e70787d5e6ffd2212eef",
            "65e128212fd64e6eab3cc3e6dcdab5b0",
        ),
        (
            "udp",
            slice_port(Some("dns"), Some(5353), Some("UDP"), None),
            "(v1.EndpointPort){Name:(*string)dns Protocol:(*v1.Protocol)UDP Port:(*int32)5353 AppProtocol:(*string)<nil>}",
            "2ad1166c099e59f4bd62c090f7f70904",
            "caa189df45e67988792f5cfa4fe66913",
        ),
        (
            "appProtocol set",
            slice_port(
                Some("grpc"),
                Some(9090),
                Some("TCP"),
                Some("kubernetes.io/h2c"),
            ),
            "(v1.EndpointPort){Name:(*string)grpc Protocol:(*v1.Protocol)TCP Port:(*int32)9090 AppProtocol:(*string)kubernetes.io/h2c}",
            "1fdbc42154e9ebd6db4993d21b99f4f0",
            "e251a433d5ecdee71c671581d0384d3d",
        ),
        (
            "appProtocol pointing at the empty string",
            slice_port(Some("metrics"), Some(9100), Some("TCP"), Some("")),
            "(v1.EndpointPort){Name:(*string)metrics Protocol:(*v1.Protocol)TCP Port:(*int32)9100 AppProtocol:(*string)}",
            "c30a8fcf31e6f99efdd02b40f864970d",
            "481a280eddc2991c897b7ac046eb2c09",
        ),
        (
            "every pointer nil",
            slice_port(None, None, None, None),
            "(v1.EndpointPort){Name:(*string)<nil> Protocol:(*v1.Protocol)<nil> Port:(*int32)<nil> AppProtocol:(*string)<nil>}",
            "ad866eb7cd5162a9e20434ebd9deeacd",
            "b69560f5ba6cdbe404f478cc9c5dfcbf",
        ),
    ];
    for (case, value, rendering, fnv, md5) in cases {
        assert_eq!(render_slice_port(&value), rendering, "{case}");
        assert_eq!(
            hex(slice_port_digest(&value, SpewHash::Fnv128a)),
            fnv,
            "{case}"
        );
        assert_eq!(hex(slice_port_digest(&value, SpewHash::Md5)), md5, "{case}");
    }
}
