//! Topology-aware hints (the topology-mode annotation), against upstream's
//! own expectations re-expressed: topologycache_test.go TestAddHints and
//! TestSetNodes' shares, utils_test.go Test_getGivingAndReceivingZones and
//! Test_getHintsByZone (k8s.io/endpointslice v0.36.3).

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForZone};

use super::hints::{
    Allocation, HintLists, OVERLOAD_THRESHOLD, allocations, apply_hints, giving_and_receiving,
    hints_by_zone,
};
use super::*;

fn endpoint(ip: &str, zone: Option<&str>, ready: Option<bool>) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_string()],
        zone: zone.map(str::to_string),
        conditions: Some(k8s_openapi::api::discovery::v1::EndpointConditions {
            ready,
            ..Default::default()
        }),
        ..Endpoint::default()
    }
}

fn hinted(mut e: Endpoint, zone: &str) -> Endpoint {
    e.hints = Some(zone_hint(zone));
    e
}

fn zone_hint(zone: &str) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone { name: zone.into() }]),
        for_nodes: None,
    }
}

fn slice_of(endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ..EndpointSlice::default()
    }
}

fn shares(pairs: &[(&str, f64)]) -> ZoneCapacity {
    ZoneCapacity {
        shares: Some(pairs.iter().map(|(z, r)| (z.to_string(), *r)).collect()),
    }
}

/// The zone each endpoint is hinted for, in slice order.
pub(super) fn hints_of(slices: &[EndpointSlice]) -> Vec<Option<String>> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            e.hints
                .as_ref()
                .and_then(|h| h.for_zones.as_ref())
                .and_then(|z| z.first())
                .map(|z| z.name.clone())
        })
        .collect()
}

#[test]
fn allowance_is_five_sixths() {
    // Go folds 1/(1+0.2) exactly to 5/6 before rounding; the run-time f64
    // expression lands on the same double.
    assert_eq!(1.0 / (1.0 + OVERLOAD_THRESHOLD), 5.0 / 6.0);
}

/// Upstream TestAddHints, re-expressed: (case, shares, slices to create,
/// slices to update, expected hints in order, expected outcome).
#[test]
fn auto_hints_match_upstream_cases() {
    type Outcome = Result<BTreeMap<String, usize>, AutoHintsDisabled>;
    let counts = |pairs: &[(&str, usize)]| -> Outcome {
        Ok(pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect())
    };
    let ready = Some(true);
    type Case = (
        &'static str,
        ZoneCapacity,
        Vec<EndpointSlice>,
        Vec<EndpointSlice>,
        Vec<Option<&'static str>>,
        Outcome,
    );
    let cases: Vec<Case> = vec![
        (
            "empty",
            ZoneCapacity::default(),
            vec![],
            vec![],
            vec![],
            Err(AutoHintsDisabled::InsufficientNodeInfo),
        ),
        (
            "slice to create, no zone ratios",
            ZoneCapacity::default(),
            vec![slice_of(vec![endpoint("10.1.2.3", Some("zone-a"), ready)])],
            vec![],
            vec![None],
            Err(AutoHintsDisabled::InsufficientNodeInfo),
        ),
        (
            "2 endpoints, zone ratios require 3",
            shares(&[("zone-a", 0.3), ("zone-b", 0.4), ("zone-c", 0.3)]),
            vec![slice_of(vec![
                endpoint("10.1.2.3", Some("zone-a"), ready),
                endpoint("10.1.2.4", Some("zone-b"), ready),
            ])],
            vec![],
            vec![None, None],
            Err(AutoHintsDisabled::TooFewEndpoints {
                endpoints: 2,
                zones: 3,
            }),
        ),
        (
            "2 endpoints, zone ratios only require 2",
            shares(&[("zone-a", 0.45), ("zone-b", 0.55)]),
            vec![slice_of(vec![
                endpoint("10.1.2.3", Some("zone-a"), ready),
                endpoint("10.1.2.4", Some("zone-b"), ready),
            ])],
            vec![],
            vec![Some("zone-a"), Some("zone-b")],
            counts(&[("zone-a", 1), ("zone-b", 1)]),
        ),
        (
            "2 ready, 1 unready, 1 unknown endpoints",
            shares(&[("zone-a", 0.45), ("zone-b", 0.55)]),
            vec![slice_of(vec![
                endpoint("10.1.2.3", Some("zone-a"), ready),
                endpoint("10.1.2.4", Some("zone-b"), ready),
                endpoint("10.1.2.5", Some("zone-b"), Some(false)),
                endpoint("10.1.2.6", Some("zone-b"), None),
            ])],
            vec![],
            vec![Some("zone-a"), Some("zone-b"), None, None],
            counts(&[("zone-a", 1), ("zone-b", 1)]),
        ),
        (
            "slices to create and update within 3 zone threshold",
            shares(&[("zone-a", 0.35), ("zone-b", 0.35), ("zone-c", 0.30)]),
            vec![
                slice_of(vec![
                    endpoint("10.1.2.3", Some("zone-a"), ready),
                    endpoint("10.1.2.4", Some("zone-b"), ready),
                ]),
                slice_of(vec![
                    endpoint("10.1.3.3", Some("zone-c"), ready),
                    endpoint("10.1.3.4", Some("zone-c"), ready),
                    endpoint("10.1.3.4", Some("zone-a"), ready),
                ]),
            ],
            vec![
                slice_of(vec![
                    endpoint("10.2.2.3", Some("zone-a"), ready),
                    endpoint("10.2.2.4", Some("zone-a"), ready),
                ]),
                slice_of(vec![
                    endpoint("10.2.3.3", Some("zone-b"), ready),
                    endpoint("10.2.3.4", Some("zone-c"), ready),
                    endpoint("10.2.3.4", Some("zone-a"), ready),
                ]),
            ],
            // The first zone-a endpoint met is the one given to zone-b.
            vec![
                Some("zone-b"),
                Some("zone-b"),
                Some("zone-c"),
                Some("zone-c"),
                Some("zone-a"),
                Some("zone-a"),
                Some("zone-a"),
                Some("zone-b"),
                Some("zone-c"),
                Some("zone-a"),
            ],
            counts(&[("zone-a", 4), ("zone-b", 3), ("zone-c", 3)]),
        ),
        (
            "a ready endpoint without zone disables hints",
            shares(&[("zone-a", 0.5), ("zone-b", 0.5)]),
            vec![slice_of(vec![
                endpoint("10.1.2.3", Some("zone-a"), ready),
                endpoint("10.1.2.4", Some("zone-b"), ready),
                endpoint("10.1.2.5", Some("zone-a"), ready),
                endpoint("10.1.2.6", None, ready),
            ])],
            vec![],
            vec![None, None, None, None],
            Err(AutoHintsDisabled::EndpointWithoutZone),
        ),
        (
            "minimums over the total",
            shares(&[("zone-a", 0.1), ("zone-b", 0.1), ("zone-c", 0.8)]),
            vec![slice_of(vec![
                endpoint("10.1.2.3", Some("zone-a"), ready),
                endpoint("10.1.2.4", Some("zone-b"), ready),
                endpoint("10.1.2.5", Some("zone-c"), ready),
            ])],
            vec![],
            vec![None, None, None],
            Err(AutoHintsDisabled::MinimumsExceedEndpoints {
                endpoints: 3,
                zones: 3,
            }),
        ),
    ];
    for (case, zones, mut creates, mut updates, expected_hints, expected) in cases {
        let mut unchanged = Vec::new();
        let lists = HintLists {
            creates: &mut creates,
            updates: &mut updates,
            unchanged: &mut unchanged,
        };
        let outcome = apply_hints(HintMode::Auto, &zones, AddressType::IPv4, lists);
        assert_eq!(outcome.map(|o| o.result), Some(expected), "{case}");
        let all: Vec<EndpointSlice> = creates.into_iter().chain(updates).collect();
        let expected_hints: Vec<Option<String>> = expected_hints
            .into_iter()
            .map(|h| h.map(str::to_string))
            .collect();
        assert_eq!(hints_of(&all), expected_hints, "{case}");
    }
}

/// Upstream Test_getGivingAndReceivingZones.
#[test]
fn giving_and_receiving_match_upstream_cases() {
    let alloc = |pairs: &[(&str, f64)]| -> BTreeMap<String, Allocation> {
        pairs
            .iter()
            .map(|(z, d)| {
                (
                    z.to_string(),
                    Allocation {
                        minimum: 0,
                        maximum: 0,
                        desired: *d,
                    },
                )
            })
            .collect()
    };
    let ints = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect()
    };
    let cases = [
        ("empty", alloc(&[]), ints(&[]), ints(&[]), ints(&[])),
        (
            "no need for rebalancing",
            alloc(&[("zone-a", 1.2), ("zone-b", 1.1), ("zone-c", 1.0)]),
            ints(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
            ints(&[]),
            ints(&[]),
        ),
        (
            "same zone preferred even when one more would balance slightly better",
            alloc(&[("zone-a", 5.1), ("zone-b", 5.1), ("zone-c", 5.8)]),
            ints(&[("zone-a", 16)]),
            ints(&[("zone-a", 10)]),
            ints(&[("zone-b", 5), ("zone-c", 5)]),
        ),
        (
            "when 2 zones need < 1 endpoint, the neediest gets it",
            alloc(&[("zone-a", 5.0), ("zone-b", 5.6), ("zone-c", 5.4)]),
            ints(&[("zone-a", 16)]),
            ints(&[("zone-a", 11)]),
            ints(&[("zone-b", 6), ("zone-c", 5)]),
        ),
        (
            "when 2 zones have extra, the one with most gives",
            alloc(&[("zone-a", 5.0), ("zone-b", 5.6), ("zone-c", 5.4)]),
            ints(&[("zone-b", 8), ("zone-c", 8)]),
            ints(&[("zone-b", 2), ("zone-c", 3)]),
            ints(&[("zone-a", 5)]),
        ),
        (
            "more allocated than allocations",
            alloc(&[("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)]),
            ints(&[("zone-a", 6), ("zone-b", 6), ("zone-c", 6)]),
            ints(&[]),
            ints(&[]),
        ),
        (
            "negative allocations",
            alloc(&[("zone-a", -5.0), ("zone-b", -5.0), ("zone-c", -5.0)]),
            ints(&[("zone-a", 6), ("zone-b", 6), ("zone-c", 6)]),
            ints(&[]),
            ints(&[]),
        ),
        (
            "negative allocated",
            alloc(&[("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)]),
            ints(&[("zone-a", -4), ("zone-b", -3), ("zone-c", -2)]),
            ints(&[]),
            ints(&[]),
        ),
        (
            "negative for 1 zone",
            alloc(&[("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)]),
            ints(&[("zone-a", -40), ("zone-b", 20), ("zone-c", 20)]),
            ints(&[("zone-b", 15), ("zone-c", 15)]),
            ints(&[("zone-a", 30)]),
        ),
    ];
    for (case, allocations, allocated, giving, receiving) in cases {
        assert_eq!(
            giving_and_receiving(&allocations, &allocated),
            (giving, receiving),
            "{case}"
        );
    }
}

/// Upstream Test_getHintsByZone.
#[test]
fn hints_by_zone_match_upstream_cases() {
    let maximum = |zones: &[&str], max: i64| -> BTreeMap<String, Allocation> {
        zones
            .iter()
            .map(|z| {
                (
                    z.to_string(),
                    Allocation {
                        minimum: 0,
                        maximum: max,
                        desired: 0.0,
                    },
                )
            })
            .collect()
    };
    let ints = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect()
    };
    let ready = Some(true);
    let mut no_zones = endpoint("1", Some("zone-a"), ready);
    no_zones.hints = Some(EndpointHints {
        for_zones: Some(vec![]),
        for_nodes: None,
    });
    let cases = [
        (
            "empty",
            slice_of(vec![]),
            maximum(&[], 0),
            ints(&[]),
            Some(ints(&[])),
        ),
        (
            "single zone hint",
            slice_of(vec![hinted(endpoint("1", Some("zone-a"), ready), "zone-a")]),
            maximum(&["zone-a"], 3),
            ints(&[("zone-a", 1)]),
            Some(ints(&[("zone-a", 1)])),
        ),
        (
            "unready and unknown endpoints do not count",
            slice_of(vec![
                hinted(endpoint("1", Some("zone-a"), ready), "zone-a"),
                hinted(endpoint("2", Some("zone-a"), Some(false)), "zone-a"),
                hinted(endpoint("3", Some("zone-a"), None), "zone-a"),
            ]),
            maximum(&["zone-a"], 3),
            ints(&[("zone-a", 1)]),
            Some(ints(&[("zone-a", 1)])),
        ),
        (
            "multiple zone hints",
            slice_of(vec![
                hinted(endpoint("1", Some("zone-a"), ready), "zone-a"),
                hinted(endpoint("2", Some("zone-a"), ready), "zone-b"),
                hinted(endpoint("3", Some("zone-b"), ready), "zone-b"),
            ]),
            maximum(&["zone-a", "zone-b", "zone-c"], 3),
            ints(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
            Some(ints(&[("zone-a", 1), ("zone-b", 2)])),
        ),
        (
            "a zone that no longer needs any",
            slice_of(vec![hinted(
                endpoint("1", Some("zone-a"), ready),
                "zone-non-existent",
            )]),
            maximum(&["zone-a"], 3),
            ints(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
            None,
        ),
        (
            "an endpoint without hints",
            slice_of(vec![endpoint("1", Some("zone-a"), ready)]),
            maximum(&["zone-a"], 3),
            ints(&[]),
            None,
        ),
        (
            "an endpoint with empty hints",
            slice_of(vec![no_zones]),
            maximum(&["zone-a"], 3),
            ints(&[]),
            None,
        ),
        (
            "hints that would pass a zone's maximum",
            slice_of(vec![
                hinted(endpoint("1", Some("zone-a"), ready), "zone-a"),
                hinted(endpoint("2", Some("zone-a"), ready), "zone-a"),
            ]),
            maximum(&["zone-a"], 2),
            ints(&[("zone-a", 1)]),
            None,
        ),
    ];
    for (case, slice, allocations, allocated, expected) in cases {
        assert_eq!(
            hints_by_zone(&slice, &allocated, &allocations),
            expected,
            "{case}"
        );
    }
}

#[test]
fn allocation_bounds() {
    let zones = shares(&[("zone-a", 0.5), ("zone-b", 0.25), ("zone-c", 0.25)]);
    let got = allocations(&zones, 12).unwrap_or_default();
    // desired 6/3/3; minimum ceil(desired × 5/6) = 5/3/3; maximum adds the
    // 1 endpoint left over after the minimums.
    let expected: BTreeMap<String, Allocation> = [
        (
            "zone-a",
            Allocation {
                minimum: 5,
                maximum: 6,
                desired: 6.0,
            },
        ),
        (
            "zone-b",
            Allocation {
                minimum: 3,
                maximum: 4,
                desired: 3.0,
            },
        ),
        (
            "zone-c",
            Allocation {
                minimum: 3,
                maximum: 4,
                desired: 3.0,
            },
        ),
    ]
    .into_iter()
    .map(|(z, a)| (z.to_string(), a))
    .collect();
    assert_eq!(got, expected);
    assert_eq!(
        allocations(&zones, 2),
        Err(AutoHintsDisabled::TooFewEndpoints {
            endpoints: 2,
            zones: 3
        })
    );
}
