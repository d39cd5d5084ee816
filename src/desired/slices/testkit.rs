//! Builders shared by the slice tests, and a stand-in for the API server that
//! applies a plan, so a test can check that a second plan has nothing to do.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    DesiredSlices, NodeInfo, PlanOptions, SlicePlan, ZoneCapacity, desired_slices, plan_slices,
};
use crate::desired::testkit::{RULES_1_36, service, service_port, spec_mut, string_map};
use crate::desired::{PodFields, PodInfo};

/// Our managed-by value in these tests.
pub const OURS: &str = "endpoints-guard";

/// "web" in "default" (uid "uid-web"), port 80 → 8080, IPv4, selecting app=web.
pub fn web_service() -> Service {
    let mut svc = service(vec![service_port("http", 80, Some(IntOrString::Int(8080)))]);
    svc.metadata.uid = Some("uid-web".into());
    svc
}

/// [`web_service`] with these annotations and trafficDistribution.
pub fn service_with(annotations: &[(&str, &str)], distribution: Option<&str>) -> Service {
    let mut svc = web_service();
    svc.metadata.annotations = Some(string_map(annotations));
    spec_mut(&mut svc).traffic_distribution = distribution.map(str::to_string);
    svc
}

/// Ready pods `pod-0`… with IPs 10.0.<i/250>.<i%250+1>, spread over `node-0`
/// to `node-2`.
pub fn pods(count: usize) -> Vec<PodFields> {
    (0..count)
        .map(|i| {
            let mut pod = crate::desired::testkit::pod(
                &format!("pod-{i}"),
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
            );
            pod.node_name = Some(format!("node-{}", i % 3));
            pod
        })
        .collect()
}

/// Ready Nodes `node-0` to `node-2` in zones `zone-a` to `zone-c`, one CPU each.
pub fn nodes() -> BTreeMap<String, NodeInfo> {
    (0..3)
        .map(|i| {
            let name = format!("node-{i}");
            let node = NodeInfo {
                name: name.clone(),
                zone: Some(format!("zone-{}", char::from(b'a' + i))),
                ready: true,
                excluded_from_zone_shares: false,
                allocatable_cpu_nanos: 1_000_000_000,
            };
            (name, node)
        })
        .collect()
}

/// The desired slices of `svc` over `pods`, with [`nodes`].
pub fn desire(svc: &Service, pods: &[PodFields]) -> DesiredSlices {
    desire_as(svc, pods, OURS)
}

/// [`desire`], labelled as managed by `manager`.
pub fn desire_as(svc: &Service, pods: &[PodFields], manager: &str) -> DesiredSlices {
    let packed: Vec<PodInfo> = pods.iter().map(PodFields::pack).collect();
    let refs: Vec<&PodInfo> = packed.iter().collect();
    desired_slices(svc, &refs, &nodes(), manager, RULES_1_36)
}

/// A plan with default options and the zones of [`nodes`].
pub fn plan(desired: &DesiredSlices, existing: &[EndpointSlice]) -> SlicePlan {
    plan_with(desired, existing, 100)
}

pub fn plan_with(desired: &DesiredSlices, existing: &[EndpointSlice], max: usize) -> SlicePlan {
    let options = PlanOptions {
        max_endpoints_per_slice: max,
        ..PlanOptions::default()
    };
    plan_slices(
        desired,
        existing,
        &ZoneCapacity::from_nodes(nodes().values()),
        &options,
    )
}

/// What the API server would hold after `plan`: creates get the next free
/// name `<generateName><n>` and resourceVersion "1", updates replace by name
/// and bump the resourceVersion, deletes go.
pub fn apply(existing: &[EndpointSlice], plan: &SlicePlan) -> Vec<EndpointSlice> {
    let mut by_name: BTreeMap<String, EndpointSlice> = existing
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.clone()))
        .collect();
    for gone in &plan.deletes {
        by_name.remove(gone.metadata.name.as_deref().unwrap_or(""));
    }
    for update in &plan.updates {
        let name = update.metadata.name.clone().unwrap_or_default();
        let version = by_name
            .get(&name)
            .and_then(|s| s.metadata.resource_version.as_deref())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let mut stored = update.clone();
        stored.metadata.resource_version = Some((version + 1).to_string());
        by_name.insert(name, stored);
    }
    let mut counter = 0;
    for create in &plan.creates {
        let prefix = create.metadata.generate_name.clone().unwrap_or_default();
        let name = loop {
            let candidate = format!("{prefix}{counter:05}");
            counter += 1;
            if !by_name.contains_key(&candidate) {
                break candidate;
            }
        };
        let mut stored = create.clone();
        stored.metadata.name = Some(name.clone());
        stored.metadata.resource_version = Some("1".into());
        by_name.insert(name, stored);
    }
    by_name.into_values().collect()
}

/// Endpoint counts of `slices`, sorted (upstream's tests compare these).
pub fn lengths(slices: &[EndpointSlice]) -> Vec<usize> {
    let mut out: Vec<usize> = slices
        .iter()
        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
        .collect();
    out.sort_unstable();
    out
}

/// The names of the pods an EndpointSlice list publishes, sorted.
pub fn pod_names(slices: &[EndpointSlice]) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
        .collect();
    out.sort();
    out
}
