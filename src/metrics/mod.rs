//! Prometheus metrics in a registry of our own. Every name starts with
//! `endpoints_guard_`; every label takes values from a fixed set (resource names,
//! reasons, verbs), never object names, so cardinality stays bounded.
//!
//! Every series a labelled metric can have (all combinations of its fixed label
//! sets) is exported at 0 from start-up (`Metrics::export_fixed_series`): a
//! counter's first increment is then an increase Prometheus sees (a series that
//! first appears at 1 has no `increase()`, and an alert on it stays silent). A
//! new label value is one entry in its list: a variant in its enum's `ALL`, or a
//! value in the lists below.

use prometheus::core::{MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::desired::scope::{Invalid, OptInState};
use crate::error::{Error, Result};
use crate::settings::Controller;
use hardened_watcher::{DriftKind, RestartReason, StaleReason};

/// The release, for `endpoints_guard_build_info{version}`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The source revision the binary was built from: `EG_REVISION` at build
/// time (`make build` sets it from git), else `unknown`.
pub const REVISION: &str = match option_env!("EG_REVISION") {
    Some(revision) if !revision.is_empty() => revision,
    _ => "unknown",
};

/// `reason` of `spurious_deletions_prevented_total`: why the deletion the
/// guard refused looked due (the guard maps its evidence to these).
pub mod prevention {
    /// The cache lost the Service through a watch DELETE.
    pub const WATCH_DELETE: &str = "watch_delete";
    /// A relist did not have the Service.
    pub const MISSING_FROM_LIST: &str = "missing_from_list";
    /// The cache never had the Service.
    pub const NOT_IN_CACHE: &str = "not_in_cache";
    /// The cache showed a Service opted out that the API has opted in.
    pub const STALE_OPT_OUT: &str = "stale_opt_out";
    /// The cache showed an opted-in Service without its selector that the
    /// API has with one (or not opted in): upstream's objects stay
    /// upstream's.
    pub const STALE_TAKEOVER: &str = "stale_takeover";
    /// Every value, exported at 0 from start-up.
    pub const ALL: &[&str] = &[
        WATCH_DELETE,
        MISSING_FROM_LIST,
        NOT_IN_CACHE,
        STALE_OPT_OUT,
        STALE_TAKEOVER,
    ];
}

/// `resource`: the watched (and resynced) resources, in the order of
/// `reconcile::kinds::for_each_kind` (a test there holds the two together).
pub const RESOURCES: &[&str] = &["services", "pods", "endpoints", "endpointslices", "nodes"];

/// The resources the ghost scan and the compaction audit read
/// (`reconcile::ghost_scan`, whose test holds the two lists together).
pub const SCANNED: &[&str] = &["pods", "services"];

/// What one audit of one kind did: the metric label of
/// `endpoints_guard_compaction_audits_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditResult {
    /// etcd was not compacted since the last list.
    Unchanged,
    /// etcd's count at a new compaction revision agreed with the cache's:
    /// not listed.
    Counted,
    /// The cache's count at a new compaction revision was not known (it
    /// started after it): not listed; the next revision's counts decide.
    Deferred,
    /// Listed at a new compaction revision.
    Listed,
    /// A request failed, or the revisions are not numbers; tried again next
    /// period.
    Failed,
}

impl AuditResult {
    pub const ALL: [AuditResult; 5] = [
        AuditResult::Unchanged,
        AuditResult::Counted,
        AuditResult::Deferred,
        AuditResult::Listed,
        AuditResult::Failed,
    ];

    pub fn metric_label(self) -> &'static str {
        match self {
            AuditResult::Unchanged => "unchanged",
            AuditResult::Counted => "counted",
            AuditResult::Deferred => "deferred",
            AuditResult::Listed => "listed",
            AuditResult::Failed => "failed",
        }
    }
}

/// `result` of a reconcile.
pub const RESULTS: &[&str] = &["ok", "error"];
/// `verb` of an Endpoints or EndpointSlice write; `kind` of an audit divergence.
pub const VERBS: &[&str] = &["create", "update", "delete"];
/// `scope` of the unmanaged orphan Endpoints count.
pub const ORPHAN_SCOPES: &[&str] = &["cluster"];

/// Every combination of one value from each set, in label order.
fn every(sets: &[&[&'static str]]) -> Vec<Vec<&'static str>> {
    sets.iter().fold(vec![Vec::new()], |acc, set| {
        acc.iter()
            .flat_map(|prefix| {
                set.iter().map(move |v| {
                    let mut series = prefix.clone();
                    series.push(*v);
                    series
                })
            })
            .collect()
    })
}

/// Creates (at 0) the series of `vec` for every combination of `sets`.
fn zero<B: MetricVecBuilder>(
    vec: &MetricVec<B>,
    sets: &[&[&'static str]],
) -> prometheus::Result<()> {
    every(sets)
        .iter()
        .try_for_each(|values| vec.get_metric_with_label_values(values).map(drop))
}

/// The metric labels of every member of an enum's `ALL`.
fn labels_of<T>(all: &[T], label: fn(&T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(label).collect()
}

/// What [`Metrics::register_all`] registers into: the registry, or in the tests
/// a list of what was registered.
trait Register {
    fn register(&self, c: Box<dyn prometheus::core::Collector>) -> prometheus::Result<()>;
}

impl Register for Registry {
    fn register(&self, c: Box<dyn prometheus::core::Collector>) -> prometheus::Result<()> {
        Registry::register(self, c)
    }
}

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub event_to_write: HistogramVec,
    pub event_to_write_answered: HistogramVec,
    pub endpoints_writes: IntCounterVec,
    pub endpointslice_writes: IntCounterVec,
    pub spurious_deletions_prevented: IntCounterVec,
    pub observed_spurious_deletions: IntCounter,
    pub audit_divergences: IntCounterVec,
    pub pod_deletions_held: IntCounterVec,
    pub node_deletions_held: IntCounter,
    pub resync_drift: IntCounterVec,
    pub resync_count_checks: IntCounterVec,
    pub resync_duration: Histogram,
    pub resync_failures: IntCounter,
    pub last_successful_resync: Gauge,
    pub watch_restarts: IntCounterVec,
    pub relists: IntCounterVec,
    pub stale_events_ignored: IntCounterVec,
    pub rv_regressions: IntCounterVec,
    pub undecodable_objects: IntCounterVec,
    pub opaque_resource_versions: IntCounterVec,
    pub cache_objects: IntGaugeVec,
    pub cache_tombstones: IntGaugeVec,
    pub unmanaged_orphans: IntGaugeVec,
    pub queue_depth: IntGaugeVec,
    pub queue_retries: IntCounterVec,
    pub queue_dropped: IntCounterVec,
    pub leader: IntGauge,
    pub events_dropped: IntCounter,
    pub store_rewinds: IntCounterVec,
    pub ghosts_found: IntCounterVec,
    pub ghost_scan_reads: IntCounter,
    pub ghost_scan_pass_seconds: Gauge,
    pub compaction_audits: IntCounterVec,
    pub compaction_audit_suspects: IntCounterVec,
    pub endpoints_restored: IntCounter,
    pub opt_in_frozen: IntGaugeVec,
    pub opted_in_services: IntGaugeVec,
    pub server_newer_than_rules: IntGauge,
}

/// The metrics that describe the process rather than the controller:
/// `process_*` (CPU, memory, file descriptors, start time; read from /proc at
/// each scrape) and `endpoints_guard_build_info{version,revision}` at 1.
fn register_process_and_build(registry: &Registry) -> prometheus::Result<()> {
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    let build_info = IntGaugeVec::new(
        opts(
            "build_info",
            "1, labelled with the endpoints-guard release and the source revision it was built from.",
        ),
        &["version", "revision"],
    )?;
    build_info.with_label_values(&[VERSION, REVISION]).set(1);
    registry.register(Box::new(build_info))
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("endpoints_guard_{name}"), help)
}

/// Buckets of the event-to-write histograms: 50 µs to about 3.3 s, four a
/// doubling (each about 19 % above the last), so a p99 near the 1 ms target
/// is read to within a fifth rather than a factor of two.
fn event_to_write_buckets() -> prometheus::Result<Vec<f64>> {
    prometheus::exponential_buckets(0.000_05, 2f64.powf(0.25), 65)
}

fn hist(name: &str, help: &str, buckets: Vec<f64>) -> HistogramOpts {
    HistogramOpts::new(format!("endpoints_guard_{name}"), help).buckets(buckets)
}

impl Metrics {
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let m = Self::build().map_err(|e| Error::Config(format!("metrics: {e}")))?;
        m.export_fixed_series()
            .map_err(|e| Error::Config(format!("metrics: {e}")))?;
        m.register_all(&registry)
            .map_err(|e| Error::Config(format!("metrics registration: {e}")))?;
        register_process_and_build(&registry)
            .map_err(|e| Error::Config(format!("metrics registration: {e}")))?;
        Ok(Self { registry, ..m })
    }

    fn build() -> prometheus::Result<Self> {
        Ok(Self {
            registry: Registry::new(),
            reconciles: IntCounterVec::new(
                opts(
                    "reconciles_total",
                    "Reconciles of a Service key, by controller and result (ok, error).",
                ),
                &["controller", "result"],
            )?,
            reconcile_errors: IntCounterVec::new(
                opts(
                    "reconcile_errors_total",
                    "Failed reconciles by controller and error class.",
                ),
                &["controller", "error"],
            )?,
            reconcile_duration: HistogramVec::new(
                hist(
                    "reconcile_duration_seconds",
                    "Time spent in one reconcile, by controller.",
                    prometheus::exponential_buckets(0.0005, 2.0, 16)?,
                ),
                &["controller"],
            )?,
            event_to_write: HistogramVec::new(
                hist(
                    "event_to_write_seconds",
                    "From the arrival of the watch event (line, list page or live read) that queued a Service to the moment the first write of the reconcile serving it is sent, by controller. A key queued by several events is measured from the earliest not yet served; a key retried after a failure keeps it.",
                    event_to_write_buckets()?,
                ),
                &["controller"],
            )?,
            event_to_write_answered: HistogramVec::new(
                hist(
                    "event_to_write_answered_seconds",
                    "As event_to_write_seconds, to the moment the API server's answer to that write is read (success or failure), by controller.",
                    event_to_write_buckets()?,
                ),
                &["controller"],
            )?,
            endpoints_writes: IntCounterVec::new(
                opts(
                    "endpoints_writes_total",
                    "Endpoints written, by verb (create, update, delete).",
                ),
                &["verb"],
            )?,
            endpointslice_writes: IntCounterVec::new(
                opts(
                    "endpointslice_writes_total",
                    "EndpointSlices written, by verb (create, update, delete).",
                ),
                &["verb"],
            )?,
            spurious_deletions_prevented: IntCounterVec::new(
                opts(
                    "spurious_deletions_prevented_total",
                    "Deletions of Endpoints or EndpointSlices refused because a live read showed the Service still exists, by controller and by how the cache came to lack it.",
                ),
                &["controller", "reason"],
            )?,
            observed_spurious_deletions: IntCounter::with_opts(opts(
                "observed_spurious_deletions_total",
                "Endpoints deleted by anyone while a live read showed their Service existed.",
            ))?,
            audit_divergences: IntCounterVec::new(
                opts(
                    "audit_divergences_total",
                    "Audit mode: writes endpoints-guard would have made, by controller and kind (create, update, delete).",
                ),
                &["controller", "kind"],
            )?,
            pod_deletions_held: IntCounterVec::new(
                opts(
                    "pod_deletions_held_total",
                    "Pod addresses (endpoints, for slices) kept because a live read showed the same pod still exists after a watch DELETE, by controller.",
                ),
                &["controller"],
            )?,
            node_deletions_held: IntCounter::with_opts(opts(
                "node_deletions_held_total",
                "Nodes missing from the cache that a live read found, so the slice endpoints of pods on them were kept.",
            ))?,
            resync_drift: IntCounterVec::new(
                opts(
                    "resync_drift_total",
                    "Differences the periodic resync found between the cache and the API that the watch never explained (counted once the watch has passed the list's resourceVersion), by resource and kind.",
                ),
                &["resource", "kind"],
            )?,
            resync_count_checks: IntCounterVec::new(
                opts(
                    "resync_count_checks_total",
                    "Resyncs of one resource settled by a count check (one-item LISTs: the store's resourceVersion, then its count at exactly it), by resource and result: matches (no full list), differs or unknown (a full list followed).",
                ),
                &["resource", "result"],
            )?,
            resync_duration: Histogram::with_opts(hist(
                "resync_duration_seconds",
                "Duration of one resync: count checks, and full lists where due.",
                // Up to 5.5 minutes: a paced full resync lasts about
                // 1 / --paced-list-share times its pages' time.
                prometheus::exponential_buckets(0.01, 2.0, 16)?,
            ))?,
            resync_failures: IntCounter::with_opts(opts(
                "resync_failures_total",
                "Full resyncs that failed (the next interval tries again).",
            ))?,
            last_successful_resync: Gauge::with_opts(opts(
                "last_successful_resync_timestamp_seconds",
                "Unix time of the last full resync that completed.",
            ))?,
            watch_restarts: IntCounterVec::new(
                opts(
                    "watch_restarts_total",
                    "Watch restarts by resource and reason.",
                ),
                &["resource", "reason"],
            )?,
            relists: IntCounterVec::new(
                opts("relists_total", "Consistent relists by resource."),
                &["resource"],
            )?,
            stale_events_ignored: IntCounterVec::new(
                opts(
                    "stale_events_ignored_total",
                    "Watch events ignored because they were older than the cached object, by resource and reason.",
                ),
                &["resource", "reason"],
            )?,
            rv_regressions: IntCounterVec::new(
                opts(
                    "rv_regressions_total",
                    "Events whose resourceVersion was lower than the resume point (the resume point was kept).",
                ),
                &["resource"],
            )?,
            undecodable_objects: IntCounterVec::new(
                opts(
                    "undecodable_objects_total",
                    "Objects skipped because they could not be decoded.",
                ),
                &["resource"],
            )?,
            opaque_resource_versions: IntCounterVec::new(
                opts(
                    "opaque_resource_versions_total",
                    "resourceVersions that are not decimal integers (compared as opaque strings).",
                ),
                &["resource"],
            )?,
            cache_objects: IntGaugeVec::new(
                opts("cache_objects", "Objects in the cache, by resource."),
                &["resource"],
            )?,
            cache_tombstones: IntGaugeVec::new(
                opts(
                    "cache_tombstones",
                    "Deletion candidates awaiting confirmation, by resource.",
                ),
                &["resource"],
            )?,
            unmanaged_orphans: IntGaugeVec::new(
                opts(
                    "unmanaged_orphan_endpoints",
                    "Endpoints without a Service that endpoints-guard does not manage and so does not delete.",
                ),
                &["scope"],
            )?,
            queue_depth: IntGaugeVec::new(
                opts("queue_depth", "Keys waiting in a controller's work queue."),
                &["controller"],
            )?,
            queue_retries: IntCounterVec::new(
                opts(
                    "queue_retries_total",
                    "Keys requeued with backoff after a failed reconcile, by controller.",
                ),
                &["controller"],
            )?,
            queue_dropped: IntCounterVec::new(
                opts(
                    "queue_dropped_total",
                    "Keys dropped after too many failed retries (picked up again by the next event or resync), by controller.",
                ),
                &["controller"],
            )?,
            events_dropped: IntCounter::with_opts(opts(
                "events_dropped_total",
                "Kubernetes Events dropped because the publisher was behind (its queue of 256 full).",
            ))?,
            leader: IntGauge::with_opts(opts(
                "leader",
                "1 while this instance holds the leader Lease and may write (always 1 without --leader-elect), else 0.",
            ))?,
            store_rewinds: IntCounterVec::new(
                opts(
                    "store_rewinds_total",
                    "Times a consistent list (or a live read behind a disputed list item) showed the store rewound, e.g. etcd restored from a backup; the cache then started over from the list. By resource.",
                ),
                &["resource"],
            )?,
            ghosts_found: IntCounterVec::new(
                opts(
                    "ghosts_found_total",
                    "Objects the API server's watch cache served in a state etcd does not have (a lost DELETE or a lost update), found by reads that reach etcd and repaired. By resource.",
                ),
                &["resource"],
            )?,
            ghost_scan_reads: IntCounter::with_opts(opts(
                "ghost_scan_reads_total",
                "Reads the ghost scan made (one pass per --ghost-scan-period, at most --ghost-scan-qps a second).",
            ))?,
            ghost_scan_pass_seconds: Gauge::with_opts(opts(
                "ghost_scan_pass_seconds",
                "How long the last complete pass of the ghost scan over every pod named by our Endpoints and every Service with Endpoints took.",
            ))?,
            compaction_audits: IntCounterVec::new(
                opts(
                    "compaction_audits_total",
                    "Compaction audits, by resource and result: unchanged (etcd not compacted since the last), counted (etcd's count at the new compaction revision agreed with the cache's: not listed), deferred (the cache's count there was not known, as it started after it: not listed, the next revision decides), listed (listed at the new compaction revision, read from etcd), failed.",
                ),
                &["resource", "result"],
            )?,
            compaction_audit_suspects: IntCounterVec::new(
                opts(
                    "compaction_audit_suspects_total",
                    "Cached pods and Services whose state etcd contradicted at a compaction revision; each is then read as the ghost scan reads. By resource.",
                ),
                &["resource"],
            )?,
            endpoints_restored: IntCounter::with_opts(opts(
                "endpoints_restored_total",
                "Endpoints of ours that someone else deleted while their Service was handled (kube-controller-manager's Endpoints controller on a stale cache, in opt-in scope), made again.",
            ))?,
            opt_in_frozen: IntGaugeVec::new(
                opts(
                    "opt_in_frozen_services",
                    "Services opted in with an unusable opt-in (selector missing, malformed or empty; a bad label or annotation value; ExternalName), whose published endpoints are left as they are, by reason.",
                ),
                &["reason"],
            )?,
            opted_in_services: IntGaugeVec::new(
                opts(
                    "opted_in_services",
                    "Services opted in (or on their way out), by state: protecting (endpoints-guard alone publishes), beside_upstream and selector_restored (spec.selector present: kube-controller-manager publishes too, protection off), label_removed (no label, no selector: still published from the annotation), opting_out (waiting for upstream to cover ours), frozen (unusable; see opt_in_frozen_services).",
                ),
                &["state"],
            )?,
            server_newer_than_rules: IntGauge::with_opts(opts(
                "server_newer_than_rules",
                "1 when the API server's minor is newer than the newest release whose rules endpoints-guard has: it runs with the newest rules, which may differ from that kube-controller-manager's.",
            ))?,
        })
    }

    /// Exports every labelled metric's series at 0, from the fixed label sets:
    /// one line per labelled metric (the tests fail on a labelled metric left out).
    fn export_fixed_series(&self) -> prometheus::Result<()> {
        let restart = labels_of(RestartReason::ALL, RestartReason::metric_label);
        let stale = labels_of(StaleReason::ALL, StaleReason::metric_label);
        let drift = labels_of(DriftKind::ALL, DriftKind::metric_label);
        let controllers = labels_of(&Controller::ALL, |c| c.metric_label());
        zero(&self.reconciles, &[&controllers, RESULTS])?;
        zero(
            &self.reconcile_errors,
            &[&controllers, Error::METRIC_LABELS],
        )?;
        zero(&self.reconcile_duration, &[&controllers])?;
        zero(&self.event_to_write, &[&controllers])?;
        zero(&self.event_to_write_answered, &[&controllers])?;
        zero(&self.endpoints_writes, &[VERBS])?;
        zero(&self.endpointslice_writes, &[VERBS])?;
        zero(
            &self.spurious_deletions_prevented,
            &[&controllers, prevention::ALL],
        )?;
        zero(&self.audit_divergences, &[&controllers, VERBS])?;
        zero(&self.pod_deletions_held, &[&controllers])?;
        zero(&self.queue_retries, &[&controllers])?;
        zero(&self.queue_dropped, &[&controllers])?;
        zero(&self.resync_drift, &[RESOURCES, &drift])?;
        zero(
            &self.resync_count_checks,
            &[RESOURCES, &["matches", "differs", "unknown"]],
        )?;
        zero(&self.watch_restarts, &[RESOURCES, &restart])?;
        zero(&self.relists, &[RESOURCES])?;
        zero(&self.stale_events_ignored, &[RESOURCES, &stale])?;
        zero(&self.rv_regressions, &[RESOURCES])?;
        zero(&self.undecodable_objects, &[RESOURCES])?;
        zero(&self.opaque_resource_versions, &[RESOURCES])?;
        zero(&self.cache_objects, &[RESOURCES])?;
        zero(&self.cache_tombstones, &[RESOURCES])?;
        zero(&self.unmanaged_orphans, &[ORPHAN_SCOPES])?;
        zero(&self.queue_depth, &[&controllers])?;
        zero(&self.store_rewinds, &[RESOURCES])?;
        zero(&self.ghosts_found, &[RESOURCES])?;
        zero(
            &self.compaction_audits,
            &[SCANNED, &labels_of(&AuditResult::ALL, |r| r.metric_label())],
        )?;
        zero(&self.compaction_audit_suspects, &[SCANNED])?;
        zero(
            &self.opt_in_frozen,
            &[&labels_of(&Invalid::ALL, |i| i.metric_label())],
        )?;
        zero(
            &self.opted_in_services,
            &[&labels_of(&OptInState::ALL, |s| s.metric_label())],
        )?;
        Ok(())
    }

    fn register_all(&self, r: &impl Register) -> prometheus::Result<()> {
        r.register(Box::new(self.reconciles.clone()))?;
        r.register(Box::new(self.reconcile_errors.clone()))?;
        r.register(Box::new(self.reconcile_duration.clone()))?;
        r.register(Box::new(self.event_to_write.clone()))?;
        r.register(Box::new(self.event_to_write_answered.clone()))?;
        r.register(Box::new(self.endpoints_writes.clone()))?;
        r.register(Box::new(self.endpointslice_writes.clone()))?;
        r.register(Box::new(self.spurious_deletions_prevented.clone()))?;
        r.register(Box::new(self.observed_spurious_deletions.clone()))?;
        r.register(Box::new(self.audit_divergences.clone()))?;
        r.register(Box::new(self.pod_deletions_held.clone()))?;
        r.register(Box::new(self.node_deletions_held.clone()))?;
        r.register(Box::new(self.resync_drift.clone()))?;
        r.register(Box::new(self.resync_count_checks.clone()))?;
        r.register(Box::new(self.resync_duration.clone()))?;
        r.register(Box::new(self.resync_failures.clone()))?;
        r.register(Box::new(self.last_successful_resync.clone()))?;
        r.register(Box::new(self.watch_restarts.clone()))?;
        r.register(Box::new(self.relists.clone()))?;
        r.register(Box::new(self.stale_events_ignored.clone()))?;
        r.register(Box::new(self.rv_regressions.clone()))?;
        r.register(Box::new(self.undecodable_objects.clone()))?;
        r.register(Box::new(self.opaque_resource_versions.clone()))?;
        r.register(Box::new(self.cache_objects.clone()))?;
        r.register(Box::new(self.cache_tombstones.clone()))?;
        r.register(Box::new(self.unmanaged_orphans.clone()))?;
        r.register(Box::new(self.queue_depth.clone()))?;
        r.register(Box::new(self.queue_retries.clone()))?;
        r.register(Box::new(self.queue_dropped.clone()))?;
        r.register(Box::new(self.leader.clone()))?;
        r.register(Box::new(self.events_dropped.clone()))?;
        r.register(Box::new(self.store_rewinds.clone()))?;
        r.register(Box::new(self.ghosts_found.clone()))?;
        r.register(Box::new(self.ghost_scan_reads.clone()))?;
        r.register(Box::new(self.ghost_scan_pass_seconds.clone()))?;
        r.register(Box::new(self.compaction_audits.clone()))?;
        r.register(Box::new(self.compaction_audit_suspects.clone()))?;
        r.register(Box::new(self.endpoints_restored.clone()))?;
        r.register(Box::new(self.opt_in_frozen.clone()))?;
        r.register(Box::new(self.opted_in_services.clone()))?;
        r.register(Box::new(self.server_newer_than_rules.clone()))?;
        Ok(())
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Result<String> {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(|e| Error::Config(format!("encoding metrics: {e}")))?;
        String::from_utf8(buf).map_err(|e| Error::Config(format!("encoding metrics: {e}")))
    }

    /// One compaction audit of `resource` ended as `result`.
    pub(crate) fn compaction_audit(&self, resource: &str, result: AuditResult) {
        self.compaction_audits
            .with_label_values(&[resource, result.metric_label()])
            .inc();
    }

    /// A compaction audit of `resource` found `found` suspects.
    pub(crate) fn compaction_audit_suspects(&self, resource: &str, found: usize) {
        self.compaction_audit_suspects
            .with_label_values(&[resource])
            .inc_by(u64::try_from(found).unwrap_or(u64::MAX));
    }
}

impl hardened_watcher::WatchObserver for Metrics {
    fn restart(&self, resource: &str, reason: hardened_watcher::RestartReason) {
        self.watch_restarts
            .with_label_values(&[resource, reason.metric_label()])
            .inc();
    }
    fn relist(&self, resource: &str) {
        self.relists.with_label_values(&[resource]).inc();
    }
    fn stale_ignored(&self, resource: &str, reason: hardened_watcher::StaleReason) {
        self.stale_events_ignored
            .with_label_values(&[resource, reason.metric_label()])
            .inc();
    }
    fn rv_regression(&self, resource: &str) {
        self.rv_regressions.with_label_values(&[resource]).inc();
    }
    fn undecodable(&self, resource: &str) {
        self.undecodable_objects
            .with_label_values(&[resource])
            .inc();
    }
    fn opaque_rv(&self, resource: &str) {
        self.opaque_resource_versions
            .with_label_values(&[resource])
            .inc();
    }
    fn drift(&self, resource: &str, kind: hardened_watcher::DriftKind) {
        self.resync_drift
            .with_label_values(&[resource, kind.metric_label()])
            .inc();
    }
    fn store_rewind(&self, resource: &str) {
        self.store_rewinds.with_label_values(&[resource]).inc();
    }
    fn ghost(&self, resource: &str) {
        self.ghosts_found.with_label_values(&[resource]).inc();
    }
    fn cache_size(&self, resource: &str, live: usize, tombstones: usize) {
        let gauge = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.cache_objects
            .with_label_values(&[resource])
            .set(gauge(live));
        self.cache_tombstones
            .with_label_values(&[resource])
            .set(gauge(tombstones));
    }
}

#[cfg(test)]
mod tests;
