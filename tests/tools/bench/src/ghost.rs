//! The ghost phase: one pod's DELETE lost between etcd and kube-apiserver's
//! watch cache (docs/ghosts.md), while the measured controller runs.
//!
//! etcd-fault-proxy, between kube-apiserver and etcd, drops the watch events
//! of one pod's key; the pod is then force-deleted. etcd no longer has it,
//! but the watch cache keeps serving it to every watch and consistent LIST
//! until kube-apiserver restarts. The figure is the time from the delete
//! until the bench's observer (its own watch of the Endpoints or
//! EndpointSlices, whose events are not dropped) sees the pod's address in
//! none of them. The pod is one whose address churn left ready, so it takes
//! traffic while it is a ghost. Afterwards the fault is cleared,
//! kube-apiserver restarted (its new watch cache is built from etcd, without
//! the ghost) and the pod created again, Ready, so the next controller starts
//! from the same workload.

use std::collections::BTreeMap;

use anyhow::Result;
use kube::Client;
use serde::{Deserialize, Serialize};

/// What the ghost phase of one run found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ghost {
    /// The pod (`namespace/name`) deleted with its watch events dropped.
    pub pod: String,
    /// How long the bench waited for its address to go.
    pub timeout_s: f64,
    /// Seconds from the delete until its address had left every object of
    /// the kind; `None`: still listed when `timeout_s` ran out.
    pub found_s: Option<f64>,
    /// kube-apiserver's failed consistency checks of its pod cache
    /// (`apiserver_storage_consistency_checks_total{resource="pods",
    /// status="failure"}`) when the wait ended: 0 means it had not yet found
    /// its cache wrong, so an exact list it served from etcd came from
    /// compaction having removed the cache's snapshots. `None`: not read.
    pub apiserver_check_failures: Option<u64>,
    /// endpoints-guard's resyncs finished during the wait (`None` for
    /// kube-controller-manager).
    pub resyncs: Option<u64>,
    /// endpoints-guard's ghost-scan reads during the wait.
    pub ghost_scan_reads: Option<u64>,
    /// The controller's API requests during the wait, by verb and resource.
    pub requests_by_resource: BTreeMap<String, u64>,
    /// Seconds to restore the workload afterwards: the fault cleared,
    /// kube-apiserver restarted, the pod created again and every Service's
    /// objects correct again.
    pub restore_s: f64,
}

/// The pod the ghost phase deletes: the last, in churn order, whose
/// readiness churn left ready after `flips` flips of `pods` pods in turn
/// (churn flips pod `k % pods` at its `k`-th flip). Without churn reaching
/// it, that is the last pod. `None` when there is no pod.
pub fn pod_index(pods: usize, flips: u64) -> Option<usize> {
    (0..pods).rev().find(|&i| {
        let i = i as u64;
        let flipped = if i < flips {
            (flips - 1 - i) / pods as u64 + 1
        } else {
            0
        };
        flipped.is_multiple_of(2)
    })
}

/// kube-apiserver's failed consistency checks of its pod cache so far.
pub async fn apiserver_check_failures(client: &Client) -> Result<u64> {
    let text = super::plane::apiserver_metrics(client).await?;
    let failures = eg_workload::procstat::metric(
        &text,
        "apiserver_storage_consistency_checks_total{resource=\"pods\",status=\"failure\"}",
    );
    // The series appears with the first failure.
    Ok(failures.unwrap_or(0.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ghost_is_a_pod_churn_left_ready() {
        // Churn stopped before the last pod: that one.
        assert_eq!(pod_index(1000, 600), Some(999));
        assert_eq!(pod_index(10, 0), Some(9));
        // Every pod flipped an even number of times: all ready, the last.
        assert_eq!(pod_index(100, 600), Some(99));
        // Pods 0-49 flipped twice (ready), 50-99 once (not ready).
        assert_eq!(pod_index(100, 150), Some(49));
        // One pod, flipped once: none is ready.
        assert_eq!(pod_index(1, 1), None);
        assert_eq!(pod_index(0, 0), None);
    }
}
