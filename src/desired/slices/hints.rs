//! Topology hints on the slices a plan writes (upstream `trafficdist`
//! ReconcileHints, `topologycache` AddHints and RemoveHintsFromSlices).
//!
//! Hints are decided after the endpoints are laid out, over three lists: the
//! slices to create, the slices to update, and the existing slices left
//! unchanged so far. An unchanged slice whose hints are wrong moves to the
//! updates; desired endpoints start without hints.
//!
//! Where upstream iterates a Go map (the zones that receive redistributed
//! endpoints; the zone with the most to give or receive, on a tie) the order
//! here is the zones' names.

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForNode, ForZone};

use super::{
    AddressType, AutoHintsDisabled, AutoHintsOutcome, HintMode, ZoneCapacity, endpoint_ready,
};

/// The largest overload any endpoint should take: a zone's minimum is its
/// share of the endpoints divided by 1.2.
pub(super) const OVERLOAD_THRESHOLD: f64 = 0.2;

/// The slices a plan is deciding about, for one address type.
pub(super) struct HintLists<'a, 'e> {
    pub creates: &'a mut Vec<EndpointSlice>,
    pub updates: &'a mut Vec<EndpointSlice>,
    pub unchanged: &'a mut Vec<&'e EndpointSlice>,
}

/// Sets the hints `mode` asks for; for `Auto`, says what became of them.
pub(super) fn apply_hints(
    mode: HintMode,
    zones: &ZoneCapacity,
    address_type: AddressType,
    lists: HintLists<'_, '_>,
) -> Option<AutoHintsOutcome> {
    match mode {
        HintMode::None => {
            remove_hints(lists);
            None
        }
        HintMode::SameZone => {
            prefer_close(lists, false);
            None
        }
        HintMode::SameZoneAndNode => {
            prefer_close(lists, true);
            None
        }
        HintMode::Auto => Some(AutoHintsOutcome {
            address_type,
            result: auto_hints(zones, lists),
        }),
    }
}

/// Upstream's RemoveHintsFromSlices: no endpoint keeps a hint; unchanged slices
/// with any hint are rewritten.
fn remove_hints(lists: HintLists<'_, '_>) {
    move_unchanged(lists.unchanged, lists.updates, |slice| {
        slice.endpoints.iter().flatten().any(|e| e.hints.is_some())
    });
    for slice in lists.creates.iter_mut().chain(lists.updates.iter_mut()) {
        for endpoint in slice.endpoints.iter_mut().flatten() {
            endpoint.hints = None;
        }
    }
}

/// Moves the unchanged slices `needs_update` picks to the updates, as copies.
fn move_unchanged(
    unchanged: &mut Vec<&EndpointSlice>,
    updates: &mut Vec<EndpointSlice>,
    needs_update: impl Fn(&EndpointSlice) -> bool,
) {
    unchanged.retain(|slice| {
        let moving = needs_update(slice);
        if moving {
            updates.push((*slice).clone());
        }
        !moving
    });
}

/// The hints a ready endpoint gets under PreferClose / PreferSameZone
/// (`for_node` false) or PreferSameNode (`for_node` true): its own zone, and its
/// own node for PreferSameNode; none when it has neither.
fn close_hints(zone: Option<&str>, node: Option<&str>, for_node: bool) -> Option<EndpointHints> {
    let for_zones = zone.map(|z| {
        vec![ForZone {
            name: z.to_string(),
        }]
    });
    let for_nodes = node.filter(|_| for_node).map(|n| {
        vec![ForNode {
            name: n.to_string(),
        }]
    });
    (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
        for_zones,
        for_nodes,
    })
}

/// Upstream's trafficdist preferCloseHeuristic: an unchanged slice is
/// rewritten when a ready endpoint's zone or node hint is missing, wrong or
/// unwanted; then every ready endpoint of the written slices gets exactly its
/// close hints. Endpoints that are not ready are left as they are.
fn prefer_close(lists: HintLists<'_, '_>, for_node: bool) {
    move_unchanged(lists.unchanged, lists.updates, |slice| {
        slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| endpoint_ready(e))
            .any(|e| {
                let hints = e.hints.as_ref();
                let zones = hints
                    .and_then(|h| h.for_zones.as_deref())
                    .unwrap_or_default();
                let nodes = hints
                    .and_then(|h| h.for_nodes.as_deref())
                    .unwrap_or_default();
                let zone_wrong = match &e.zone {
                    Some(zone) => !(zones.len() == 1 && zones[0].name == *zone),
                    None => !zones.is_empty(),
                };
                let node_wrong = match e.node_name.as_ref().filter(|_| for_node) {
                    Some(node) => !(nodes.len() == 1 && nodes[0].name == *node),
                    None => !nodes.is_empty(),
                };
                zone_wrong || node_wrong
            })
    });
    for slice in lists.creates.iter_mut().chain(lists.updates.iter_mut()) {
        for endpoint in slice.endpoints.iter_mut().flatten() {
            if endpoint_ready(endpoint) {
                endpoint.hints = close_hints(
                    endpoint.zone.as_deref(),
                    endpoint.node_name.as_deref(),
                    for_node,
                );
            }
        }
    }
}

/// A zone's allocation: `minimum` and `maximum` endpoints, `desired` the
/// proportional (fractional) number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Allocation {
    pub minimum: i64,
    pub maximum: i64,
    pub desired: f64,
}

/// Upstream's getAllocations for `endpoints` ready endpoints.
pub(super) fn allocations(
    zones: &ZoneCapacity,
    endpoints: usize,
) -> Result<BTreeMap<String, Allocation>, AutoHintsDisabled> {
    let Some(shares) = zones.shares.as_ref().filter(|s| s.len() >= 2) else {
        return Err(AutoHintsDisabled::InsufficientNodeInfo);
    };
    let zone_count = shares.len();
    if zone_count > endpoints {
        return Err(AutoHintsDisabled::TooFewEndpoints {
            endpoints,
            zones: zone_count,
        });
    }
    let total = i64::try_from(endpoints).unwrap_or(i64::MAX);
    // Upstream writes 1/(1+threshold) as a constant expression, which Go
    // evaluates exactly before rounding once: 5/6.
    let allowance = 1.0 / (1.0 + OVERLOAD_THRESHOLD);
    let mut out = BTreeMap::new();
    let mut minimum_total = 0i64;
    for (zone, share) in shares {
        let desired = share * total as f64;
        let minimum = (desired * allowance).ceil() as i64;
        minimum_total += minimum;
        out.insert(
            zone.clone(),
            Allocation {
                minimum,
                maximum: 0,
                desired: desired.max(minimum as f64),
            },
        );
    }
    if minimum_total > total {
        return Err(AutoHintsDisabled::MinimumsExceedEndpoints {
            endpoints,
            zones: zone_count,
        });
    }
    for allocation in out.values_mut() {
        allocation.maximum = allocation.minimum + total - minimum_total;
    }
    Ok(out)
}

/// Upstream's AddHints for the `Auto` annotation.
fn auto_hints(
    zones: &ZoneCapacity,
    lists: HintLists<'_, '_>,
) -> Result<BTreeMap<String, usize>, AutoHintsDisabled> {
    let ready = |slice: &EndpointSlice| {
        slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| endpoint_ready(e))
            .count()
    };
    let total = lists.creates.iter().map(ready).sum::<usize>()
        + lists.updates.iter().map(ready).sum::<usize>()
        + lists.unchanged.iter().map(|s| ready(s)).sum::<usize>();
    let allocations = match allocations(zones, total) {
        Ok(a) => a,
        Err(reason) => {
            remove_hints(lists);
            return Err(reason);
        }
    };

    // Unchanged slices whose hints still fit keep them; the others are redone.
    let mut allocated: BTreeMap<String, i64> = BTreeMap::new();
    lists.unchanged.retain(
        |slice| match hints_by_zone(slice, &allocated, &allocations) {
            Some(by_zone) => {
                for (zone, count) in by_zone {
                    *allocated.entry(zone).or_default() += count;
                }
                true
            }
            None => {
                lists.updates.push((*slice).clone());
                false
            }
        },
    );

    // Every ready endpoint of the written slices starts with its own zone; one
    // without a zone leaves the whole Service without hints.
    let zone_of = |endpoint: &Endpoint| endpoint.zone.clone().filter(|z| !z.is_empty());
    let without_zone = lists
        .creates
        .iter()
        .chain(lists.updates.iter())
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .any(|e| endpoint_ready(e) && zone_of(e).is_none());
    if without_zone {
        remove_hints(lists);
        return Err(AutoHintsDisabled::EndpointWithoutZone);
    }
    for slice in lists.creates.iter_mut().chain(lists.updates.iter_mut()) {
        for endpoint in slice.endpoints.iter_mut().flatten() {
            let Some(zone) = zone_of(endpoint).filter(|_| endpoint_ready(endpoint)) else {
                continue;
            };
            *allocated.entry(zone.clone()).or_default() += 1;
            endpoint.hints = Some(EndpointHints {
                for_zones: Some(vec![ForZone { name: zone }]),
                for_nodes: None,
            });
        }
    }

    let (giving, receiving) = giving_and_receiving(&allocations, &allocated);
    let moved = redistribute(
        lists.creates.iter_mut().chain(lists.updates.iter_mut()),
        giving,
        receiving,
    );
    for (zone, change) in moved {
        *allocated.entry(zone).or_default() += change;
    }
    if allocated.is_empty() {
        remove_hints(lists);
        return Err(AutoHintsDisabled::NoHintsAllocated);
    }
    Ok(allocated
        .into_iter()
        .map(|(zone, count)| (zone, usize::try_from(count).unwrap_or(0)))
        .collect())
}

/// Upstream's getHintsByZone: the hints an unchanged slice holds per zone, or
/// `None` when the slice must be redone (a ready endpoint without a zone hint,
/// a hint for a zone without allocation, or more hints than a zone's maximum).
pub(super) fn hints_by_zone(
    slice: &EndpointSlice,
    allocated: &BTreeMap<String, i64>,
    allocations: &BTreeMap<String, Allocation>,
) -> Option<BTreeMap<String, i64>> {
    let mut by_zone: BTreeMap<String, i64> = BTreeMap::new();
    for endpoint in slice.endpoints.iter().flatten() {
        if !endpoint_ready(endpoint) {
            continue;
        }
        let zones = endpoint
            .hints
            .as_ref()
            .and_then(|h| h.for_zones.as_deref())
            .unwrap_or_default();
        if zones.is_empty() {
            return None;
        }
        for zone in zones {
            if !allocations.contains_key(&zone.name) {
                return None;
            }
            *by_zone.entry(zone.name.clone()).or_default() += 1;
        }
    }
    for (zone, count) in &by_zone {
        let already = allocated.get(zone).copied().unwrap_or(0);
        let allocation = allocations.get(zone)?;
        if count + already > allocation.maximum {
            return None;
        }
    }
    Some(by_zone)
}

/// Upstream's getGivingAndReceivingZones: how many endpoints each zone gives
/// away and each receives, moving one at a time from the zone with the most
/// surplus to the zone with the largest deficit while both are at least half
/// an endpoint and one of them at least a whole one.
pub(super) fn giving_and_receiving(
    allocations: &BTreeMap<String, Allocation>,
    allocated: &BTreeMap<String, i64>,
) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let mut surplus: BTreeMap<&str, f64> = BTreeMap::new();
    let mut deficit: BTreeMap<&str, f64> = BTreeMap::new();
    for (zone, allocation) in allocations {
        let have = allocated.get(zone).copied().unwrap_or(0) as f64;
        if have > allocation.desired {
            surplus.insert(zone, have - allocation.desired);
        } else if have < allocation.desired {
            deficit.insert(zone, allocation.desired - have);
        }
    }
    let mut giving: BTreeMap<String, i64> = BTreeMap::new();
    let mut receiving: BTreeMap<String, i64> = BTreeMap::new();
    loop {
        let (giver, to_give) = most(&surplus);
        let (receiver, to_receive) = most(&deficit);
        let (Some(giver), Some(receiver)) = (giver, receiver) else {
            break;
        };
        if (to_give < 1.0 && to_receive < 1.0) || to_give < 0.5 || to_receive < 0.5 {
            break;
        }
        *giving.entry(giver.to_string()).or_default() += 1;
        *receiving.entry(receiver.to_string()).or_default() += 1;
        if let Some(v) = surplus.get_mut(giver) {
            *v -= 1.0;
        }
        if let Some(v) = deficit.get_mut(receiver) {
            *v -= 1.0;
        }
    }
    (giving, receiving)
}

/// Upstream's getMost: the zone with the largest positive value (the first on
/// a tie).
fn most<'z>(values: &BTreeMap<&'z str, f64>) -> (Option<&'z str>, f64) {
    let mut best = (None, 0.0);
    for (zone, value) in values {
        if *value > best.1 {
            best = (Some(*zone), *value);
        }
    }
    best
}

/// Upstream's redistributeHints: walks the ready endpoints in order and re-hints
/// those of a giving zone for a receiving one until either side is used up.
/// Returns the change in hints per zone.
fn redistribute<'s>(
    slices: impl Iterator<Item = &'s mut EndpointSlice>,
    mut giving: BTreeMap<String, i64>,
    mut receiving: BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let mut moved: BTreeMap<String, i64> = BTreeMap::new();
    for slice in slices {
        for endpoint in slice.endpoints.iter_mut().flatten() {
            if !endpoint_ready(endpoint) {
                continue;
            }
            if giving.is_empty() || receiving.is_empty() {
                return moved;
            }
            let Some(zone) = endpoint.zone.clone().filter(|z| !z.is_empty()) else {
                continue;
            };
            if giving.get(&zone).is_none_or(|n| *n <= 0) {
                continue;
            }
            let Some(receiver) = receiving
                .iter()
                .find(|(_, n)| **n > 0)
                .map(|(z, _)| z.clone())
            else {
                continue;
            };
            endpoint.hints = Some(EndpointHints {
                for_zones: Some(vec![ForZone {
                    name: receiver.clone(),
                }]),
                for_nodes: None,
            });
            take_one(&mut giving, &zone);
            take_one(&mut receiving, &receiver);
            *moved.entry(receiver).or_default() += 1;
            *moved.entry(zone).or_default() -= 1;
        }
    }
    moved
}

/// Counts one down; the entry goes when it was the last.
fn take_one(counts: &mut BTreeMap<String, i64>, zone: &str) {
    if let Some(n) = counts.get_mut(zone) {
        if *n <= 1 {
            counts.remove(zone);
        } else {
            *n -= 1;
        }
    }
}
