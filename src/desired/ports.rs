//! Service port → endpoint port, per pod (upstream `endpointslice.FindPort` and
//! `endpointPortFromServicePort`).

use k8s_openapi::api::core::v1::{EndpointPort, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::PodInfo;

/// The port number a Service port targets on this pod; `None` when a named
/// targetPort has no container port with that name and the same protocol
/// (upstream then skips this Service port for this pod only).
pub(crate) fn resolve_target_port(service_port: &ServicePort, pod: &PodInfo) -> Option<i32> {
    match &service_port.target_port {
        // The API server defaults an unset targetPort to the port itself, so a
        // Service read from it never reaches this arm; do the same here.
        None => Some(service_port.port),
        Some(IntOrString::Int(number)) => Some(*number),
        Some(IntOrString::String(name)) => {
            // Upstream compares Go strings: an absent protocol is "".
            let protocol = service_port.protocol.as_deref().unwrap_or("");
            pod.container_ports()
                .find(|p| p.name == name && p.protocol == protocol)
                .map(|p| p.container_port)
        }
    }
}

/// The EndpointPort upstream writes: the Service port's name, protocol and
/// appProtocol with the resolved number.
pub(crate) fn endpoint_port(service_port: &ServicePort, number: i32) -> EndpointPort {
    EndpointPort {
        name: service_port.name.clone().filter(|n| !n.is_empty()),
        port: number,
        protocol: service_port.protocol.clone().filter(|p| !p.is_empty()),
        app_protocol: service_port.app_protocol.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testkit::{named_port, pod, service_port};

    #[test]
    fn target_port_resolution_rules() {
        let mut pod = pod("a", "10.0.0.1");
        pod.container_ports = vec![
            named_port("dns", 5353, "UDP"),
            named_port("http", 8080, "TCP"),
            named_port("http", 8081, "TCP"),
            named_port("sidecar-metrics", 9100, "TCP"),
        ];
        let mut udp = service_port("dns", 53, Some(IntOrString::String("dns".into())));
        udp.protocol = Some("UDP".into());
        let mut tcp_dns = service_port("dns-tcp", 53, Some(IntOrString::String("dns".into())));
        tcp_dns.protocol = Some("TCP".into());
        let cases = [
            (
                "numeric targetPort used as is",
                service_port("a", 80, Some(IntOrString::Int(9376))),
                Some(9376),
            ),
            (
                "unset targetPort means the port",
                service_port("b", 80, None),
                Some(80),
            ),
            (
                "named targetPort: first container port with that name",
                service_port("c", 80, Some(IntOrString::String("http".into()))),
                Some(8080),
            ),
            (
                "named targetPort found in sidecar ports",
                service_port("d", 80, Some(IntOrString::String("sidecar-metrics".into()))),
                Some(9100),
            ),
            (
                "named targetPort must match the protocol too",
                tcp_dns,
                None,
            ),
            ("named targetPort with matching protocol", udp, Some(5353)),
            (
                "named targetPort missing",
                service_port("e", 80, Some(IntOrString::String("nope".into()))),
                None,
            ),
        ];
        for (case, service_port, expected) in cases {
            assert_eq!(
                resolve_target_port(&service_port, &pod.pack()),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn endpoint_port_copies_name_protocol_and_app_protocol() {
        let mut sp = service_port("grpc", 80, Some(IntOrString::Int(9090)));
        sp.app_protocol = Some("kubernetes.io/h2c".into());
        sp.node_port = Some(30000);
        let ep = endpoint_port(&sp, 9090);
        assert_eq!(ep.name.as_deref(), Some("grpc"));
        assert_eq!(ep.port, 9090);
        assert_eq!(ep.protocol.as_deref(), Some("TCP"));
        assert_eq!(ep.app_protocol.as_deref(), Some("kubernetes.io/h2c"));
    }
}
