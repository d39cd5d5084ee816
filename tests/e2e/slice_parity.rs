//! The EndpointSlice differential test: kube-controller-manager's
//! endpointslice controller alone reconciles a generated workload (see
//! `eg_workload::slice_workload`); once its slices are stable, every
//! Service's desired slices are computed by `desired::slices` from the objects
//! read back from the API server, and compared:
//!
//! - per Service, address type and port set (as stored, in upstream's order),
//!   the set of endpoints with every field must be identical; slice boundaries
//!   and names may differ. For the topology-mode annotation, upstream chooses
//!   which endpoints to redistribute through Go map order, so there the hints
//!   are compared as whether each endpoint has one and how many each zone
//!   gets;
//! - our plan over upstream's slices must be empty: upstream's result is a
//!   state our planner would leave alone (boundaries, labels, owner
//!   references, placeholder and hints included). It plans with the
//!   managed-by value endpoints-guard writes by default (`ManagedBy`), so
//!   that value must be upstream's: a relabelling would be a write;
//! - every upstream slice satisfies the invariants our planner keeps: at most
//!   100 endpoints, no endpoint twice, an empty slice only as the lone
//!   placeholder, exactly the desired labels, one controller reference to the
//!   Service, a name generated from the Service's.
//!
//! Twice: after a cold start on the whole workload, and after a round of
//! changes (readiness flips, pods deleted and added, a Service relabelled, hint
//! rules switched) that the controller follows incrementally.
//!
//! `EG_PARITY_SCALE=full` runs the larger workload. Writes
//! `target/parity/slices-report.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use clap::Parser;
use eg_harness::{ControlPlane, ControlPlaneOptions};
use eg_workload::slice_workload::{SliceSize, SliceWorkload, Snapshot, list_namespaced};
use eg_workload::workload::write_parity_report;
use endpoints_guard::config::Config;
use endpoints_guard::desired::scope::spec_selector;
use endpoints_guard::desired::slices::{
    DEFAULT_MAX_ENDPOINTS_PER_SLICE, DesiredSlices, HintMode, LABEL_SERVICE_NAME, NodeInfo,
    PlanOptions, ZoneCapacity, desired_slices, plan_slices, slice_service_name,
};
use endpoints_guard::desired::{ManagedBy, PodInfo, Rules, selector_matches};
use endpoints_guard::startup;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use serde_json::{Value, json};

/// (address type, ports as stored) → endpoint identity → endpoint.
type Groups = BTreeMap<(String, String), BTreeMap<String, Value>>;

fn identity(endpoint: &Endpoint) -> String {
    let mut addresses = endpoint.addresses.clone();
    addresses.sort();
    let pod = endpoint
        .target_ref
        .as_ref()
        .and_then(|r| r.name.clone())
        .unwrap_or_default();
    format!("{} {pod}", addresses.join(","))
}

/// Groups endpoints by address type and port set; with `hints_as_counts`
/// each endpoint's hints are left out of its value (compared separately).
fn group(slices: &[EndpointSlice], hints_as_counts: bool) -> Groups {
    let mut out = Groups::new();
    for slice in slices {
        let ports =
            serde_json::to_string(&slice.ports.clone().unwrap_or_default()).unwrap_or_default();
        let endpoints = out.entry((slice.address_type.clone(), ports)).or_default();
        for endpoint in slice.endpoints.iter().flatten() {
            let mut endpoint = endpoint.clone();
            if hints_as_counts {
                endpoint.hints = None;
            }
            endpoints.insert(
                identity(&endpoint),
                serde_json::to_value(&endpoint).unwrap_or_default(),
            );
        }
    }
    out
}

/// Per address type: zone → hints pointing there; and how many endpoints
/// have any hint.
fn hint_counts(slices: &[EndpointSlice]) -> BTreeMap<String, (BTreeMap<String, usize>, usize)> {
    let mut out: BTreeMap<String, (BTreeMap<String, usize>, usize)> = BTreeMap::new();
    for slice in slices {
        let (zones, hinted) = out.entry(slice.address_type.clone()).or_default();
        for endpoint in slice.endpoints.iter().flatten() {
            if let Some(hints) = &endpoint.hints {
                *hinted += 1;
                for zone in hints.for_zones.iter().flatten() {
                    *zones.entry(zone.name.clone()).or_default() += 1;
                }
            }
        }
    }
    out
}

fn first_difference(ours: &Groups, theirs: &Groups) -> Option<String> {
    let keys: BTreeSet<&(String, String)> = ours.keys().chain(theirs.keys()).collect();
    for key in keys {
        let (Some(a), Some(b)) = (ours.get(key), theirs.get(key)) else {
            return Some(format!(
                "{} ports {}: only in {}",
                key.0,
                key.1,
                if ours.contains_key(key) {
                    "ours"
                } else {
                    "upstream's"
                }
            ));
        };
        let ids: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for id in ids {
            match (a.get(id), b.get(id)) {
                (Some(x), Some(y)) if x == y => {}
                (x, y) => {
                    return Some(format!(
                        "{} ports {} endpoint {id}: ours {} upstream {}",
                        key.0,
                        key.1,
                        x.map(Value::to_string).unwrap_or_else(|| "absent".into()),
                        y.map(Value::to_string).unwrap_or_else(|| "absent".into()),
                    ));
                }
            }
        }
    }
    None
}

/// The invariants every slice of one Service must keep.
fn invariant_violations(desired: &DesiredSlices, slices: &[EndpointSlice]) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_type: BTreeMap<&str, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        by_type
            .entry(slice.address_type.as_str())
            .or_default()
            .push(slice);
    }
    for family in &desired.address_types {
        if !by_type.contains_key(family.address_type.as_str()) {
            out.push(format!("no {} slice", family.address_type.as_str()));
        }
    }
    for (address_type, of_type) in &by_type {
        let mut seen = BTreeSet::new();
        for slice in of_type {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let endpoints = slice.endpoints.as_deref().unwrap_or_default();
            if endpoints.len() > DEFAULT_MAX_ENDPOINTS_PER_SLICE {
                out.push(format!("{name}: {} endpoints", endpoints.len()));
            }
            for endpoint in endpoints {
                if !seen.insert(identity(endpoint)) {
                    out.push(format!("{name}: {} twice", identity(endpoint)));
                }
            }
            if endpoints.is_empty()
                && (of_type.len() != 1 || !slice.ports.as_deref().unwrap_or_default().is_empty())
            {
                out.push(format!(
                    "{name}: empty {address_type} slice that is no lone placeholder"
                ));
            }
            if slice.metadata.labels.as_ref() != Some(&desired.labels) {
                out.push(format!("{name}: labels {:?}", slice.metadata.labels));
            }
            if slice.metadata.owner_references.as_deref()
                != Some(std::slice::from_ref(&desired.owner))
            {
                out.push(format!(
                    "{name}: owner references {:?}",
                    slice.metadata.owner_references
                ));
            }
            if !name.starts_with(&format!("{}-", desired.service_name)) {
                out.push(format!("{name}: not generated from the Service's name"));
            }
        }
    }
    out
}

/// The name → resourceVersion of every slice in the workload's namespaces.
type Versions = BTreeMap<String, String>;

/// Waits until every selector Service has slices, the slices differ from
/// `before` (when given: the controller has reacted), and nothing changed for
/// three polls two seconds apart. Returns the seconds it took and the state.
async fn converge(
    client: &kube::Client,
    wl: &SliceWorkload,
    before: Option<&Versions>,
) -> anyhow::Result<(f64, Versions)> {
    let start = Instant::now();
    let wanted: BTreeSet<String> = wl
        .base
        .services
        .iter()
        .filter(|s| spec_selector(s).is_some())
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default()
            )
        })
        .collect();
    let mut last = None;
    let mut stable = 0;
    let mut reacted = before.is_none();
    loop {
        let slices: Vec<EndpointSlice> = list_namespaced(client, &wl.base.namespaces).await?;
        let versions: Versions = slices
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap_or_default(),
                    s.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        let served: BTreeSet<String> = slices
            .iter()
            .filter_map(|s| {
                Some(format!(
                    "{}/{}",
                    s.metadata.namespace.clone()?,
                    slice_service_name(s)?
                ))
            })
            .collect();
        reacted |= before != Some(&versions);
        let complete = reacted && wanted.is_subset(&served);
        if complete && last.as_ref() == Some(&versions) {
            stable += 1;
            if stable >= 3 {
                return Ok((start.elapsed().as_secs_f64(), versions));
            }
        } else {
            stable = 0;
        }
        last = Some(versions);
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "kube-controller-manager did not converge in 300 s: {} of {} Services have slices",
            wanted.intersection(&served).count(),
            wanted.len()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The verdict on one converged state.
#[derive(Default)]
struct Round {
    identical: usize,
    different: Vec<Value>,
    endpoints_compared: usize,
    upstream_slices: usize,
    auto_services: Vec<Value>,
    seen: Features,
}

impl Round {
    fn report(&self, converge_seconds: f64) -> Value {
        json!({
            "services_compared": self.identical + self.different.len(),
            "endpoints_compared": self.endpoints_compared,
            "upstream_slices": self.upstream_slices,
            "identical": self.identical,
            "different_count": self.different.len(),
            "different": self.different,
            "auto_hint_services": self.auto_services,
            "features_seen": self.seen.report(),
            "upstream_converge_seconds": converge_seconds,
        })
    }
}

/// Compares every selector Service of `snapshot` (see the module
/// documentation), desired by the `rules` of the control plane's release.
fn compare(snapshot: &Snapshot, rules: Rules) -> Round {
    let nodes: BTreeMap<String, NodeInfo> = snapshot
        .nodes
        .iter()
        .filter_map(NodeInfo::from_node)
        .map(|n| (n.name.clone(), n))
        .collect();
    let zones = ZoneCapacity::from_nodes(nodes.values());
    let pods: Vec<PodInfo> = snapshot.pods.iter().filter_map(PodInfo::from_pod).collect();
    let mut round = Round {
        upstream_slices: snapshot.slices.len(),
        ..Round::default()
    };
    for svc in &snapshot.services {
        let Some(selector) = spec_selector(svc) else {
            continue;
        };
        let namespace = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let candidates: Vec<&PodInfo> = pods
            .iter()
            .filter(|p| p.namespace() == namespace && selector_matches(selector, *p))
            .collect();
        let desired = desired_slices(
            svc,
            &candidates,
            &nodes,
            ManagedBy::default().slices(),
            rules,
        );
        let upstream: Vec<EndpointSlice> = snapshot
            .slices
            .iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_SERVICE_NAME))
                        == Some(&name)
            })
            .cloned()
            .collect();
        round.seen.record(&upstream);
        let fresh = plan_slices(&desired, &[], &zones, &PlanOptions::default());
        let auto = desired.hints == HintMode::Auto;
        let ours_groups = group(&fresh.creates, auto);
        let theirs_groups = group(&upstream, auto);
        round.endpoints_compared += theirs_groups.values().map(BTreeMap::len).sum::<usize>();

        let mut problems = Vec::new();
        if let Some(difference) = first_difference(&ours_groups, &theirs_groups) {
            problems.push(difference);
        }
        if auto {
            let (ours, theirs) = (hint_counts(&fresh.creates), hint_counts(&upstream));
            if ours != theirs {
                problems.push(format!("hints per zone: ours {ours:?} upstream {theirs:?}"));
            }
            round.auto_services.push(json!({
                "service": key,
                "ours": format!("{:?}", fresh.auto_hints),
                "upstream_hints_per_type": format!("{theirs:?}"),
            }));
        }
        let over_upstream = plan_slices(&desired, &upstream, &zones, &PlanOptions::default());
        if !over_upstream.is_empty() {
            problems.push(format!(
                "our plan over upstream's slices is not empty: {} creates, {} updates ({:?}), {} deletes",
                over_upstream.creates.len(),
                over_upstream.updates.len(),
                over_upstream.updates.iter().map(|s| s.metadata.name.clone()).collect::<Vec<_>>(),
                over_upstream.deletes.len()
            ));
        }
        problems.extend(invariant_violations(&desired, &upstream));
        if problems.is_empty() {
            round.identical += 1;
        } else {
            round
                .different
                .push(json!({"service": key, "problems": problems}));
        }
    }
    round
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_match_kube_controller_manager() -> anyhow::Result<()> {
    let started = Instant::now();
    let full = std::env::var("EG_PARITY_SCALE").is_ok_and(|s| s == "full");
    let size = if full {
        SliceSize::FULL
    } else {
        SliceSize::SMALL
    };
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    // The rules endpoints-guard would pick on this control plane.
    let rules = startup::kube_rules(&client, &Config::try_parse_from(["endpoints-guard"])?).await?;
    let wl = SliceWorkload::generate(size, "slices");
    wl.create(&client).await?;
    let created_s = started.elapsed().as_secs_f64();
    eprintln!(
        "slice parity: created {} nodes, {} services and {} pods in {created_s:.1}s",
        wl.nodes.len(),
        wl.base.services.len(),
        wl.base.pods.len()
    );

    // Round 1: a cold start on the whole workload.
    let kcm = cp.start_controller_manager("endpointslice-controller", &[])?;
    let (cold_s, cold_versions) = converge(&client, &wl, None).await?;
    let cold = compare(&Snapshot::read(&client, &wl.base.namespaces).await?, rules);
    // Round 2: the controller follows changes from there.
    let changed = wl.churn(&client).await?;
    let (churn_s, _) = converge(&client, &wl, Some(&cold_versions)).await?;
    let churned = compare(&Snapshot::read(&client, &wl.base.namespaces).await?, rules);
    drop(kcm);

    let mut churn_report = churned.report(churn_s);
    churn_report["objects_changed"] = json!(changed);
    let report = json!({
        "scale": if full { "full" } else { "small" },
        "nodes": wl.nodes.len(),
        "services": wl.base.services.len(),
        "pods": wl.base.pods.len(),
        "identical": cold.identical + churned.identical,
        "different": cold.different.len() + churned.different.len(),
        "cold_start": cold.report(cold_s),
        "after_churn": churn_report,
        "create_seconds": created_s,
        "total_seconds": started.elapsed().as_secs_f64(),
    });
    let path = write_parity_report("slices-report.json", &report)?;
    for (name, round) in [("cold start", &cold), ("after churn", &churned)] {
        eprintln!(
            "slice parity, {name}: {} identical, {} different, {} endpoints",
            round.identical,
            round.different.len(),
            round.endpoints_compared
        );
    }
    eprintln!("slice parity: report in {}", path.display());
    cold.seen.assert_exercised();
    assert!(
        cold.different.is_empty() && churned.different.is_empty(),
        "EndpointSlices differ from upstream: {}",
        serde_json::to_string_pretty(&json!([cold.different, churned.different]))?
    );
    Ok(())
}

/// What the upstream slices showed, so a workload that stopped exercising a
/// rule fails the test instead of passing it vacuously.
#[derive(Default)]
struct Features {
    zone_hints: usize,
    node_hints: usize,
    ipv6_slices: usize,
    placeholders: usize,
    terminating: usize,
    serving_not_ready: usize,
    hostnames: usize,
    services_over_100: usize,
    services_over_1000: usize,
    port_sets_per_type_over_1: usize,
}

impl Features {
    fn record(&mut self, slices: &[EndpointSlice]) {
        let mut per_type: BTreeMap<&str, (usize, BTreeSet<String>)> = BTreeMap::new();
        for slice in slices {
            let endpoints = slice.endpoints.as_deref().unwrap_or_default();
            let entry = per_type.entry(slice.address_type.as_str()).or_default();
            entry.0 += endpoints.len();
            entry
                .1
                .insert(serde_json::to_string(&slice.ports).unwrap_or_default());
            if slice.address_type == "IPv6" {
                self.ipv6_slices += 1;
            }
            if endpoints.is_empty() {
                self.placeholders += 1;
            }
            for e in endpoints {
                let c = e.conditions.clone().unwrap_or_default();
                self.terminating += usize::from(c.terminating == Some(true));
                self.serving_not_ready +=
                    usize::from(c.serving == Some(true) && c.ready == Some(false));
                self.hostnames += usize::from(e.hostname.is_some());
                let hints = e.hints.as_ref();
                self.zone_hints += usize::from(hints.is_some_and(|h| h.for_zones.is_some()));
                self.node_hints += usize::from(hints.is_some_and(|h| h.for_nodes.is_some()));
            }
        }
        let most = per_type.values().map(|(n, _)| *n).max().unwrap_or(0);
        self.services_over_100 += usize::from(most > 100);
        self.services_over_1000 += usize::from(most > 1000);
        self.port_sets_per_type_over_1 += per_type.values().filter(|(_, p)| p.len() > 1).count();
    }

    fn counts(&self) -> [(&'static str, usize); 10] {
        [
            ("zone_hints", self.zone_hints),
            ("node_hints", self.node_hints),
            ("ipv6_slices", self.ipv6_slices),
            ("placeholders", self.placeholders),
            ("terminating_endpoints", self.terminating),
            ("serving_not_ready_endpoints", self.serving_not_ready),
            ("hostnames", self.hostnames),
            ("services_over_100_endpoints", self.services_over_100),
            ("services_over_1000_endpoints", self.services_over_1000),
            (
                "address_types_with_several_port_sets",
                self.port_sets_per_type_over_1,
            ),
        ]
    }

    fn report(&self) -> Value {
        self.counts()
            .into_iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    fn assert_exercised(&self) {
        for (what, count) in self.counts() {
            assert!(count > 0, "the workload no longer exercises {what}");
        }
    }
}
