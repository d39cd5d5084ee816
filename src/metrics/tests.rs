use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use prometheus::core::Collector;

use super::*;
use crate::desired::scope::{Invalid, OptInState};

/// Stands in for the registry to list what `register_all` registers.
#[derive(Default)]
struct Registered(RefCell<Vec<Box<dyn Collector>>>);

impl Register for Registered {
    fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        self.0.borrow_mut().push(c);
        Ok(())
    }
}

/// The exported series: family name → label values (in label-name order) →
/// value (a histogram's: its sum plus its count).
fn exported(m: &Metrics) -> BTreeMap<String, BTreeMap<Vec<String>, f64>> {
    m.registry
        .gather()
        .iter()
        .map(|family| {
            let series = family
                .get_metric()
                .iter()
                .map(|metric| {
                    let values = metric
                        .get_label()
                        .iter()
                        .map(|pair| pair.value().to_owned())
                        .collect();
                    // The plain model fills only the part of the metric's type; the others are 0.
                    let value = metric.get_counter().get_value()
                        + metric.get_gauge().get_value()
                        + metric.get_histogram().get_sample_sum()
                        + metric.get_histogram().get_sample_count() as f64;
                    (values, value)
                })
                .collect();
            (family.name().to_owned(), series)
        })
        .collect()
}

#[test]
fn renders_prefixed_names() {
    let m = Metrics::new().expect("metrics");
    m.spurious_deletions_prevented
        .with_label_values(&["endpointslices", "watch_delete"])
        .inc();
    let text = m.render().expect("render");
    assert!(text.contains(
        "endpoints_guard_spurious_deletions_prevented_total{controller=\"endpointslices\",reason=\"watch_delete\"} 1"
    ));
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(
            line.starts_with("endpoints_guard_") || line.starts_with("process_"),
            "unprefixed metric: {line}"
        );
    }
}

/// The process's own metrics (as every Prometheus client library exports
/// them) and the build's, beside the controller's.
#[test]
fn process_and_build_info_are_exported() {
    let m = Metrics::new().expect("metrics");
    let exported = exported(&m);
    let build = &exported["endpoints_guard_build_info"];
    assert_eq!(
        build.iter().collect::<Vec<_>>(),
        [(&vec![REVISION.to_string(), VERSION.to_string()], &1.0)],
        "one series, at 1, labels revision and version"
    );
    assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        let series = exported
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not exported"));
        let value = series.values().next().copied().unwrap_or_default();
        if name != "process_cpu_seconds_total" {
            assert!(value > 0.0, "{name} = {value}");
        }
    }
}

/// A labelled metric has no series until one is created; one left out of
/// `export_fixed_series` would be missing from the exposition until its first
/// change, so its first increment would be invisible to `increase()`.
#[test]
fn every_registered_metric_is_exported_at_zero_from_start_up() {
    let m = Metrics::new().expect("metrics");
    let exported = exported(&m);
    let registered = Registered::default();
    m.register_all(&registered).expect("register");
    let names: Vec<String> = registered
        .0
        .borrow()
        .iter()
        .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
        .collect();
    assert!(!names.is_empty());
    // Not the controller's: the process's and the build's (tested below).
    let exported: BTreeMap<_, _> = exported
        .into_iter()
        .filter(|(name, _)| !name.starts_with("process_") && name != "endpoints_guard_build_info")
        .collect();
    for name in &names {
        let series = exported.get(name).unwrap_or_else(|| {
            panic!(
                "{name} is not exported at start-up: give its label values to export_fixed_series"
            )
        });
        for (labels, value) in series {
            assert_eq!(*value, 0.0, "{name}{labels:?} starts at {value}");
        }
    }
    assert_eq!(
        exported.len(),
        names.len(),
        "a family exported twice or unregistered"
    );
}

/// Walks the registry: every value of every fixed label set is there, and
/// nothing else.
#[test]
fn every_fixed_label_value_is_exported() {
    let restart = labels_of(RestartReason::ALL, RestartReason::metric_label);
    let stale = labels_of(StaleReason::ALL, StaleReason::metric_label);
    let drift_kinds = labels_of(DriftKind::ALL, DriftKind::metric_label);
    let drift = every(&[RESOURCES, &drift_kinds]);
    let controllers = labels_of(&Controller::ALL, |c| c.metric_label());
    // Labels sort by name: controller comes first wherever it is.
    let expected: BTreeMap<&str, Vec<Vec<&str>>> = BTreeMap::from([
        ("reconciles_total", every(&[&controllers, RESULTS])),
        (
            "reconcile_errors_total",
            every(&[&controllers, Error::METRIC_LABELS]),
        ),
        ("reconcile_duration_seconds", every(&[&controllers])),
        ("event_to_write_seconds", every(&[&controllers])),
        ("event_to_write_answered_seconds", every(&[&controllers])),
        ("endpoints_writes_total", every(&[VERBS])),
        ("endpointslice_writes_total", every(&[VERBS])),
        (
            "spurious_deletions_prevented_total",
            every(&[&controllers, prevention::ALL]),
        ),
        ("audit_divergences_total", every(&[&controllers, VERBS])),
        ("pod_deletions_held_total", every(&[&controllers])),
        ("queue_retries_total", every(&[&controllers])),
        ("queue_dropped_total", every(&[&controllers])),
        // Labels sort by name: kind before resource.
        (
            "resync_drift_total",
            drift.into_iter().map(|s| vec![s[1], s[0]]).collect(),
        ),
        (
            "resync_count_checks_total",
            every(&[RESOURCES, &["matches", "differs", "unknown"]]),
        ),
        // reason before resource.
        ("watch_restarts_total", every(&[&restart, RESOURCES])),
        ("stale_events_ignored_total", every(&[&stale, RESOURCES])),
        ("relists_total", every(&[RESOURCES])),
        ("rv_regressions_total", every(&[RESOURCES])),
        ("undecodable_objects_total", every(&[RESOURCES])),
        ("opaque_resource_versions_total", every(&[RESOURCES])),
        ("cache_objects", every(&[RESOURCES])),
        ("cache_tombstones", every(&[RESOURCES])),
        ("unmanaged_orphan_endpoints", every(&[ORPHAN_SCOPES])),
        ("queue_depth", every(&[&controllers])),
        ("store_rewinds_total", every(&[RESOURCES])),
        ("ghosts_found_total", every(&[RESOURCES])),
        (
            "compaction_audits_total",
            every(&[
                &["pods", "services"],
                &["counted", "deferred", "failed", "listed", "unchanged"],
            ]),
        ),
        (
            "compaction_audit_suspects_total",
            every(&[&["pods", "services"]]),
        ),
        (
            "opt_in_frozen_services",
            every(&[&labels_of(&Invalid::ALL, |i| i.metric_label())]),
        ),
        (
            "opted_in_services",
            every(&[&labels_of(&OptInState::ALL, |s| s.metric_label())]),
        ),
        // revision before version.
        ("build_info", vec![vec![REVISION, VERSION]]),
    ]);
    let m = Metrics::new().expect("metrics");
    let exported = exported(&m);
    let labelled: BTreeSet<&str> = exported
        .iter()
        .filter(|(_, series)| series.keys().any(|labels| !labels.is_empty()))
        .filter_map(|(name, _)| name.strip_prefix("endpoints_guard_"))
        .collect();
    assert_eq!(
        labelled,
        expected.keys().copied().collect(),
        "labelled metrics and their expected label sets differ"
    );
    for (name, series) in expected {
        let got: BTreeSet<Vec<String>> = exported[&format!("endpoints_guard_{name}")]
            .keys()
            .cloned()
            .collect();
        let want: BTreeSet<Vec<String>> = series
            .iter()
            .map(|s| s.iter().map(|v| (*v).to_owned()).collect())
            .collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn enum_label_lists_have_no_repeats() {
    for labels in [
        labels_of(RestartReason::ALL, RestartReason::metric_label),
        labels_of(StaleReason::ALL, StaleReason::metric_label),
        labels_of(
            hardened_watcher::DeletionSource::ALL,
            hardened_watcher::DeletionSource::metric_label,
        ),
    ] {
        let unique: BTreeSet<_> = labels.iter().collect();
        assert_eq!(unique.len(), labels.len(), "{labels:?}");
    }
}

#[test]
fn every_is_the_cross_product_in_order() {
    assert_eq!(
        every(&[&["a", "b"], &["x", "y", "z"]]),
        vec![
            vec!["a", "x"],
            vec!["a", "y"],
            vec!["a", "z"],
            vec!["b", "x"],
            vec!["b", "y"],
            vec!["b", "z"],
        ]
    );
    assert_eq!(every(&[]), vec![Vec::<&str>::new()]);
}
