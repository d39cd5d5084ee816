//! Desired EndpointSlices and the writes that get there: pure functions of
//! (Service, candidate pods, Nodes, existing slices, trigger time).
//!
//! Everything follows kube-controller-manager's endpointslice controller
//! (`pkg/controller/endpointslice`, read in v1.36.3; what differs on 1.34,
//! 1.35 and 1.37 comes with [`super::Rules`]) and the `k8s.io/endpointslice`
//! reconciler it drives; `docs/endpointslices.md` lists each rule with where it
//! was checked. Two steps, so that a caller can compare, audit or plan:
//!
//! 1. [`desired_slices`]: the endpoints a Service should publish, per address
//!    type and per resolved port set, plus what every slice carries (labels,
//!    owner reference) and which hint rule applies. No slice boundaries yet.
//! 2. [`plan_slices`]: given the existing slices of the Service, the creates,
//!    updates and deletes that reach the desired state with as few writes as
//!    upstream's reconciler makes (reuse and fill existing slices, create only
//!    what does not fit, delete only what is no longer needed, write nothing
//!    when nothing changes), hints included.
//!
//! Layout: `node` projects Nodes and derives the per-zone CPU shares,
//! `compute` builds the desired endpoints, `identity` says which existing
//! endpoint is which desired one, `plan` lays endpoints out in slices,
//! `hints` sets topology hints, `content` compares slices.
//!
//! Deliberate differences from upstream (each explained in the docs):
//! - the managed-by value is the caller's (upstream's by default, see
//!   [`super::ManagedBy`]); slices labelled with upstream's value or with
//!   `endpoints-guard` are both taken as ours, and relabelled to the caller's
//!   value rather than duplicated;
//! - upstream picks among equal choices (which endpoint goes to which new
//!   slice, which zone gets a redistributed hint on a tie) through Go map
//!   iteration, i.e. at random; here the choice is the first in a fixed order;
//! - an update whose content equals the slice it replaces (trigger time aside)
//!   is dropped from the plan;
//! - updates carry the resourceVersion of the slice they replace.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;

use super::rules::SpewHash;
use super::scope::Managers;

mod compute;
mod content;
mod hints;
mod identity;
mod node;
mod plan;

#[cfg(test)]
mod auto_hints_tests;
#[cfg(test)]
mod compute_tests;
#[cfg(test)]
mod hints_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod ports_labels_tests;
#[cfg(test)]
mod testkit;

#[cfg(test)]
pub(crate) use compute::sort_ports;
pub use compute::{desired_slices, hint_mode};
pub use content::same_slice_content;
pub use node::{NodeInfo, ZoneCapacity};
pub use plan::plan_slices;

/// Label naming the Service a slice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const LABEL_SLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The managed-by value kube-controller-manager's endpointslice controller writes.
pub const UPSTREAM_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// Upstream's `--max-endpoints-per-slice` default.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The Node label an endpoint's zone is read from.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Service annotation asking for topology-aware hints (`Auto` or `auto`).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// The older name of [`ANNOTATION_TOPOLOGY_MODE`]; wins when both are set.
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";

/// An EndpointSlice address type this controller writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressType {
    IPv4,
    IPv6,
}

impl AddressType {
    /// The `addressType` text.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressType::IPv4 => "IPv4",
            AddressType::IPv6 => "IPv6",
        }
    }
}

/// Which hints the endpoints of a Service carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintMode {
    /// No hints: existing ones are removed.
    None,
    /// `trafficDistribution: PreferClose` or `PreferSameZone`: each ready
    /// endpoint with a zone is hinted for its own zone.
    SameZone,
    /// `trafficDistribution: PreferSameNode`: as [`HintMode::SameZone`], plus a
    /// hint for the endpoint's own node.
    SameZoneAndNode,
    /// The topology-mode annotation is `Auto`: ready endpoints are shared
    /// between zones in proportion to the zones' allocatable CPU
    /// ([`ZoneCapacity`]), or carry no hints when that is not safely possible.
    Auto,
}

/// The endpoints of one resolved port set, for one address type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortGroup {
    /// The ports in upstream's order (by the digest in `spew`); empty for the
    /// pods of a headless Service without ports, and for pods none of whose
    /// named target ports resolve.
    pub ports: Vec<EndpointPort>,
    /// Without hints, ordered by identity (addresses, hostname, pod); may be
    /// empty when the group's pods have no address of this type.
    pub endpoints: Vec<Endpoint>,
}

/// The desired endpoints of one address type.
#[derive(Clone, Debug, PartialEq)]
pub struct AddressTypeEndpoints {
    pub address_type: AddressType,
    /// Ordered by port set.
    pub groups: Vec<PortGroup>,
}

/// What one Service's EndpointSlices should contain, before slicing.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredSlices {
    pub namespace: String,
    pub service_name: String,
    /// Slices not owned by this uid (a Service of the same name, deleted and
    /// re-created) are deleted.
    pub service_uid: String,
    /// The Service has a deletionTimestamp: nothing new is created.
    pub service_deleting: bool,
    /// The labels every slice carries: the Service's own (less the reserved
    /// keys), the headless label when there is no cluster IP, the service-name
    /// and managed-by labels.
    pub labels: BTreeMap<String, String>,
    /// The controller reference to the Service every slice carries.
    pub owner: OwnerReference,
    pub hints: HintMode,
    /// The digest the groups' ports are sorted by (the release's): existing
    /// slices' ports are sorted the same way to be matched with them.
    pub port_order: SpewHash,
    /// One per address type the Service serves, IPv4 first.
    pub address_types: Vec<AddressTypeEndpoints>,
    /// Pods left out because their Node is not known (not in the Node cache, or
    /// no nodeName): upstream retries the Service later, with backoff.
    pub pods_on_unknown_nodes: Vec<String>,
}

/// Finds a Node's projection by name.
pub trait NodeLookup {
    fn node(&self, name: &str) -> Option<&NodeInfo>;
}

impl NodeLookup for BTreeMap<String, NodeInfo> {
    fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.get(name)
    }
}

impl NodeLookup for HashMap<String, NodeInfo> {
    fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.get(name)
    }
}

/// How a plan is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// At most this many endpoints per slice (upstream allows 1 to 1000).
    pub max_endpoints_per_slice: usize,
    /// Written as the last-change-trigger-time annotation on every slice
    /// created or updated; `None` removes it.
    pub trigger_time: Option<Timestamp>,
    /// Whose slices are ours to reuse, relabel and delete; the others are
    /// never touched, whatever their service-name label says.
    pub managers: Managers,
    /// Whose slices among `managers`' are replaced rather than reused:
    /// never rewritten, deleted after the plan's creates and updates (which
    /// list their endpoints). Opt-in scope's takeover of upstream's slices:
    /// kube-controller-manager's slice tracker keeps expecting a slice it
    /// wrote until it sees that slice deleted with its own managed-by value;
    /// a relabelled one would stall it for the Service until it restarts.
    pub replaced: Managers,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_endpoints_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
            trigger_time: None,
            managers: Managers::OWN_AND_UPSTREAM,
            replaced: Managers::NONE,
        }
    }
}

/// Why topology-aware hints (the `Auto` annotation) were not set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AutoHintsDisabled {
    /// Some ready Node lacks a zone or allocatable CPU, or fewer than two zones
    /// have ready Nodes.
    InsufficientNodeInfo,
    /// Fewer ready endpoints than zones.
    TooFewEndpoints { endpoints: usize, zones: usize },
    /// The per-zone minimums (share less the 20% overload allowance) add up to
    /// more endpoints than there are.
    MinimumsExceedEndpoints { endpoints: usize, zones: usize },
    /// A ready endpoint has no zone.
    EndpointWithoutZone,
    /// No zone ended up with a hint.
    NoHintsAllocated,
}

/// What became of topology-aware hints for one address type of an `Auto` Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoHintsOutcome {
    pub address_type: AddressType,
    /// `Ok` with the number of hints per zone, or why there are none.
    pub result: Result<BTreeMap<String, usize>, AutoHintsDisabled>,
}

/// The writes that bring a Service's slices to the desired state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlicePlan {
    /// New slices: `metadata.generateName` set, no name.
    pub creates: Vec<EndpointSlice>,
    /// Whole replacements of existing slices, by name, carrying the
    /// resourceVersion of the slice they replace.
    pub updates: Vec<EndpointSlice>,
    /// Existing slices to delete, as they were given.
    pub deletes: Vec<EndpointSlice>,
    /// One entry per address type when the Service's hint mode is `Auto`.
    pub auto_hints: Vec<AutoHintsOutcome>,
}

impl SlicePlan {
    /// True when nothing needs writing.
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.updates.is_empty() && self.deletes.is_empty()
    }
}

/// The Service a slice is labelled for (`kubernetes.io/service-name`).
pub fn slice_service_name(slice: &EndpointSlice) -> Option<&str> {
    label(slice, LABEL_SERVICE_NAME)
}

/// Who manages a slice (`endpointslice.kubernetes.io/managed-by`).
pub fn slice_manager(slice: &EndpointSlice) -> Option<&str> {
    label(slice, LABEL_SLICE_MANAGED_BY)
}

fn label<'a>(slice: &'a EndpointSlice, key: &str) -> Option<&'a str> {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(key))
        .map(String::as_str)
}

/// Every address of a ready endpoint in `slices`.
pub fn ready_addresses(slices: &[EndpointSlice]) -> std::collections::BTreeSet<&str> {
    slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|endpoint| endpoint_ready(endpoint))
        .flat_map(|endpoint| &endpoint.addresses)
        .map(String::as_str)
        .collect()
}

/// True for an endpoint whose `ready` condition is set and true.
fn endpoint_ready(endpoint: &Endpoint) -> bool {
    endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.ready)
        .unwrap_or(false)
}
