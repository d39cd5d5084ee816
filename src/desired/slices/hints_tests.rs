//! Hints in plans: trafficDistribution (PreferClose, PreferSameZone,
//! PreferSameNode), switching between hint rules, and the topology-mode
//! annotation end to end (upstream `trafficdist` and `topologycache`).

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointSlice, ForNode};

use super::auto_hints_tests::hints_of;
use super::identity::conditions;
use super::testkit::{apply, desire, nodes, plan, pods, service_with, web_service};
use super::*;

/// (zones, nodes) hinted per endpoint, in slice order; `None` without hints.
type HintNames = Option<(Vec<String>, Vec<String>)>;

fn hint_names(slices: &[EndpointSlice]) -> Vec<HintNames> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            e.hints.as_ref().map(|h| {
                (
                    h.for_zones
                        .iter()
                        .flatten()
                        .map(|z| z.name.clone())
                        .collect(),
                    h.for_nodes
                        .iter()
                        .flatten()
                        .map(|n| n.name.clone())
                        .collect(),
                )
            })
        })
        .collect()
}

#[test]
fn traffic_distribution_hints() {
    let mut all = pods(4);
    all[3].ready = false;
    all[2].node_name = Some("unknown".into());
    let names = |zone: &str, node: Option<&str>| -> HintNames {
        Some((
            vec![zone.to_string()],
            node.map(str::to_string).into_iter().collect(),
        ))
    };
    // pod-2 is on an unknown node (left out); pod-3 is not ready (no hints).
    let cases = [
        (
            "PreferClose",
            vec![names("zone-a", None), names("zone-b", None), None],
        ),
        (
            "PreferSameZone",
            vec![names("zone-a", None), names("zone-b", None), None],
        ),
        (
            "PreferSameNode",
            vec![
                names("zone-a", Some("node-0")),
                names("zone-b", Some("node-1")),
                None,
            ],
        ),
        ("", vec![None, None, None]),
    ];
    for (distribution, expected) in cases {
        let svc = service_with(&[], (!distribution.is_empty()).then_some(distribution));
        let plan = plan(&desire(&svc, &all), &[]);
        assert_eq!(hint_names(&plan.creates), expected, "{distribution}");
    }
}

#[test]
fn an_endpoint_without_zone_gets_only_a_node_hint() {
    let mut lookup = nodes();
    if let Some(n) = lookup.get_mut("node-0") {
        n.zone = None;
    }
    let svc = service_with(&[], Some("PreferSameNode"));
    let packed: Vec<crate::desired::PodInfo> = pods(1)
        .iter()
        .map(crate::desired::PodFields::pack)
        .collect();
    let refs: Vec<&crate::desired::PodInfo> = packed.iter().collect();
    let desired = desired_slices(
        &svc,
        &refs,
        &lookup,
        super::testkit::OURS,
        crate::desired::testkit::RULES_1_36,
    );
    let plan = plan(&desired, &[]);
    let hints = plan.creates[0]
        .endpoints
        .as_ref()
        .and_then(|e| e[0].hints.clone());
    assert_eq!(
        hints,
        Some(EndpointHints {
            for_zones: None,
            for_nodes: Some(vec![ForNode {
                name: "node-0".into()
            }]),
        })
    );
}

#[test]
fn hints_follow_mode_changes_with_one_update_per_slice() {
    let all = pods(150);
    let none = desire(&web_service(), &all);
    let close = desire(&service_with(&[], Some("PreferClose")), &all);
    let node = desire(&service_with(&[], Some("PreferSameNode")), &all);
    let plain = apply(&[], &plan(&none, &[]));
    assert!(hints_of(&plain).iter().all(Option::is_none));
    // Adding hints rewrites both slices; then nothing more.
    let first = plan(&close, &plain);
    assert_eq!(
        (
            first.creates.len(),
            first.updates.len(),
            first.deletes.len()
        ),
        (0, 2, 0)
    );
    let hinted = apply(&plain, &first);
    assert!(plan(&close, &hinted).is_empty());
    assert!(hints_of(&hinted).iter().all(Option::is_some));
    // PreferSameNode wants node hints too.
    let to_node = plan(&node, &hinted);
    assert_eq!(to_node.updates.len(), 2);
    let node_hinted = apply(&hinted, &to_node);
    assert!(plan(&node, &node_hinted).is_empty());
    // Back to PreferClose: the node hints are unwanted.
    assert_eq!(plan(&close, &node_hinted).updates.len(), 2);
    // And no trafficDistribution: every hint goes.
    let cleared = apply(&hinted, &plan(&none, &hinted));
    assert!(hints_of(&cleared).iter().all(Option::is_none));
    assert!(plan(&none, &cleared).is_empty());
}

#[test]
fn auto_mode_end_to_end() {
    let auto = service_with(
        &[(ANNOTATION_TOPOLOGY_MODE, "Auto")],
        Some("PreferSameNode"),
    );
    // 3 equal zones, pods 0..6 spread evenly: everyone keeps its own zone.
    let even = desire(&auto, &pods(6));
    let first = plan(&even, &[]);
    let expected: BTreeMap<String, usize> = [("zone-a", 2), ("zone-b", 2), ("zone-c", 2)]
        .into_iter()
        .map(|(z, n)| (z.to_string(), n))
        .collect();
    assert_eq!(first.auto_hints[0].result, Ok(expected));
    let stored = apply(&[], &first);
    assert!(plan(&even, &stored).is_empty(), "stable");
    for e in stored.iter().flat_map(|s| s.endpoints.iter().flatten()) {
        assert_eq!(
            e.hints
                .as_ref()
                .and_then(|h| h.for_zones.clone())
                .map(|z| z[0].name.clone()),
            e.zone
        );
        assert_eq!(
            e.hints.as_ref().and_then(|h| h.for_nodes.clone()),
            None,
            "Auto ignores PreferSameNode"
        );
    }

    // Nine pods in zone-a, three elsewhere: zone-a gives 2 to each.
    let mut skewed = pods(12);
    for (i, pod) in skewed.iter_mut().enumerate() {
        pod.node_name = Some(
            if i < 9 {
                "node-0"
            } else {
                ["node-1", "node-2", "node-1"][i - 9]
            }
            .into(),
        );
    }
    let desired = desire(&auto, &skewed);
    let first = plan(&desired, &[]);
    let per_zone = first.auto_hints[0].result.clone().unwrap_or_default();
    assert_eq!(per_zone.values().sum::<usize>(), 12);
    for (zone, count) in &per_zone {
        assert_eq!(*count, 4, "{zone}");
    }
    assert!(plan(&desired, &apply(&[], &first)).is_empty(), "stable");

    // Insufficient Nodes: no hints, and the reason.
    let zones = ZoneCapacity::default();
    let bare = plan_slices(&desired, &[], &zones, &PlanOptions::default());
    assert_eq!(
        bare.auto_hints[0].result,
        Err(AutoHintsDisabled::InsufficientNodeInfo)
    );
    assert!(hints_of(&bare.creates).iter().all(Option::is_none));

    // Hints that still fit the allocations are kept rather than recomputed:
    // swapping two endpoints' hints leaves every zone's count as it was.
    let mut stored = apply(&[], &plan(&desired, &[]));
    let endpoints = stored[0].endpoints.get_or_insert_with(Vec::new);
    let differing = endpoints
        .iter()
        .position(|e| e.hints != endpoints[0].hints)
        .unwrap_or(0);
    assert!(differing > 0, "zones differ among the hints");
    let first_hints = endpoints[0].hints.clone();
    endpoints[0].hints = endpoints[differing].hints.clone();
    endpoints[differing].hints = first_hints;
    assert!(plan(&desired, &stored).is_empty());
}

#[test]
fn leftover_hints_on_an_unchanged_slice_are_removed() {
    let all = pods(3);
    let close = desire(&service_with(&[], Some("PreferClose")), &all);
    let hinted = apply(&[], &plan(&close, &[]));
    let none = desire(&web_service(), &all);
    let cleared = plan(&none, &hinted);
    assert_eq!(cleared.updates.len(), 1);
    // Only hints were touched.
    let endpoints = cleared.updates[0].endpoints.clone().unwrap_or_default();
    assert_eq!(endpoints.len(), 3);
    assert!(
        endpoints
            .iter()
            .all(|e| e.hints.is_none() && e.conditions == Some(conditions(true, true, false)))
    );
}
