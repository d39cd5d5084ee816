//! What the watcher reports, as a trait so the metrics module (prometheus)
//! stays out of here. Every method has a no-op default.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::cache::{DeletionSource, DriftKind, StaleReason};
use super::machine::RestartReason;

/// Receives the watcher's counters. `resource` is a bounded `&'static str`
/// ("services", "pods", "endpoints", ...), safe as a metric label.
pub trait WatchObserver: Send + Sync {
    /// A list or watch was restarted.
    fn restart(&self, _resource: &str, _reason: RestartReason) {}
    /// A consistent list was completed and applied as a diff.
    fn relist(&self, _resource: &str) {}
    /// An event (or list item) was older than the cache and ignored.
    fn stale_ignored(&self, _resource: &str, _reason: StaleReason) {}
    /// An event's RV was below the resume point; the resume point stayed.
    fn rv_regression(&self, _resource: &str) {}
    /// An object could not be decoded (or projected) and was skipped.
    fn undecodable(&self, _resource: &str) {}
    /// An RV that cannot be ordered (KEP-5504) was accepted as is.
    fn opaque_rv(&self, _resource: &str) {}
    /// A deletion candidate was produced.
    fn deletion_candidate(&self, _resource: &str, _source: DeletionSource) {}
    /// The cache became (or stopped being) in sync.
    fn synced(&self, _resource: &str, _synced: bool) {}
    /// A resync list found a difference that the watch never explained.
    fn drift(&self, _resource: &str, _kind: DriftKind) {}
    /// A consistent list (or a live read behind a dispute) showed the store
    /// rewound; the cache starts over from the list.
    fn store_rewind(&self, _resource: &str) {}
    /// A read that reaches etcd disproved what the API server's watch cache
    /// served (a lost DELETE or a lost update).
    fn ghost(&self, _resource: &str) {}
    /// The cache's size after a change: live objects and tombstones.
    fn cache_size(&self, _resource: &str, _live: usize, _tombstones: usize) {}
}

/// Counts everything under "method/label" keys; for tests and debugging.
#[derive(Debug, Default)]
pub struct CountingObserver {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl CountingObserver {
    fn bump(&self, resource: &str, what: &str, label: &str) {
        let key = if label.is_empty() {
            format!("{resource}/{what}")
        } else {
            format!("{resource}/{what}/{label}")
        };
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry(key).or_default() += 1;
    }

    /// The count under `resource/what` or `resource/what/label`.
    pub fn get(&self, key: &str) -> u64 {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.get(key).copied().unwrap_or(0)
    }

    /// A copy of all counts.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl WatchObserver for CountingObserver {
    fn restart(&self, resource: &str, reason: RestartReason) {
        self.bump(resource, "restart", reason.metric_label());
    }
    fn relist(&self, resource: &str) {
        self.bump(resource, "relist", "");
    }
    fn stale_ignored(&self, resource: &str, reason: StaleReason) {
        self.bump(resource, "stale", reason.metric_label());
    }
    fn rv_regression(&self, resource: &str) {
        self.bump(resource, "rv_regression", "");
    }
    fn undecodable(&self, resource: &str) {
        self.bump(resource, "undecodable", "");
    }
    fn opaque_rv(&self, resource: &str) {
        self.bump(resource, "opaque_rv", "");
    }
    fn deletion_candidate(&self, resource: &str, source: DeletionSource) {
        self.bump(resource, "deletion_candidate", source.metric_label());
    }
    fn synced(&self, resource: &str, synced: bool) {
        self.bump(resource, "synced", if synced { "true" } else { "false" });
    }
    fn drift(&self, resource: &str, kind: DriftKind) {
        self.bump(resource, "drift", kind.metric_label());
    }
    fn store_rewind(&self, resource: &str) {
        self.bump(resource, "store_rewind", "");
    }
    fn ghost(&self, resource: &str) {
        self.bump(resource, "ghost", "");
    }
}
