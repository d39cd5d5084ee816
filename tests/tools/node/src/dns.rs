//! A minimal cluster DNS for the real node: A records for Services
//! (`<service>.<namespace>.svc.cluster.local` → the ClusterIP), looked up in
//! the API at each query, over UDP on the bridge address. Upstream's e2e
//! specs reach Services by name from exec pods (`nc <service> <port>`); no
//! CoreDNS image can be pulled here, and these names are all they ask of it.
//!
//! It answers only what it knows: A queries for a Service with a ClusterIP;
//! a name under `svc.cluster.local` that is no such Service is NXDOMAIN (so
//! the pod's resolver tries its next search domain), and any other query
//! (AAAA, a Service without ClusterIP, a name outside the cluster) gets an
//! empty answer or REFUSED, never a guess.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The cluster domain, as the kubelet's `clusterDomain`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_REFUSED: u8 = 5;
const RCODE_FORMERR: u8 = 1;
/// Seconds a pod may cache an answer: short, as Services come and go
/// between specs.
const TTL: u32 = 5;

/// What the API says about a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The Service exists and has this ClusterIP.
    Address(Ipv4Addr),
    /// The Service exists without an IPv4 ClusterIP (headless, or IPv6).
    NoAddress,
    /// No such Service.
    Missing,
}

/// A parsed query: its id, flags, the question as sent, and the name.
#[derive(Debug, PartialEq)]
struct Query<'a> {
    id: [u8; 2],
    recursion_desired: bool,
    question: &'a [u8],
    name: String,
    qtype: u16,
    qclass: u16,
}

fn parse(packet: &[u8]) -> Option<Query<'_>> {
    let header = packet.get(..12)?;
    // A standard query (QR=0, opcode 0) with exactly one question.
    if header[2] & 0xf8 != 0 || u16::from_be_bytes([header[4], header[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers never appear in a question sent first.
        if len > 63 {
            return None;
        }
        let label = packet.get(at..at + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let fixed = packet.get(at..at + 4)?;
    Some(Query {
        id: [header[0], header[1]],
        recursion_desired: header[2] & 0x01 != 0,
        question: &packet[12..at + 4],
        name: labels.join("."),
        qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
        qclass: u16::from_be_bytes([fixed[2], fixed[3]]),
    })
}

/// `(service, namespace)` of `<service>.<namespace>.svc.cluster.local`.
pub fn service_of(name: &str) -> Option<(&str, &str)> {
    let rest = name
        .trim_end_matches('.')
        .strip_suffix(CLUSTER_DOMAIN)?
        .strip_suffix(".svc.")?;
    let (service, namespace) = rest.split_once('.')?;
    (!service.is_empty() && !namespace.is_empty() && !namespace.contains('.'))
        .then_some((service, namespace))
}

/// The reply to `packet`, `lookup` answering for Services; `None` for what
/// is not a query at all (dropped, as a server does).
pub fn reply(packet: &[u8], lookup: impl FnOnce(&str, &str) -> Lookup) -> Option<Vec<u8>> {
    let Some(query) = parse(packet) else {
        // Something with a header but no parsable question: FORMERR.
        let header = packet.get(..12)?;
        if header[2] & 0x80 != 0 {
            return None;
        }
        return Some(message(
            [header[0], header[1]],
            false,
            RCODE_FORMERR,
            &[],
            None,
        ));
    };
    let (rcode, answer) = match service_of(&query.name) {
        None => (RCODE_REFUSED, None),
        Some((service, namespace)) => match lookup(service, namespace) {
            Lookup::Missing => (RCODE_NXDOMAIN, None),
            Lookup::NoAddress => (0, None),
            Lookup::Address(ip) if query.qtype == TYPE_A && query.qclass == CLASS_IN => {
                (0, Some(ip))
            }
            // The name exists; it has no record of the asked type.
            Lookup::Address(_) => (0, None),
        },
    };
    Some(message(
        query.id,
        query.recursion_desired,
        rcode,
        query.question,
        answer,
    ))
}

fn message(
    id: [u8; 2],
    recursion_desired: bool,
    rcode: u8,
    question: &[u8],
    answer: Option<Ipv4Addr>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + question.len() + 16);
    out.extend_from_slice(&id);
    // QR=1, opcode 0, AA=1, RD as asked; RA=1 (resolvers warn without it).
    out.push(0x84 | u8::from(recursion_desired));
    out.push(0x80 | rcode);
    let questions = u16::from(!question.is_empty());
    out.extend_from_slice(&questions.to_be_bytes());
    out.extend_from_slice(&u16::from(answer.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    if let Some(ip) = answer {
        // The name: a pointer to the question's, at offset 12.
        out.extend_from_slice(&[0xc0, 12]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    out
}

async fn lookup(client: &kube::Client, service: &str, namespace: &str) -> Lookup {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(service).await {
        Ok(Some(svc)) => svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
            .map_or(Lookup::NoAddress, Lookup::Address),
        Ok(None) => Lookup::Missing,
        // The API did not answer: no answer is better than a wrong one; the
        // resolver retries.
        Err(_) => Lookup::NoAddress,
    }
}

/// Serves on UDP `address` until the returned task is aborted.
pub async fn serve(address: SocketAddr, client: kube::Client) -> Result<JoinHandle<()>> {
    let socket = Arc::new(
        UdpSocket::bind(address)
            .await
            .with_context(|| format!("binding the cluster DNS to {address}"))?,
    );
    Ok(tokio::spawn(async move {
        let mut buf = vec![0u8; 1500];
        loop {
            let Ok((len, from)) = socket.recv_from(&mut buf).await else {
                continue;
            };
            let packet = buf[..len].to_vec();
            let socket = socket.clone();
            let client = client.clone();
            tokio::spawn(async move {
                let found = match parse(&packet)
                    .and_then(|q| service_of(&q.name).map(|(s, n)| (s.to_string(), n.to_string())))
                {
                    Some((service, namespace)) => lookup(&client, &service, &namespace).await,
                    None => Lookup::Missing,
                };
                if let Some(out) = reply(&packet, |_, _| found) {
                    let _ = socket.send_to(&out, from).await;
                }
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut out = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out
    }

    #[test]
    fn service_names_are_split_into_service_and_namespace() {
        assert_eq!(
            service_of("web.ns-1.svc.cluster.local"),
            Some(("web", "ns-1"))
        );
        assert_eq!(
            service_of("web.ns-1.svc.cluster.local."),
            Some(("web", "ns-1"))
        );
        assert_eq!(service_of("web.svc.cluster.local"), None);
        assert_eq!(service_of("a.b.c.svc.cluster.local"), None);
        assert_eq!(service_of("example.com"), None);
    }

    #[test]
    fn a_service_gets_its_cluster_ip() {
        let q = query("Web.NS.svc.cluster.local", TYPE_A);
        let mut asked = None;
        let out = reply(&q, |s, n| {
            asked = Some((s.to_string(), n.to_string()));
            Lookup::Address(Ipv4Addr::new(10, 96, 3, 4))
        })
        .unwrap_or_default();
        assert_eq!(asked, Some(("web".into(), "ns".into())));
        assert_eq!(&out[..2], &[0xab, 0xcd]);
        assert_eq!(out[2], 0x85, "QR, AA, RD");
        assert_eq!(out[3] & 0x0f, 0, "NOERROR");
        assert_eq!(&out[6..8], &[0, 1], "one answer");
        assert_eq!(&out[12..q.len()], &q[12..], "the question, as sent");
        assert_eq!(&out[out.len() - 4..], &[10, 96, 3, 4]);
    }

    #[test]
    fn other_names_and_types_get_no_guess() {
        let nx = reply(&query("gone.ns.svc.cluster.local", TYPE_A), |_, _| {
            Lookup::Missing
        })
        .unwrap_or_default();
        assert_eq!(nx[3] & 0x0f, RCODE_NXDOMAIN);
        let aaaa = reply(&query("web.ns.svc.cluster.local", 28), |_, _| {
            Lookup::Address(Ipv4Addr::new(10, 96, 3, 4))
        })
        .unwrap_or_default();
        assert_eq!((aaaa[3] & 0x0f, aaaa[7]), (0, 0), "NOERROR, no answer");
        let outside =
            reply(&query("example.com", TYPE_A), |_, _| Lookup::Missing).unwrap_or_default();
        assert_eq!(outside[3] & 0x0f, RCODE_REFUSED);
        assert_eq!(reply(&[1, 2, 3], |_, _| Lookup::Missing), None);
    }
}
