//! The writes from existing slices to desired ones (upstream `Reconcile`,
//! `reconcileByAddressType`, `reconcileByPortMapping`, the placeholder rule and
//! `finalize`).
//!
//! Per address type: existing slices not owned by the Service go; the others
//! are grouped by port set. Within a port set, each existing slice keeps the
//! endpoints still desired (rewritten when one changed or went), a slice left
//! empty is deleted, and the remaining desired endpoints first top up the
//! slices already being rewritten (fullest first), then fill whole new slices,
//! and a remainder smaller than a slice goes into the one unchanged slice it
//! fills best, or a new one. Port sets no longer desired lose their slices. A
//! Service with nothing else to publish keeps one empty placeholder slice.
//! Then hints are set, and every create that can be turned into an update of a
//! slice being deleted is.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::compute::{PortSetKey, port_set_key, service_labels, sort_ports};
use super::content::same_slice_content;
use super::hints::{HintLists, apply_hints};
use super::identity::{EndpointKey, same_beyond_identity};
use super::{
    AddressType, AddressTypeEndpoints, DesiredSlices, LABEL_SLICE_MANAGED_BY, PlanOptions,
    PortGroup, SlicePlan, ZoneCapacity, slice_manager, slice_service_name,
};
use crate::desired::trigger::set_trigger_time_annotation;

/// The plan that turns `existing` into `desired`.
///
/// `existing` may hold any slices of the namespace: only those labelled for
/// this Service, managed by one of `options.managers` and not being deleted
/// are considered; the rest are left alone. Those of `options.replaced` are
/// only deleted. `zones` matters only for the `Auto` hint mode.
pub fn plan_slices(
    desired: &DesiredSlices,
    existing: &[EndpointSlice],
    zones: &ZoneCapacity,
    options: &PlanOptions,
) -> SlicePlan {
    let (replaced, mut considered): (Vec<&EndpointSlice>, Vec<&EndpointSlice>) = existing
        .iter()
        .filter(|s| {
            s.metadata.deletion_timestamp.is_none()
                && s.metadata.namespace.as_deref().unwrap_or("") == desired.namespace
                && slice_service_name(s) == Some(desired.service_name.as_str())
                && options.managers.slices(slice_manager(s))
        })
        .partition(|s| options.replaced.slices(slice_manager(s)));
    considered.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut plan = SlicePlan::default();
    let served: BTreeSet<&str> = desired
        .address_types
        .iter()
        .map(|a| a.address_type.as_str())
        .collect();
    plan.deletes.extend(
        considered
            .iter()
            .filter(|s| !served.contains(s.address_type.as_str()))
            .map(|s| (*s).clone()),
    );
    for family in &desired.address_types {
        let of_type: Vec<&EndpointSlice> = considered
            .iter()
            .copied()
            .filter(|s| s.address_type == family.address_type.as_str())
            .collect();
        let planner = Planner {
            desired,
            address_type: family.address_type,
            max: options.max_endpoints_per_slice.max(1),
        };
        planner.plan(family, &of_type, zones, &mut plan);
    }

    // Nothing new for a Service on its way out: the garbage collector would
    // race the creates.
    if desired.service_deleting {
        plan.creates.clear();
    }
    // Upstream's addTriggerTimeAnnotation.
    for slice in plan.creates.iter_mut().chain(plan.updates.iter_mut()) {
        let annotations = slice.metadata.annotations.get_or_insert_with(BTreeMap::new);
        set_trigger_time_annotation(annotations, options.trigger_time);
    }
    plan.updates.retain(|update| {
        !considered
            .iter()
            .any(|old| old.metadata.name == update.metadata.name && same_slice_content(old, update))
    });
    // Applied after the creates and updates, which publish their endpoints.
    plan.deletes.extend(replaced.into_iter().cloned());
    plan
}

struct Planner<'d> {
    desired: &'d DesiredSlices,
    address_type: AddressType,
    max: usize,
}

/// The writes of one port set.
#[derive(Default)]
struct GroupPlan<'e> {
    creates: Vec<EndpointSlice>,
    updates: Vec<EndpointSlice>,
    deletes: Vec<&'e EndpointSlice>,
}

impl Planner<'_> {
    fn plan(
        &self,
        family: &AddressTypeEndpoints,
        existing: &[&EndpointSlice],
        zones: &ZoneCapacity,
        plan: &mut SlicePlan,
    ) {
        let mut writes = GroupPlan::default();
        let mut by_ports: BTreeMap<PortSetKey, Vec<&EndpointSlice>> = BTreeMap::new();
        for slice in existing {
            if self.owned(slice) {
                let mut ports = slice.ports.clone().unwrap_or_default();
                sort_ports(&mut ports, self.desired.port_order);
                by_ports
                    .entry(port_set_key(&ports))
                    .or_default()
                    .push(slice);
            } else {
                writes.deletes.push(slice);
            }
        }
        for group in &family.groups {
            let current = by_ports
                .remove(&port_set_key(&group.ports))
                .unwrap_or_default();
            let group_writes = self.plan_group(group, &current);
            writes.creates.extend(group_writes.creates);
            writes.updates.extend(group_writes.updates);
            writes.deletes.extend(group_writes.deletes);
        }
        writes.deletes.extend(by_ports.into_values().flatten());

        if existing.len() == writes.deletes.len() && writes.creates.is_empty() {
            let placeholder = self.new_slice(Vec::new());
            if writes.deletes.len() == 1 && self.is_placeholder(writes.deletes[0]) {
                writes.deletes.clear();
            } else {
                writes.creates.push(placeholder);
            }
        }

        let touched: BTreeSet<Option<&str>> = writes
            .updates
            .iter()
            .map(|s| s.metadata.name.as_deref())
            .chain(writes.deletes.iter().map(|s| s.metadata.name.as_deref()))
            .collect();
        let mut unchanged: Vec<&EndpointSlice> = existing
            .iter()
            .copied()
            .filter(|s| !touched.contains(&s.metadata.name.as_deref()))
            .collect();
        let lists = HintLists {
            creates: &mut writes.creates,
            updates: &mut writes.updates,
            unchanged: &mut unchanged,
        };
        if let Some(outcome) = apply_hints(self.desired.hints, zones, self.address_type, lists) {
            plan.auto_hints.push(outcome);
        }

        // A create becomes the update of a slice of the Service being deleted.
        let mut index = 0;
        while index < writes.deletes.len() {
            let replaced = writes.deletes[index];
            if !self.owned(replaced) {
                index += 1;
                continue;
            }
            let Some(mut slice) = writes.creates.pop() else {
                break;
            };
            slice.metadata.name = replaced.metadata.name.clone();
            slice.metadata.resource_version = replaced.metadata.resource_version.clone();
            writes.updates.push(slice);
            writes.deletes.remove(index);
        }
        plan.creates.extend(writes.creates);
        plan.updates.extend(writes.updates);
        plan.deletes.extend(writes.deletes.into_iter().cloned());
    }

    /// Upstream's reconcileByPortMapping for one port set.
    fn plan_group<'e>(&self, group: &PortGroup, existing: &[&'e EndpointSlice]) -> GroupPlan<'e> {
        let mut wanted: BTreeMap<EndpointKey, &Endpoint> = group
            .endpoints
            .iter()
            .map(|e| (EndpointKey::of(e), e))
            .collect();
        let mut writes = GroupPlan::default();
        let mut unchanged: Vec<&EndpointSlice> = Vec::new();
        for slice in existing {
            let current = slice.endpoints.as_deref().unwrap_or_default();
            let mut kept: Vec<Endpoint> = Vec::new();
            let mut changed = false;
            for endpoint in current {
                if let Some(desired) = wanted.remove(&EndpointKey::of(endpoint)) {
                    changed |= !same_beyond_identity(desired, endpoint);
                    kept.push(desired.clone());
                }
            }
            if changed || kept.len() != current.len() {
                if kept.is_empty() {
                    writes.deletes.push(slice);
                } else {
                    let mut copy = (*slice).clone();
                    copy.endpoints = Some(kept);
                    copy.metadata.labels = Some(self.desired.labels.clone());
                    writes.updates.push(copy);
                }
            } else if self.labels_outdated(slice) {
                let mut copy = (*slice).clone();
                copy.metadata.labels = Some(self.desired.labels.clone());
                writes.updates.push(copy);
            } else {
                unchanged.push(slice);
            }
        }

        // Top up the slices being rewritten anyway, fullest first.
        if !wanted.is_empty() {
            writes.updates.sort_by(|a, b| {
                endpoint_count(b)
                    .cmp(&endpoint_count(a))
                    .then_with(|| a.metadata.name.cmp(&b.metadata.name))
            });
            for slice in &mut writes.updates {
                self.fill(slice, &mut wanted);
            }
        }

        // The rest: whole new slices, and a remainder that fits in one
        // unchanged slice goes there.
        while !wanted.is_empty() {
            let reuse = if wanted.len() < self.max {
                self.slice_to_fill(&unchanged, wanted.len())
            } else {
                None
            };
            match reuse {
                Some(index) => {
                    let mut slice = unchanged.remove(index).clone();
                    self.fill(&mut slice, &mut wanted);
                    writes.updates.push(slice);
                }
                None => {
                    let mut slice = self.new_slice(group.ports.clone());
                    self.fill(&mut slice, &mut wanted);
                    writes.creates.push(slice);
                }
            }
        }
        writes
    }

    /// Moves desired endpoints into `slice` until it is full.
    fn fill(&self, slice: &mut EndpointSlice, wanted: &mut BTreeMap<EndpointKey, &Endpoint>) {
        let endpoints = slice.endpoints.get_or_insert_with(Vec::new);
        while endpoints.len() < self.max {
            let Some((_, endpoint)) = wanted.pop_first() else {
                break;
            };
            endpoints.push(endpoint.clone());
        }
    }

    /// Upstream's getSliceToFill: the unchanged slice that `count` more
    /// endpoints would bring closest to full without overflowing.
    fn slice_to_fill(&self, unchanged: &[&EndpointSlice], count: usize) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (index, slice) in unchanged.iter().enumerate() {
            let Some(room_left) = self.max.checked_sub(count + endpoint_count(slice)) else {
                continue;
            };
            if best.is_none_or(|(_, least)| room_left < least) {
                best = Some((index, room_left));
                if room_left == 0 {
                    break;
                }
            }
        }
        best.map(|(index, _)| index)
    }

    /// Upstream's ownedBy: an owner reference to this Service's uid, kind
    /// Service, apiVersion v1.
    fn owned(&self, slice: &EndpointSlice) -> bool {
        slice.metadata.owner_references.iter().flatten().any(|o| {
            o.uid == self.desired.service_uid && o.kind == "Service" && o.api_version == "v1"
        })
    }

    /// Upstream's setEndpointSliceLabels verdict: the labels a slice mirrors
    /// from the Service differ (changes of the reserved labels alone do not
    /// count). A slice labelled with the other recognised managed-by value
    /// (upstream's or ours, being adopted) is relabelled too.
    fn labels_outdated(&self, slice: &EndpointSlice) -> bool {
        service_labels(slice.metadata.labels.as_ref()) != service_labels(Some(&self.desired.labels))
            || slice_manager(slice)
                != self
                    .desired
                    .labels
                    .get(LABEL_SLICE_MANAGED_BY)
                    .map(String::as_str)
    }

    /// Upstream's placeholder comparison: same namespace, exactly the labels a
    /// new slice gets, same address type, no endpoints, no ports (owner
    /// references are not compared).
    fn is_placeholder(&self, slice: &EndpointSlice) -> bool {
        let empty = BTreeMap::new();
        slice.metadata.namespace.as_deref().unwrap_or("") == self.desired.namespace
            && slice.metadata.labels.as_ref().unwrap_or(&empty) == &self.desired.labels
            && slice.address_type == self.address_type.as_str()
            && endpoint_count(slice) == 0
            && slice.ports.as_deref().unwrap_or_default().is_empty()
    }

    /// Upstream's newEndpointSlice. The name is generated from `<service>-`
    /// (upstream falls back to the bare name when that is no valid prefix,
    /// which a Service name, a DNS label, never causes).
    fn new_slice(&self, ports: Vec<EndpointPort>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", self.desired.service_name)),
                namespace: Some(self.desired.namespace.clone()),
                labels: Some(self.desired.labels.clone()),
                owner_references: Some(vec![self.desired.owner.clone()]),
                ..ObjectMeta::default()
            },
            address_type: self.address_type.as_str().to_string(),
            endpoints: Some(Vec::new()),
            ports: Some(ports),
        }
    }
}

fn endpoint_count(slice: &EndpointSlice) -> usize {
    slice.endpoints.as_ref().map_or(0, Vec::len)
}
