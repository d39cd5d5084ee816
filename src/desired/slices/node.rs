//! [`NodeInfo`]: what EndpointSlices need from a Node (its zone for each
//! endpoint; readiness, role and allocatable CPU for topology-aware hints), and
//! [`ZoneCapacity`]: each zone's share of the cluster's allocatable CPU, as
//! upstream's topology cache (`topologycache.SetNodes`) derives it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::LABEL_TOPOLOGY_ZONE;

/// Role labels whose Nodes upstream leaves out of the zone shares.
const EXCLUDED_ROLE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

const NANOS_PER_MILLI: i128 = 1_000_000;

/// Compact projection of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The `topology.kubernetes.io/zone` label as set ("" stays "").
    pub zone: Option<String>,
    /// The first `Ready` condition has status "True".
    pub ready: bool,
    /// Carries a control-plane or master role label.
    pub excluded_from_zone_shares: bool,
    /// `status.allocatable.cpu` in nanocores, rounded up; 0 when absent or
    /// unreadable.
    pub allocatable_cpu_nanos: i128,
}

impl NodeInfo {
    /// Projects a Node; `None` without a name.
    pub fn from_node(node: &Node) -> Option<NodeInfo> {
        let labels = node.metadata.labels.as_ref();
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        Some(NodeInfo {
            name: node.metadata.name.clone()?,
            zone: labels.and_then(|l| l.get(LABEL_TOPOLOGY_ZONE)).cloned(),
            ready,
            excluded_from_zone_shares: labels
                .is_some_and(|l| EXCLUDED_ROLE_LABELS.iter().any(|key| l.contains_key(*key))),
            allocatable_cpu_nanos: status
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("cpu"))
                .and_then(|q| quantity_nanos(&q.0))
                .unwrap_or(0),
        })
    }

    /// The zone an endpoint on this Node carries: the label, when not empty.
    pub(super) fn endpoint_zone(&self) -> Option<&str> {
        self.zone.as_deref().filter(|z| !z.is_empty())
    }
}

/// Each zone's share of the allocatable CPU of the ready, non-control-plane
/// Nodes; `None` when upstream would call the Node information insufficient.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ZoneCapacity {
    pub shares: Option<BTreeMap<String, f64>>,
}

impl ZoneCapacity {
    /// Upstream's SetNodes: Nodes with a control-plane role and Nodes not ready
    /// are skipped; one counted Node without a zone or without allocatable CPU
    /// makes the whole information insufficient, and so do fewer than two zones.
    /// A share is the zone's CPU over the total, both in whole millicores
    /// rounded up (Quantity.MilliValue).
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a NodeInfo>) -> ZoneCapacity {
        let mut by_zone: BTreeMap<&str, i128> = BTreeMap::new();
        let mut total: i128 = 0;
        for node in nodes {
            if node.excluded_from_zone_shares || !node.ready {
                continue;
            }
            let Some(zone) = node.endpoint_zone() else {
                return ZoneCapacity::default();
            };
            if node.allocatable_cpu_nanos == 0 {
                return ZoneCapacity::default();
            }
            total += node.allocatable_cpu_nanos;
            *by_zone.entry(zone).or_default() += node.allocatable_cpu_nanos;
        }
        if total == 0 || by_zone.len() < 2 {
            return ZoneCapacity::default();
        }
        let total_millis = millis_rounded_up(total) as f64;
        let shares = by_zone
            .into_iter()
            .map(|(zone, nanos)| {
                (
                    zone.to_string(),
                    millis_rounded_up(nanos) as f64 / total_millis,
                )
            })
            .collect();
        ZoneCapacity {
            shares: Some(shares),
        }
    }
}

fn millis_rounded_up(nanos: i128) -> i128 {
    nanos.div_euclid(NANOS_PER_MILLI) + i128::from(nanos.rem_euclid(NANOS_PER_MILLI) != 0)
}

/// A resource quantity (`1500m`, `4`, `2.5`, `1Ki`, `1e3`) in nano units,
/// rounded up; `None` when the text is not a quantity. The API server only
/// stores valid quantities; values finer than a nano unit (beyond any real
/// CPU figure) are rounded up to one.
fn quantity_nanos(text: &str) -> Option<i128> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // value = digits × 10^exponent10 × 2^exponent2
    let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
    let mut exponent10 = -i32::try_from(fraction.len()).ok()?;
    let mut exponent2 = 0u32;
    match suffix {
        "n" => exponent10 -= 9,
        "u" => exponent10 -= 6,
        "m" => exponent10 -= 3,
        "" => {}
        "k" => exponent10 += 3,
        "M" => exponent10 += 6,
        "G" => exponent10 += 9,
        "T" => exponent10 += 12,
        "P" => exponent10 += 15,
        "E" => exponent10 += 18,
        "Ki" => exponent2 = 10,
        "Mi" => exponent2 = 20,
        "Gi" => exponent2 = 30,
        "Ti" => exponent2 = 40,
        "Pi" => exponent2 = 50,
        "Ei" => exponent2 = 60,
        other => {
            let exponent = other.strip_prefix(['e', 'E'])?;
            exponent10 += exponent.parse::<i32>().ok()?;
        }
    }
    // To nano units.
    exponent10 += 9;
    let scaled = digits.checked_mul(1i128.checked_shl(exponent2)?)?;
    let magnitude = if exponent10 >= 0 {
        scaled.checked_mul(10i128.checked_pow(u32::try_from(exponent10).ok()?)?)?
    } else {
        let divisor = 10i128
            .checked_pow(exponent10.unsigned_abs())
            .unwrap_or(i128::MAX);
        scaled / divisor + i128::from(scaled % divisor != 0)
    };
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    #[test]
    fn quantities_in_nano_units() {
        let cases = [
            ("1", Some(1_000_000_000)),
            ("1500m", Some(1_500_000_000)),
            ("2.5", Some(2_500_000_000)),
            ("0.1", Some(100_000_000)),
            ("100n", Some(100)),
            ("1u", Some(1_000)),
            ("1k", Some(1_000_000_000_000)),
            ("1Ki", Some(1_024_000_000_000)),
            ("1e3", Some(1_000_000_000_000)),
            ("5E-3", Some(5_000_000)),
            ("1e-12", Some(1)),
            ("+2", Some(2_000_000_000)),
            ("-1m", Some(-1_000_000)),
            ("0", Some(0)),
            ("", None),
            ("m", None),
            ("1x", None),
            ("1.2.3", None),
        ];
        for (text, nanos) in cases {
            assert_eq!(quantity_nanos(text), nanos, "{text:?}");
        }
    }

    fn node(name: &str, zone: Option<&str>, cpu: Option<&str>, ready: Option<&str>) -> Node {
        let mut labels = BTreeMap::new();
        if let Some(zone) = zone {
            labels.insert(LABEL_TOPOLOGY_ZONE.to_string(), zone.to_string());
        }
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: cpu.map(|c| BTreeMap::from([("cpu".to_string(), Quantity(c.into()))])),
                conditions: ready.map(|status| {
                    vec![
                        NodeCondition {
                            type_: "Ready".into(),
                            status: status.into(),
                            ..NodeCondition::default()
                        },
                        NodeCondition {
                            type_: "Ready".into(),
                            status: "True".into(),
                            ..NodeCondition::default()
                        },
                    ]
                }),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn projection_keeps_zone_readiness_role_and_cpu() {
        let mut control_plane = node("cp", Some(""), Some("2"), Some("True"));
        if let Some(labels) = control_plane.metadata.labels.as_mut() {
            labels.insert(
                "node-role.kubernetes.io/control-plane".into(),
                String::new(),
            );
        }
        let cases = [
            (
                node("a", Some("z1"), Some("1500m"), Some("True")),
                NodeInfo {
                    name: "a".into(),
                    zone: Some("z1".into()),
                    ready: true,
                    excluded_from_zone_shares: false,
                    allocatable_cpu_nanos: 1_500_000_000,
                },
            ),
            (
                // The first Ready condition decides, like upstream's isNodeReady.
                node("b", None, None, Some("False")),
                NodeInfo {
                    name: "b".into(),
                    ..NodeInfo::default()
                },
            ),
            (
                control_plane,
                NodeInfo {
                    name: "cp".into(),
                    zone: Some(String::new()),
                    ready: true,
                    excluded_from_zone_shares: true,
                    allocatable_cpu_nanos: 2_000_000_000,
                },
            ),
        ];
        for (node, expected) in cases {
            assert_eq!(NodeInfo::from_node(&node), Some(expected));
        }
        let mut unnamed = node("x", None, None, None);
        unnamed.metadata.name = None;
        assert_eq!(NodeInfo::from_node(&unnamed), None);
        assert_eq!(NodeInfo::default().endpoint_zone(), None);
        let empty_zone = NodeInfo {
            zone: Some(String::new()),
            ..NodeInfo::default()
        };
        assert_eq!(
            empty_zone.endpoint_zone(),
            None,
            "an empty zone label is no zone"
        );
    }

    fn info(zone: &str, millis: i128, ready: bool, excluded: bool) -> NodeInfo {
        NodeInfo {
            name: format!("{zone}-{millis}"),
            zone: (!zone.is_empty()).then(|| zone.to_string()),
            ready,
            excluded_from_zone_shares: excluded,
            allocatable_cpu_nanos: millis * NANOS_PER_MILLI,
        }
    }

    /// Upstream's own expectations (topologycache_test.go TestSetNodes).
    #[test]
    fn zone_shares_match_upstream_cases() {
        type Case = (
            &'static str,
            Vec<NodeInfo>,
            Option<Vec<(&'static str, f64)>>,
        );
        let cases: Vec<Case> = vec![
            ("empty", vec![], None),
            ("single node", vec![info("zone-a", 1000, true, false)], None),
            (
                "single zone",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-a", 1000, true, false),
                ],
                None,
            ),
            (
                "2 zones",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 1000, true, false),
                ],
                Some(vec![("zone-a", 0.5), ("zone-b", 0.5)]),
            ),
            (
                "2 zones, unready node in 1, ready node in 1",
                vec![
                    info("zone-a", 1000, false, false),
                    info("zone-b", 1000, true, false),
                ],
                None,
            ),
            (
                "2 zones, control plane node in 1, ready node in 1",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 1000, true, true),
                ],
                None,
            ),
            (
                "2 zones, unready node in 1, ready node in 2",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 1000, true, false),
                    info("zone-b", 1000, false, false),
                ],
                Some(vec![("zone-a", 0.5), ("zone-b", 0.5)]),
            ),
            (
                "3 zones, 4 nodes in 1, 2 nodes in 1, 1 node in 1",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-a", 1000, true, false),
                    info("zone-a", 1000, true, false),
                    info("zone-a", 2000, true, false),
                    info("zone-b", 3000, true, false),
                    info("zone-b", 1500, true, false),
                    info("zone-c", 500, true, false),
                ],
                Some(vec![("zone-a", 0.5), ("zone-b", 0.45), ("zone-c", 0.05)]),
            ),
            (
                "a ready node without zone spoils everything",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 1000, true, false),
                    info("", 1000, true, false),
                ],
                None,
            ),
            (
                "a ready node without CPU spoils everything",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 1000, true, false),
                    info("zone-b", 0, true, false),
                ],
                None,
            ),
            (
                "a node without zone is fine when not ready",
                vec![
                    info("zone-a", 1000, true, false),
                    info("zone-b", 3000, true, false),
                    info("", 0, false, false),
                ],
                Some(vec![("zone-a", 0.25), ("zone-b", 0.75)]),
            ),
        ];
        for (case, nodes, expected) in cases {
            let expected = expected.map(|pairs| {
                pairs
                    .into_iter()
                    .map(|(z, r)| (z.to_string(), r))
                    .collect::<BTreeMap<_, _>>()
            });
            assert_eq!(ZoneCapacity::from_nodes(&nodes).shares, expected, "{case}");
        }
    }

    #[test]
    fn shares_use_whole_millicores_rounded_up() {
        let a = NodeInfo {
            allocatable_cpu_nanos: 1,
            ..info("zone-a", 0, true, false)
        };
        let b = info("zone-b", 1, true, false);
        let shares = ZoneCapacity::from_nodes([&a, &b])
            .shares
            .unwrap_or_default();
        // 1 nanocore counts as 1 millicore; the total, 1,000,001 nanocores, as 2.
        assert_eq!(shares.get("zone-a"), Some(&0.5));
        assert_eq!(shares.get("zone-b"), Some(&0.5));
    }
}
