//! plan_slices. Slice-count expectations re-express upstream's
//! reconciler_test.go (k8s.io/endpointslice v0.36.3) scenarios; every plan is
//! applied to a stand-in API server and planned again, which must find
//! nothing to do.

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::testkit::{
    OURS, apply, desire, desire_as, lengths, nodes, plan, plan_with, pod_names, pods, web_service,
};
use super::*;
use crate::desired::scope::Managers;
use crate::desired::testkit::spec_mut;
use crate::desired::{ANNOTATION_LAST_CHANGE_TRIGGER_TIME, PodFields};

/// Plans from `existing`, applies, and checks the result is a fixed point.
fn converge(
    desired: &DesiredSlices,
    existing: &[EndpointSlice],
    max: usize,
) -> (SlicePlan, Vec<EndpointSlice>) {
    let first = plan_with(desired, existing, max);
    let after = apply(existing, &first);
    let again = plan_with(desired, &after, max);
    assert!(again.is_empty(), "a second plan must be empty: {again:#?}");
    (first, after)
}

fn counts(plan: &SlicePlan) -> (usize, usize, usize) {
    (plan.creates.len(), plan.updates.len(), plan.deletes.len())
}

/// Pods with upstream's test mix: every third one not ready.
fn mixed_pods(count: usize) -> Vec<PodFields> {
    let mut all = pods(count);
    for (i, pod) in all.iter_mut().enumerate() {
        pod.ready = i % 3 != 0;
    }
    all
}

/// Existing slices holding the endpoints of `pods` picked by `take`, each a
/// slice of ours as a previous plan would have made it.
fn existing_from(desired: &DesiredSlices, groups: &[Vec<usize>]) -> Vec<EndpointSlice> {
    let all = &desired.address_types[0].groups[0].endpoints;
    let by_pod: BTreeMap<String, &k8s_openapi::api::discovery::v1::Endpoint> = all
        .iter()
        .map(|e| {
            (
                e.target_ref
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_default(),
                e,
            )
        })
        .collect();
    let template = plan(desired, &[]).creates.remove(0);
    groups
        .iter()
        .enumerate()
        .map(|(n, indexes)| {
            let mut slice = template.clone();
            slice.metadata.name = Some(format!("web-existing-{n}"));
            slice.metadata.resource_version = Some("1".into());
            slice.endpoints = Some(
                indexes
                    .iter()
                    .filter_map(|i| by_pod.get(&format!("pod-{i}")).map(|e| (*e).clone()))
                    .collect(),
            );
            slice
        })
        .collect()
}

#[test]
fn cold_start_splits_at_the_maximum() {
    // Upstream's TestReconcileManyPods and TestReconcileMaxEndpointsPerSlice.
    let desired = desire(&web_service(), &mixed_pods(250));
    let cases = [
        (100, vec![50, 100, 100]),
        (50, vec![50, 50, 50, 50, 50]),
        (80, vec![10, 80, 80, 80]),
        (150, vec![100, 150]),
        (250, vec![250]),
        (500, vec![250]),
    ];
    for (max, expected) in cases {
        let (first, after) = converge(&desired, &[], max);
        assert_eq!(counts(&first), (expected.len(), 0, 0), "max {max}");
        assert_eq!(lengths(&after), expected, "max {max}");
        assert_eq!(pod_names(&after).len(), 250, "max {max}: every pod once");
    }
    // Above a thousand endpoints.
    let big = desire(&web_service(), &pods(1001));
    let (first, after) = converge(&big, &[], 100);
    assert_eq!(first.creates.len(), 11);
    assert_eq!(lengths(&after).first(), Some(&1));
}

#[test]
fn no_write_when_nothing_changed() {
    let desired = desire(&web_service(), &mixed_pods(120));
    let (_, after) = converge(&desired, &[], 100);
    assert!(plan(&desired, &after).is_empty());
    // A pod's resourceVersion alone changes nothing.
    let mut bumped = mixed_pods(120);
    bumped[5].resource_version = "99".into();
    assert!(plan(&desire(&web_service(), &bumped), &after).is_empty());
}

#[test]
fn one_pod_change_touches_one_slice() {
    let all = mixed_pods(250);
    let (_, after) = converge(&desire(&web_service(), &all), &[], 100);
    type Edit = (&'static str, fn(&mut Vec<PodFields>));
    let cases: [Edit; 4] = [
        ("readiness flips", |p| p[17].ready = !p[17].ready),
        ("pod starts terminating", |p| p[17].terminating = true),
        ("pod goes", |p| {
            p.remove(17);
        }),
        ("pod moves node (zone)", |p| {
            p[17].node_name = Some("node-0".into())
        }),
    ];
    for (case, edit) in cases {
        let mut changed = all.clone();
        edit(&mut changed);
        let desired = desire(&web_service(), &changed);
        let (first, _) = converge(&desired, &after, 100);
        assert_eq!(counts(&first), (0, 1, 0), "{case}");
    }
    // A new pod goes into the slice with room (50 of 100), nothing else.
    let mut grown = all.clone();
    grown.extend(pods(251).into_iter().skip(250));
    let (first, next) = converge(&desire(&web_service(), &grown), &after, 100);
    assert_eq!(counts(&first), (0, 1, 0));
    assert_eq!(lengths(&next), vec![51, 100, 100]);
}

/// Upstream's TestReconcileEndpointSlicesSomePreexisting: 62 and 61 endpoints
/// exist, 127 are missing: one new full slice, and the 27 left go to the
/// slice they bring closest to full.
#[test]
fn remainder_fills_the_slice_closest_to_full() {
    let desired = desire(&web_service(), &mixed_pods(250));
    let first: Vec<usize> = (1..246).step_by(4).collect();
    let second: Vec<usize> = (3..246).step_by(4).collect();
    assert_eq!((first.len(), second.len()), (62, 61));
    let existing = existing_from(&desired, &[first, second]);
    let (plan, after) = converge(&desired, &existing, 100);
    assert_eq!(counts(&plan), (1, 1, 0));
    assert_eq!(lengths(&after), vec![61, 89, 100]);
}

/// Upstream's TestReconcileEndpointSlicesSomePreexistingWorseAllocation: 74
/// and 74 exist, 152 missing: the 52 left fit in neither alone, so a new slice
/// rather than two updates.
#[test]
fn remainder_that_fits_nowhere_gets_a_new_slice() {
    let desired = desire(&web_service(), &mixed_pods(300));
    let first: Vec<usize> = (1..296).step_by(4).collect();
    let second: Vec<usize> = (3..296).step_by(4).collect();
    let existing = existing_from(&desired, &[first, second]);
    let (plan, after) = converge(&desired, &existing, 100);
    assert_eq!(counts(&plan), (2, 0, 0));
    assert_eq!(lengths(&after), vec![52, 74, 74, 100]);
}

/// Upstream's TestReconcileEndpointSlicesUpdatePacking: both slices change
/// anyway; the 15 new endpoints go to the fuller one.
#[test]
fn new_endpoints_top_up_the_fullest_changed_slice() {
    let mut all = pods(215);
    let existing_pods: Vec<usize> = (0..80).chain(100..120).collect();
    let before = desire(&web_service(), &all);
    let existing = existing_from(&before, &[(0..80).collect(), (100..120).collect()]);
    for i in existing_pods.iter().copied().filter(|i| i % 10 == 0) {
        all[i].ready = false;
    }
    let keep: Vec<PodFields> = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| existing_pods.contains(i) || (200..215).contains(i))
        .map(|(_, p)| p)
        .collect();
    let desired = desire(&web_service(), &keep);
    let (plan, after) = converge(&desired, &existing, 100);
    assert_eq!(counts(&plan), (0, 2, 0));
    assert_eq!(lengths(&after), vec![20, 95]);
}

/// Upstream's TestReconcileEndpointSlicesRecycling: ten slices of 30 stay as
/// they are, until a port change makes every slice change: then three are
/// rewritten full and seven deleted.
#[test]
fn a_port_change_repacks_by_rewriting_not_recreating() {
    let all = mixed_pods(300);
    let desired = desire(&web_service(), &all);
    let tens: Vec<Vec<usize>> = (0..10).map(|n| (n * 30..n * 30 + 30).collect()).collect();
    let existing = existing_from(&desired, &tens);
    assert!(
        plan(&desired, &existing).is_empty(),
        "nothing to repack on its own"
    );
    let mut svc = web_service();
    if let Some(port) = spec_mut(&mut svc)
        .ports
        .as_mut()
        .and_then(|p| p.first_mut())
    {
        port.target_port = Some(IntOrString::Int(81));
    }
    let (first, after) = converge(&desire(&svc, &all), &existing, 100);
    assert_eq!(counts(&first), (0, 3, 7));
    assert_eq!(lengths(&after), vec![100, 100, 100]);
}

/// Upstream's ServicesLabelsUpdating / ServicesReservedLabels.
#[test]
fn service_labels_are_mirrored_reserved_ones_ignored() {
    let all = mixed_pods(250);
    let (_, after) = converge(&desire(&web_service(), &all), &[], 100);
    let mut labelled = web_service();
    labelled.metadata.labels = Some(BTreeMap::from([("foo".to_string(), "bar".to_string())]));
    let (first, relabelled) = converge(&desire(&labelled, &all), &after, 100);
    assert_eq!(counts(&first), (0, 3, 0));
    assert!(relabelled.iter().all(|s| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("foo"))
            .is_some()
    }));
    let mut reserved = web_service();
    reserved.metadata.labels = Some(BTreeMap::from([
        (LABEL_SERVICE_NAME.to_string(), "bad".to_string()),
        (LABEL_SLICE_MANAGED_BY.to_string(), "actor".to_string()),
        (
            "service.kubernetes.io/headless".to_string(),
            "invalid".to_string(),
        ),
    ]));
    assert!(plan(&desire(&reserved, &all), &after).is_empty());
}

fn relabel(slices: &[EndpointSlice], manager: &str) -> Vec<EndpointSlice> {
    slices
        .iter()
        .cloned()
        .map(|mut s| {
            if let Some(labels) = s.metadata.labels.as_mut() {
                labels.insert(LABEL_SLICE_MANAGED_BY.into(), manager.into());
            }
            s
        })
        .collect()
}

/// Whichever of the two recognised values a slice carries, it is taken as
/// ours: relabelled once to the value written, never duplicated. Both ways:
/// writing upstream's value (the default) over slices an `--managed-by own`
/// run left, and writing our own over upstream's slices.
#[test]
fn recognised_slices_are_adopted_not_duplicated() {
    for (written, found) in [
        (UPSTREAM_SLICE_MANAGER, OURS),
        (OURS, UPSTREAM_SLICE_MANAGER),
    ] {
        let desired = desire_as(&web_service(), &mixed_pods(250), written);
        let (_, made) = converge(&desired, &[], 100);
        let found_slices = relabel(&made, found);
        assert!(
            found_slices
                .iter()
                .all(|s| Managers::OWN_AND_UPSTREAM.slices(slice_manager(s))),
            "{found}"
        );
        let (first, after) = converge(&desired, &found_slices, 100);
        assert_eq!(
            counts(&first),
            (0, 3, 0),
            "{found} → {written}: one relabelling update per slice"
        );
        assert!(after.iter().all(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SLICE_MANAGED_BY))
                .is_some_and(|m| m == written)
        }));
        assert_eq!(lengths(&after), vec![50, 100, 100]);
        // Only the managed-by label changed.
        for (old, new) in found_slices.iter().zip(&after) {
            assert_eq!(old.endpoints, new.endpoints);
        }
    }
}

/// Opt-in scope's takeover: upstream's slices are not reused or relabelled
/// (kube-controller-manager would stall on them later); ours are created,
/// and upstream's deleted, listed after the creates that publish their
/// endpoints.
#[test]
fn replaced_slices_are_deleted_after_the_creates() {
    let desired = desire_as(&web_service(), &mixed_pods(250), OURS);
    let (_, made) = converge(&desired, &[], 100);
    let upstream = relabel(&made, UPSTREAM_SLICE_MANAGER);
    let options = PlanOptions {
        replaced: Managers::UPSTREAM,
        ..PlanOptions::default()
    };
    let zones = ZoneCapacity::from_nodes(nodes().values());
    let plan = plan_slices(&desired, &upstream, &zones, &options);
    assert_eq!(
        counts(&plan),
        (3, 0, 3),
        "three new, three gone, none reused"
    );
    assert!(
        plan.deletes
            .iter()
            .all(|s| slice_manager(s) == Some(UPSTREAM_SLICE_MANAGER))
    );
    let after = apply(&upstream, &plan);
    assert_eq!(lengths(&after), vec![50, 100, 100]);
    assert!(after.iter().all(|s| slice_manager(s) == Some(OURS)));
    // Once taken over, nothing more to do.
    assert_eq!(
        counts(&plan_slices(&desired, &after, &zones, &options)),
        (0, 0, 0)
    );
}

#[test]
fn other_managers_slices_are_left_alone() {
    let desired = desire(&web_service(), &mixed_pods(10));
    let (_, ours) = converge(&desired, &[], 100);
    let mut foreign = relabel(&ours, "endpointslicemirroring-controller.k8s.io");
    foreign[0].metadata.name = Some("web-mirrored".into());
    // A stale slice of another manager, labelled for our Service: ignored, so
    // ours are still complete and nothing is written.
    let mut existing = ours.clone();
    existing.extend(foreign.clone());
    assert!(plan(&desired, &existing).is_empty());
    // Alone, it does not count: we create our own and leave it.
    let first = plan(&desired, &foreign);
    assert_eq!(counts(&first), (1, 0, 0));
}

#[test]
fn placeholder_rules() {
    // No pods: one empty slice per address type, with no ports.
    let mut svc = web_service();
    spec_mut(&mut svc).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let desired = desire(&svc, &[]);
    let (first, after) = converge(&desired, &[], 100);
    assert_eq!(counts(&first), (2, 0, 0));
    for slice in &first.creates {
        assert_eq!(slice.endpoints.as_deref().map(<[_]>::len), Some(0));
        assert_eq!(slice.ports.as_deref().map(<[_]>::len), Some(0));
    }
    // The API server may return the empty lists as absent: still a placeholder.
    let absent: Vec<EndpointSlice> = after
        .iter()
        .cloned()
        .map(|mut s| {
            s.ports = None;
            s.endpoints = None;
            s
        })
        .collect();
    assert!(plan(&desired, &absent).is_empty());

    // Pods arrive: the placeholder is filled (no create, no delete).
    let mut dual_pods = pods(3);
    for (i, pod) in dual_pods.iter_mut().enumerate() {
        pod.pod_ips.push(format!("fd00::{}", i + 1));
    }
    let with_pods = desire(&svc, &dual_pods);
    let (first, filled) = converge(&with_pods, &after, 100);
    assert_eq!(counts(&first), (0, 2, 0));
    // They go: the emptied slice becomes the placeholder again, by update.
    let (first, _) = converge(&desired, &filled, 100);
    assert_eq!(counts(&first), (0, 2, 0));

    // A Service label change rewrites the placeholder (its labels must match).
    let mut labelled = svc.clone();
    labelled.metadata.labels = Some(BTreeMap::from([("x".to_string(), "y".to_string())]));
    let (first, _) = converge(&desire(&labelled, &[]), &after, 100);
    assert_eq!(counts(&first), (0, 2, 0));
}

/// Upstream's TestReconcileEndpointSlicesRecreation: a slice owned by an
/// older Service of the same name is replaced by create + delete (never
/// updated in place).
#[test]
fn slices_of_another_service_uid_are_replaced() {
    let desired = desire(&web_service(), &pods(1));
    let (_, ours) = converge(&desired, &[], 100);
    let mut stale = ours.clone();
    for slice in &mut stale {
        for owner in slice.metadata.owner_references.iter_mut().flatten() {
            owner.uid = "different".into();
        }
    }
    let (first, _) = converge(&desired, &stale, 100);
    assert_eq!(counts(&first), (1, 0, 1));
}

#[test]
fn address_types_no_longer_served_go() {
    let mut dual = web_service();
    spec_mut(&mut dual).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let mut all = pods(3);
    for (i, pod) in all.iter_mut().enumerate() {
        pod.pod_ips.push(format!("fd00::{}", i + 1));
    }
    let (_, both) = converge(&desire(&dual, &all), &[], 100);
    assert_eq!(both.len(), 2);
    let (first, after) = converge(&desire(&web_service(), &all), &both, 100);
    assert_eq!(counts(&first), (0, 0, 1));
    assert!(after.iter().all(|s| s.address_type == "IPv4"));
}

#[test]
fn a_new_port_set_replaces_the_old_slice_by_update() {
    let all = pods(5);
    let (_, after) = converge(&desire(&web_service(), &all), &[], 100);
    let mut svc = web_service();
    if let Some(port) = spec_mut(&mut svc)
        .ports
        .as_mut()
        .and_then(|p| p.first_mut())
    {
        port.target_port = Some(IntOrString::Int(9090));
    }
    let (first, next) = converge(&desire(&svc, &all), &after, 100);
    assert_eq!(counts(&first), (0, 1, 0));
    assert_eq!(next[0].metadata.name, after[0].metadata.name);
    // The update replaces the slice it reuses and carries its resourceVersion.
    assert_eq!(
        first.updates[0].metadata.resource_version,
        after[0].metadata.resource_version
    );
}

#[test]
fn duplicates_across_slices_are_dropped() {
    let desired = desire(&web_service(), &pods(4));
    let existing = existing_from(&desired, &[vec![0, 1, 2], vec![2, 3]]);
    let (first, after) = converge(&desired, &existing, 100);
    assert_eq!(counts(&first), (0, 1, 0));
    assert_eq!(pod_names(&after), vec!["pod-0", "pod-1", "pod-2", "pod-3"]);
}

/// Upstream's TestReconcilerFinalizeSvcDeletionTimestamp: a Service being
/// deleted gets no new slices, but updates and deletes still happen.
#[test]
fn a_deleting_service_gets_no_creates() {
    let all = pods(150);
    let (_, after) = converge(&desire(&web_service(), &all[..50]), &[], 100);
    let mut svc = web_service();
    svc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::UNIX_EPOCH,
    ));
    // 50 more fit in the existing slice: an update, allowed.
    let topped_up = plan(&desire(&svc, &all[..100]), &after);
    assert_eq!(counts(&topped_up), (0, 1, 0));
    // 100 more need a new slice: not created.
    let grown = plan(&desire(&svc, &all), &after);
    assert_eq!(counts(&grown), (0, 0, 0));
    // Without the deletion the same change creates it.
    assert_eq!(
        counts(&plan(&desire(&web_service(), &all), &after)),
        (1, 0, 0)
    );
}

#[test]
fn slices_being_deleted_are_ignored() {
    let desired = desire(&web_service(), &pods(3));
    let (_, mut after) = converge(&desired, &[], 100);
    // A slice being deleted is ignored: the plan recreates its content.
    after[0].metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    assert_eq!(counts(&plan(&desired, &after)), (1, 0, 0));
}

#[test]
fn trigger_time_is_stamped_or_removed() {
    let desired = desire(&web_service(), &pods(2));
    let at = Timestamp::from_second(1_767_225_600).unwrap_or(Timestamp::UNIX_EPOCH);
    let options = PlanOptions {
        max_endpoints_per_slice: 100,
        trigger_time: Some(at),
        ..PlanOptions::default()
    };
    let zones = ZoneCapacity::default();
    let stamped = plan_slices(&desired, &[], &zones, &options);
    let annotation = |s: &EndpointSlice| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME).cloned())
    };
    assert_eq!(
        annotation(&stamped.creates[0]).as_deref(),
        Some("2026-01-01T00:00:00Z")
    );
    // A change planned without a known trigger time drops the annotation.
    let existing = apply(&[], &stamped);
    let changed = desire(&web_service(), &pods(3));
    let unstamped = plan_slices(&changed, &existing, &zones, &PlanOptions::default());
    assert_eq!(annotation(&unstamped.updates[0]), None);
    // The trigger time alone is no reason to write.
    let later = PlanOptions {
        trigger_time: Some(at),
        ..PlanOptions::default()
    };
    assert!(plan_slices(&desired, &existing, &zones, &later).is_empty());
}

#[test]
fn pods_without_an_address_of_the_type_leave_the_placeholder() {
    // IPv4-only pods behind an IPv6 Service: a port set with no endpoints,
    // so only the placeholder.
    let mut svc = web_service();
    spec_mut(&mut svc).ip_families = Some(vec!["IPv6".into()]);
    let desired = desire(&svc, &pods(2));
    let (first, after) = converge(&desired, &[], 100);
    assert_eq!(counts(&first), (1, 0, 0), "the placeholder");
    assert_eq!(after[0].endpoints.as_deref().map(<[_]>::len), Some(0));
}
