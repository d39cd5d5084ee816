//! build_endpoints and needs_write, one case per rule of parity.md §6–§7.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::desired::testkit::{
    RULES_1_36, address, pod, pod_ref, service, service_port, spec_mut, string_map, subset,
};
use crate::desired::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, MANAGER, MAX_ADDRESSES, PodFields, PodInfo,
    UPSTREAM_MANAGER, compute_subsets,
};

fn marks(managed_by: &'static str) -> EndpointsMarks {
    EndpointsMarks::managed_by(managed_by)
}

fn labelled_service(labels: &[(&str, &str)]) -> Service {
    let mut svc = service(vec![service_port("http", 80, Some(IntOrString::Int(8080)))]);
    svc.metadata.labels = Some(string_map(labels));
    svc
}

fn computed_for(svc: &Service, pods: &[PodFields]) -> ComputedSubsets {
    let packed: Vec<PodInfo> = pods.iter().map(PodFields::pack).collect();
    let refs: Vec<&PodInfo> = packed.iter().collect();
    compute_subsets(svc, &refs, RULES_1_36)
}

/// What a previous write of ours looks like once stored (with a resourceVersion).
fn stored(svc: &Service, computed: &ComputedSubsets) -> Endpoints {
    let mut written = build_endpoints(svc, computed.clone(), None, None, marks(MANAGER));
    written.metadata.resource_version = Some("5".into());
    written
}

#[test]
fn labels_rules() {
    let plain = labelled_service(&[("app", "web"), (LABEL_HEADLESS, "x")]);
    let mut headless = labelled_service(&[("app", "web")]);
    spec_mut(&mut headless).cluster_ip = Some("None".into());
    let mut no_cluster_ip = labelled_service(&[]);
    spec_mut(&mut no_cluster_ip).cluster_ip = None;
    let cases = [
        (
            "service labels + managed-by, headless label removed",
            &plain,
            string_map(&[("app", "web"), (LABEL_MANAGED_BY, MANAGER)]),
        ),
        (
            "headless label when clusterIP None",
            &headless,
            string_map(&[
                ("app", "web"),
                (LABEL_HEADLESS, ""),
                (LABEL_MANAGED_BY, MANAGER),
            ]),
        ),
        (
            "headless label when clusterIP empty",
            &no_cluster_ip,
            string_map(&[(LABEL_HEADLESS, ""), (LABEL_MANAGED_BY, MANAGER)]),
        ),
    ];
    for (case, svc, expected) in cases {
        assert_eq!(endpoints_labels(svc, marks(MANAGER)), expected, "{case}");
    }
}

#[test]
fn label_check_rules() {
    let svc_labels = string_map(&[("app", "web")]);
    let cases = [
        (
            "mirror + managed-by",
            string_map(&[("app", "web"), (LABEL_MANAGED_BY, MANAGER)]),
            true,
        ),
        (
            "headless label ignored when present",
            string_map(&[
                ("app", "web"),
                (LABEL_HEADLESS, ""),
                (LABEL_MANAGED_BY, MANAGER),
            ]),
            true,
        ),
        (
            "managed-by of upstream is not ours",
            string_map(&[("app", "web"), (LABEL_MANAGED_BY, UPSTREAM_MANAGER)]),
            false,
        ),
        ("managed-by missing", string_map(&[("app", "web")]), false),
        (
            "extra label",
            string_map(&[("app", "web"), ("x", "y"), (LABEL_MANAGED_BY, MANAGER)]),
            false,
        ),
        (
            "missing service label",
            string_map(&[(LABEL_MANAGED_BY, MANAGER)]),
            false,
        ),
        (
            "different value",
            string_map(&[("app", "db"), (LABEL_MANAGED_BY, MANAGER)]),
            false,
        ),
    ];
    for (case, current, expected) in cases {
        assert_eq!(
            labels_correct(Some(&current), Some(&svc_labels), marks(MANAGER)),
            expected,
            "{case}"
        );
    }
    // Upstream's count check: a Service carrying the headless key never matches.
    let odd_service = string_map(&[(LABEL_HEADLESS, "")]);
    let current = string_map(&[(LABEL_HEADLESS, ""), (LABEL_MANAGED_BY, MANAGER)]);
    assert!(!labels_correct(
        Some(&current),
        Some(&odd_service),
        marks(MANAGER)
    ));
}

#[test]
fn build_for_create() {
    let svc = labelled_service(&[("app", "web")]);
    let computed = computed_for(&svc, &[pod("a", "10.0.0.1")]);
    let trigger = "2024-03-05T06:08:09.5Z".parse::<Timestamp>().unwrap();
    let built = build_endpoints(&svc, computed.clone(), None, Some(trigger), marks(MANAGER));
    assert_eq!(built.metadata.name.as_deref(), Some("web"));
    assert_eq!(built.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(built.metadata.resource_version, None);
    assert_eq!(built.subsets, Some(computed.subsets));
    assert_eq!(
        built.metadata.annotations,
        Some(string_map(&[(
            ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
            "2024-03-05T06:08:09.5Z"
        )]))
    );
    assert_eq!(
        built.metadata.labels,
        Some(string_map(&[("app", "web"), (LABEL_MANAGED_BY, MANAGER)]))
    );
}

#[test]
fn build_for_update_keeps_annotations_and_metadata() {
    let svc = labelled_service(&[("app", "web")]);
    let current = Endpoints {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            resource_version: Some("17".into()),
            labels: Some(string_map(&[
                ("old", "label"),
                (LABEL_MANAGED_BY, UPSTREAM_MANAGER),
            ])),
            annotations: Some(string_map(&[
                ("keep", "me"),
                (ANNOTATION_LAST_CHANGE_TRIGGER_TIME, "2020-01-01T00:00:00Z"),
                (ANNOTATION_OVER_CAPACITY, "truncated"),
            ])),
            finalizers: Some(vec!["example.com/f".into()]),
            ..ObjectMeta::default()
        },
        subsets: Some(vec![subset(
            Some(vec![address("10.9.9.9", None, None)]),
            None,
            None,
        )]),
    };
    let built = build_endpoints(
        &svc,
        ComputedSubsets::default(),
        Some(&current),
        None,
        marks(MANAGER),
    );
    assert_eq!(
        built.metadata.resource_version.as_deref(),
        Some("17"),
        "update carries the resourceVersion"
    );
    assert_eq!(built.metadata.finalizers, current.metadata.finalizers);
    assert_eq!(
        built.metadata.annotations,
        Some(string_map(&[("keep", "me")])),
        "existing annotations kept; unknown trigger time and over-capacity removed"
    );
    assert_eq!(
        built.metadata.labels,
        Some(string_map(&[("app", "web"), (LABEL_MANAGED_BY, MANAGER)])),
        "labels replaced"
    );
    assert_eq!(
        built.subsets,
        Some(vec![]),
        "empty subsets written explicitly"
    );
}

#[test]
fn build_truncates_and_marks_over_capacity() {
    let svc = labelled_service(&[]);
    let pods: Vec<PodFields> = (0..1001)
        .map(|i| pod(&format!("p{i}"), &format!("10.0.{}.{}", i / 256, i % 256)))
        .collect();
    let computed = computed_for(&svc, &pods);
    assert_eq!(
        crate::desired::capacity::address_count(&computed.subsets),
        1001,
        "computed subsets are not truncated"
    );
    let built = build_endpoints(&svc, computed.clone(), None, None, marks(MANAGER));
    assert_eq!(
        crate::desired::capacity::address_count(built.subsets.as_deref().unwrap_or_default()),
        MAX_ADDRESSES
    );
    assert_eq!(
        built
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_OVER_CAPACITY))
            .map(String::as_str),
        Some(OVER_CAPACITY_TRUNCATED)
    );
    // Upstream compares the untruncated subsets, so an over-capacity object is always rewritten.
    let mut current = built;
    current.metadata.resource_version = Some("3".into());
    assert!(needs_write(
        &svc,
        &computed,
        Some(&current),
        marks(MANAGER),
        RULES_1_36
    ));
}

#[test]
fn write_decisions() {
    let svc = labelled_service(&[("app", "web")]);
    let pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2")];
    let computed = computed_for(&svc, &pods);
    let up_to_date = stored(&svc, &computed);

    let mut with_pod_rv = up_to_date.clone();
    for address in with_pod_rv
        .subsets
        .iter_mut()
        .flatten()
        .flat_map(|s| s.addresses.iter_mut().flatten())
    {
        if let Some(r) = address.target_ref.as_mut() {
            r.resource_version = Some("123".into());
        }
    }
    let mut reordered = up_to_date.clone();
    reordered
        .subsets
        .iter_mut()
        .flatten()
        .for_each(|s| s.addresses.iter_mut().for_each(|a| a.reverse()));
    let mut other_subsets = up_to_date.clone();
    other_subsets.subsets = Some(vec![]);
    let mut stale_labels = up_to_date.clone();
    stale_labels.metadata.labels = Some(string_map(&[(LABEL_MANAGED_BY, MANAGER)]));
    let mut upstream_owned = up_to_date.clone();
    upstream_owned.metadata.labels = Some(string_map(&[
        ("app", "web"),
        (LABEL_MANAGED_BY, UPSTREAM_MANAGER),
    ]));
    let mut stale_capacity = up_to_date.clone();
    stale_capacity
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_OVER_CAPACITY.into(), "truncated".into());
    let mut other_trigger_time = up_to_date.clone();
    other_trigger_time
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            ANNOTATION_LAST_CHANGE_TRIGGER_TIME.into(),
            "2020-01-01T00:00:00Z".into(),
        );
    let mut headless_label_added = up_to_date.clone();
    headless_label_added
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_HEADLESS.into(), String::new());
    let mut no_resource_version = up_to_date.clone();
    no_resource_version.metadata.resource_version = None;

    let cases = [
        ("no Endpoints yet: create", None, true),
        (
            "no resourceVersion: create",
            Some(&no_resource_version),
            true,
        ),
        ("identical: skip", Some(&up_to_date), false),
        (
            "targetRef resourceVersion ignored: skip",
            Some(&with_pod_rv),
            false,
        ),
        (
            "only the order differs: skip (compared again after repacking)",
            Some(&reordered),
            false,
        ),
        ("subsets differ: write", Some(&other_subsets), true),
        ("labels differ: write", Some(&stale_labels), true),
        ("managed-by upstream: write", Some(&upstream_owned), true),
        (
            "stale over-capacity annotation: write",
            Some(&stale_capacity),
            true,
        ),
        (
            "trigger time alone never causes a write",
            Some(&other_trigger_time),
            false,
        ),
        (
            "headless label alone never causes a write",
            Some(&headless_label_added),
            false,
        ),
    ];
    for (case, current, expected) in cases {
        assert_eq!(
            needs_write(&svc, &computed, current, marks(MANAGER), RULES_1_36),
            expected,
            "{case}"
        );
    }
}

#[test]
fn nil_and_empty_subsets_are_equal() {
    let svc = labelled_service(&[]);
    let computed = ComputedSubsets::default();
    let mut current = stored(&svc, &computed);
    current.subsets = None;
    assert!(!needs_write(
        &svc,
        &computed,
        Some(&current),
        marks(MANAGER),
        RULES_1_36
    ));
}

#[test]
fn stored_object_with_extra_ready_address_needs_write() {
    let svc = labelled_service(&[]);
    let computed = computed_for(&svc, &[pod("a", "10.0.0.1")]);
    let mut current = stored(&svc, &computed);
    let extra: EndpointAddress = address(
        "10.0.0.9",
        Some("node-1"),
        Some(pod_ref("default", "z", "uid-z")),
    );
    current.subsets = Some(vec![EndpointSubset {
        addresses: Some(vec![extra]),
        ..computed.subsets[0].clone()
    }]);
    assert!(needs_write(
        &svc,
        &computed,
        Some(&current),
        marks(MANAGER),
        RULES_1_36
    ));
}

/// Either value `--managed-by` writes (upstream's, or `endpoints-guard` on
/// both kinds): Endpoints labelled with it pass the label check only for the
/// value written (the flag itself is tested in `config.rs`).
#[test]
fn managed_by_values_are_checked_as_written() {
    use crate::desired::ManagedBy;

    assert_eq!(
        (
            ManagedBy::Upstream.endpoints(),
            ManagedBy::Upstream.slices()
        ),
        ("endpoint-controller", "endpointslice-controller.k8s.io")
    );
    assert_eq!(ManagedBy::Upstream.endpoints(), UPSTREAM_MANAGER);
    assert_eq!(
        (ManagedBy::Own.endpoints(), ManagedBy::Own.slices()),
        (MANAGER, MANAGER)
    );
    // Either way, Endpoints labelled with either value are this controller's
    // to sweep, and upstream's label check passes only for the value written.
    for written in [ManagedBy::Upstream, ManagedBy::Own] {
        let svc = labelled_service(&[("app", "web")]);
        let labels = endpoints_labels(&svc, marks(written.endpoints()));
        assert!(labels_correct(
            Some(&labels),
            svc.metadata.labels.as_ref(),
            marks(written.endpoints())
        ));
        let other = if written == ManagedBy::Own {
            ManagedBy::Upstream
        } else {
            ManagedBy::Own
        };
        assert!(!labels_correct(
            Some(&labels),
            svc.metadata.labels.as_ref(),
            marks(other.endpoints())
        ));
    }
}

/// The Endpoints of an opted-in Service carry skip-mirror "true" besides
/// managed-by; the label check wants both, and a Service that carries
/// skip-mirror itself (so that upstream's Endpoints have it before the
/// takeover) does not make every comparison fail.
#[test]
fn skip_mirror_mark() {
    let opt_in = EndpointsMarks {
        managed_by: MANAGER,
        skip_mirror: true,
    };
    for service_labels in [
        vec![("app", "web")],
        vec![
            ("app", "web"),
            (crate::desired::scope::LABEL_SKIP_MIRROR, "true"),
        ],
    ] {
        let svc = labelled_service(&service_labels);
        let labels = endpoints_labels(&svc, opt_in);
        assert_eq!(
            labels
                .get(crate::desired::scope::LABEL_SKIP_MIRROR)
                .map(String::as_str),
            Some("true")
        );
        assert!(
            labels_correct(Some(&labels), svc.metadata.labels.as_ref(), opt_in),
            "{service_labels:?}"
        );
        let mut unmarked = labels.clone();
        unmarked.remove(crate::desired::scope::LABEL_SKIP_MIRROR);
        assert!(!labels_correct(
            Some(&unmarked),
            svc.metadata.labels.as_ref(),
            opt_in
        ));
        let mut wrong = labels.clone();
        wrong.insert(
            crate::desired::scope::LABEL_SKIP_MIRROR.into(),
            "false".into(),
        );
        assert!(!labels_correct(
            Some(&wrong),
            svc.metadata.labels.as_ref(),
            opt_in
        ));
        let service_marks_itself = service_labels.len() == 2;
        assert_eq!(
            labels_correct(Some(&labels), svc.metadata.labels.as_ref(), marks(MANAGER)),
            service_marks_itself,
            "without the mark, skip-mirror is one of the Service's labels or a difference"
        );
    }
}
