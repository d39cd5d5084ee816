//! Prometheus metrics in a registry of our own. Every name starts with
//! `endpoints_guard_`; every label takes values from a fixed set (resource names,
//! reasons, verbs), never object names, so cardinality stays bounded.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::error::{Error, Result};

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: Histogram,
    pub endpoints_writes: IntCounterVec,
    pub spurious_deletions_prevented: IntCounterVec,
    pub observed_spurious_deletions: IntCounter,
    pub audit_divergences: IntCounterVec,
    pub pod_deletions_held: IntCounter,
    pub resync_drift: IntCounterVec,
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
    pub queue_retries: IntCounter,
    pub queue_dropped: IntCounter,
    pub leader: IntGauge,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("endpoints_guard_{name}"), help)
}

fn hist(name: &str, help: &str, buckets: Vec<f64>) -> HistogramOpts {
    HistogramOpts::new(format!("endpoints_guard_{name}"), help).buckets(buckets)
}

impl Metrics {
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let m = Self::build().map_err(|e| Error::Config(format!("metrics: {e}")))?;
        m.register_all(&registry)
            .map_err(|e| Error::Config(format!("metrics registration: {e}")))?;
        Ok(Self { registry, ..m })
    }

    fn build() -> prometheus::Result<Self> {
        Ok(Self {
            registry: Registry::new(),
            reconciles: IntCounterVec::new(
                opts(
                    "reconciles_total",
                    "Reconciles of a Service key, by result (ok, error).",
                ),
                &["result"],
            )?,
            reconcile_errors: IntCounterVec::new(
                opts(
                    "reconcile_errors_total",
                    "Failed reconciles by error class.",
                ),
                &["error"],
            )?,
            reconcile_duration: Histogram::with_opts(hist(
                "reconcile_duration_seconds",
                "Time spent in one reconcile.",
                prometheus::exponential_buckets(0.0005, 2.0, 16)?,
            ))?,
            endpoints_writes: IntCounterVec::new(
                opts(
                    "endpoints_writes_total",
                    "Endpoints written, by verb (create, update, delete).",
                ),
                &["verb"],
            )?,
            spurious_deletions_prevented: IntCounterVec::new(
                opts(
                    "spurious_deletions_prevented_total",
                    "Endpoints deletions refused because a live read showed the Service still exists, by how the cache came to lack it.",
                ),
                &["reason"],
            )?,
            observed_spurious_deletions: IntCounter::with_opts(opts(
                "observed_spurious_deletions_total",
                "Endpoints deleted by anyone while a live read showed their Service existed.",
            ))?,
            audit_divergences: IntCounterVec::new(
                opts(
                    "audit_divergences_total",
                    "Audit mode: writes endpoints-guard would have made, by kind (create, update, delete).",
                ),
                &["kind"],
            )?,
            pod_deletions_held: IntCounter::with_opts(opts(
                "pod_deletions_held_total",
                "Pod addresses kept because a live read showed the same pod still exists after a watch DELETE.",
            ))?,
            resync_drift: IntCounterVec::new(
                opts(
                    "resync_drift_total",
                    "Differences the periodic resync found between the cache and the API, by resource and kind.",
                ),
                &["resource", "kind"],
            )?,
            resync_duration: Histogram::with_opts(hist(
                "resync_duration_seconds",
                "Duration of one full resync diff.",
                prometheus::exponential_buckets(0.01, 2.0, 14)?,
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
                opts("queue_depth", "Keys waiting in the work queue."),
                &["queue"],
            )?,
            queue_retries: IntCounter::with_opts(opts(
                "queue_retries_total",
                "Keys requeued with backoff after a failed reconcile.",
            ))?,
            queue_dropped: IntCounter::with_opts(opts(
                "queue_dropped_total",
                "Keys dropped after too many failed retries (picked up again by the next event or resync).",
            ))?,
            leader: IntGauge::with_opts(opts(
                "leader",
                "1 while this instance holds the leader Lease and may write (always 1 without --leader-elect), else 0.",
            ))?,
        })
    }

    fn register_all(&self, r: &Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.reconciles.clone()))?;
        r.register(Box::new(self.reconcile_errors.clone()))?;
        r.register(Box::new(self.reconcile_duration.clone()))?;
        r.register(Box::new(self.endpoints_writes.clone()))?;
        r.register(Box::new(self.spurious_deletions_prevented.clone()))?;
        r.register(Box::new(self.observed_spurious_deletions.clone()))?;
        r.register(Box::new(self.audit_divergences.clone()))?;
        r.register(Box::new(self.pod_deletions_held.clone()))?;
        r.register(Box::new(self.resync_drift.clone()))?;
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
}

impl crate::watch::WatchObserver for Metrics {
    fn restart(&self, resource: &'static str, reason: crate::watch::RestartReason) {
        self.watch_restarts
            .with_label_values(&[resource, reason.metric_label()])
            .inc();
    }
    fn relist(&self, resource: &'static str) {
        self.relists.with_label_values(&[resource]).inc();
    }
    fn stale_ignored(&self, resource: &'static str, reason: crate::watch::StaleReason) {
        self.stale_events_ignored
            .with_label_values(&[resource, reason.metric_label()])
            .inc();
    }
    fn rv_regression(&self, resource: &'static str) {
        self.rv_regressions.with_label_values(&[resource]).inc();
    }
    fn undecodable(&self, resource: &'static str) {
        self.undecodable_objects
            .with_label_values(&[resource])
            .inc();
    }
    fn opaque_rv(&self, resource: &'static str) {
        self.opaque_resource_versions
            .with_label_values(&[resource])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_names() {
        let m = Metrics::new().expect("metrics");
        m.spurious_deletions_prevented
            .with_label_values(&["watch_delete"])
            .inc();
        let text = m.render().expect("render");
        assert!(text.contains(
            "endpoints_guard_spurious_deletions_prevented_total{reason=\"watch_delete\"} 1"
        ));
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(
                line.starts_with("endpoints_guard_"),
                "unprefixed metric: {line}"
            );
        }
    }
}
