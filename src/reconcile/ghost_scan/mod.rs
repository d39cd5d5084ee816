//! The ghost scan: reads that reach etcd, on a request budget, for what the
//! API server's watch cache may hold wrongly.
//!
//! When kube-apiserver's watch cache loses a DELETE (etcd issues 18089 and
//! 19179, kubernetes 123072), every watch and every consistent LIST keeps
//! the object, because since v1.34 a consistent LIST is served from that
//! same cache. Two things reach etcd: the resync's list at an exact
//! resourceVersion, once kube-apiserver's own check has found its cache
//! inconsistent (`hardened_watcher`'s `WatchCore::next_step`; within
//! minutes, where that check runs), and a GET, always. This scan makes the
//! GETs: every pod an address of our Endpoints or an endpoint of our slices
//! points at (those behind ready addresses first: a ghost there takes
//! traffic), and every Service that has either, is read in turn. A pass is
//! spread over `--ghost-scan-period` (so its cost grows with the cluster,
//! and a small cluster is not read through every minute), at least one read
//! every two seconds and at most `--ghost-scan-qps`, made in rounds of up to
//! `ROUND`: the scan finds a ghost within about one period plus
//! `RECHECK_AFTER`, or targets / qps where the cap binds
//! (docs/ghosts.md). Only the leader scans (as only it resyncs): the
//! other replicas act on nothing they would find.
//!
//! A ghost is declared on two reads, `RECHECK_AFTER` apart, that both find
//! the object gone while the cache still holds the same incarnation: a
//! DELETE merely in flight on the watch arrives long before the second read.
//! It then leaves the cache as confirmed gone, its Services are queued, and
//! `endpoints_guard_ghosts_found_total{resource}` counts it.
//!
//! The same read also finds a cache that holds an older state of a live
//! object: etcd's resourceVersion is newer than the cached one. A watch that
//! lost the MODIFIED events of a graceful deletion (the deletionTimestamp, the
//! pod turning unready) keeps publishing an address whose server is about to
//! stop; the resync would find it, but only at its next pass. When the cache
//! is still behind `CATCH_UP` after the read (an event in flight arrives in
//! milliseconds), the object is read whole and put into the cache as a live
//! read, its Services are queued, and
//! `endpoints_guard_ghosts_found_total{resource}` counts it too.
//!
//! After each compaction of etcd, the compaction audit (`compacted.rs`) lists
//! the metadata of pods and Services at the compaction revision, which
//! kube-apiserver serves from etcd, and has the scan read at once the
//! targets that list contradicts: the bound of about two compaction
//! intervals at any size, whether kube-apiserver checks its cache or not.

mod pace;
mod plan;
mod targets;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::Context;
use super::kinds::{self, PodKind, ServiceKind};
use crate::shutdown::stopped;
use hardened_watcher::live::LiveMeta;
use hardened_watcher::{Cached, LiveRead, ObjectKey, Outcome, WatchObserver, live};

/// The second read of a suspected ghost.
const RECHECK_AFTER: Duration = Duration::from_secs(10);

/// How long the watch has to deliver a state the scan found newer in etcd
/// before the cache is repaired from a read: far longer than an event in
/// flight takes, far shorter than a server's drain after its pod is deleted.
const CATCH_UP: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Pod,
    Service,
}

/// Runs `$generic::<K>($args)` (awaited, with `.await`) with `K` the
/// watched kind of `$kind`.
macro_rules! per_kind {
    ($kind:expr, $generic:ident($($arg:expr),*).await) => {
        match $kind {
            Kind::Pod => $generic::<PodKind>($($arg),*).await,
            Kind::Service => $generic::<ServiceKind>($($arg),*).await,
        }
    };
    ($kind:expr, $generic:ident($($arg:expr),*)) => {
        match $kind {
            Kind::Pod => $generic::<PodKind>($($arg),*),
            Kind::Service => $generic::<ServiceKind>($($arg),*),
        }
    };
}

mod compacted;

pub use compacted::CompactionAudit;

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Pod => <PodKind as kinds::Kind>::RESOURCE,
            Kind::Service => <ServiceKind as kinds::Kind>::RESOURCE,
        }
    }
}

#[derive(Clone, Debug)]
struct Target {
    kind: Kind,
    key: ObjectKey,
    /// The incarnation the cache holds.
    uid: String,
}

pub use pace::Pace;
use pace::ROUND_CONCURRENCY;
use plan::{Read, Scan, Verdict, still_behind, verdict};
use targets::targets;

/// Runs the scan, and the compaction audit (`audit.every` zero: off), until
/// shutdown. With the scan's reads off (`qps` 0) the audit's suspects
/// are still read, at the floor's pace.
pub async fn run(
    ctx: Arc<Context>,
    pace: Pace,
    audit: CompactionAudit,
    mut shutdown: watch::Receiver<bool>,
) {
    let scanning = pace.qps > 0.0;
    let mut audit = compacted::Audit::new(audit);
    if !scanning && audit.is_none() {
        return;
    }
    let suspects_only = Pace {
        qps: pace::MIN_QPS,
        period: Duration::ZERO,
    };
    let mut rounds = if scanning { pace } else { suspects_only }.rounds(0);
    let mut next_round = Instant::now();
    let mut scan = Scan {
        pass: VecDeque::new(),
        pass_started: Instant::now(),
        suspects: VecDeque::new(),
        behind: VecDeque::new(),
    };
    loop {
        // A repair is due `CATCH_UP` after its read, not at the next round:
        // the drain of a deleted pod's server may be shorter than a round.
        let mut wake = scan
            .behind
            .front()
            .map_or(next_round, |(at, _, _)| (*at).min(next_round));
        if let Some(audit) = &audit {
            wake = wake.min(audit.next());
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            () = stopped(&mut shutdown) => return,
        }
        let now = Instant::now();
        // Only the leader scans: a replica that does not lead acts on
        // nothing it would find, and its reads would double the cost.
        if !ctx.stores.synced() || !ctx.leading() {
            if now >= next_round {
                next_round = now + rounds.interval;
            }
            if let Some(audit) = &mut audit {
                audit.postpone(now);
            }
            continue;
        }
        if let Some(audit) = &mut audit {
            let found = audit.run_if_due(&ctx, now).await;
            let reads = found
                .into_iter()
                .map(|target| Read::Check {
                    target,
                    second: false,
                })
                .collect();
            run_reads(&ctx, &mut scan, reads).await;
        }
        if now < next_round {
            let repairs = scan.due_repairs(now);
            run_reads(&ctx, &mut scan, repairs).await;
            continue;
        }
        if scanning && scan.pass.is_empty() {
            let took = scan.pass_started.elapsed().as_secs_f64();
            ctx.metrics.ghost_scan_pass_seconds.set(took);
            scan.pass = targets(&ctx).into();
            scan.pass_started = Instant::now();
            rounds = pace.rounds(scan.pass.len());
            debug!(
                targets = scan.pass.len(),
                round_ms = rounds.interval.as_millis(),
                reads_per_round = rounds.reads,
                last_pass_seconds = took,
                "ghost scan: new pass"
            );
        }
        let batch = scan.round(rounds.reads, now);
        run_reads(&ctx, &mut scan, batch).await;
        // A slow round (slow reads) goes on from now rather than catching up.
        next_round = (next_round + rounds.interval).max(Instant::now());
    }
}

/// Makes `reads`, up to `ROUND_CONCURRENCY` at once, and acts on what they
/// found.
async fn run_reads(ctx: &Arc<Context>, scan: &mut Scan, reads: Vec<Read>) {
    if reads.is_empty() {
        return;
    }
    let answers: Vec<_> = futures::stream::iter(reads)
        .map(|read| perform(ctx, read))
        .buffer_unordered(ROUND_CONCURRENCY)
        .collect()
        .await;
    for answer in answers {
        match answer {
            Some((target, Verdict::Suspect, _)) => {
                let at = Instant::now() + RECHECK_AFTER;
                scan.suspects.push_back((at, target));
            }
            Some((target, Verdict::Ghost, _)) => evict(ctx, &target),
            Some((target, Verdict::Behind, found_rv)) => {
                let at = Instant::now() + CATCH_UP;
                scan.behind.push_back((at, target, found_rv));
            }
            Some((_, Verdict::Fine, _)) | None => {}
        }
    }
}

/// Makes one read of a round; for a check, its verdict and etcd's
/// resourceVersion (a repair is done here and returns `None`).
async fn perform(ctx: &Arc<Context>, read: Read) -> Option<(Target, Verdict, String)> {
    match read {
        Read::Check { target, second } => {
            let (verdict, found_rv) = check(ctx, &target, second).await;
            Some((target, verdict, found_rv))
        }
        Read::Repair { target, found_rv } => {
            let cached = cached_meta(ctx, &target);
            let cached = cached.as_ref().map(|(u, r)| (u.as_str(), r.as_str()));
            if still_behind(cached, &target.uid, &found_rv) {
                repair(ctx, &target).await;
            }
            None
        }
    }
}

/// What the cache holds of `target`'s key now: (UID, resourceVersion).
fn cached_meta(ctx: &Context, target: &Target) -> Option<(String, String)> {
    per_kind!(target.kind, cached_meta_of(ctx, &target.key))
}

fn cached_meta_of<K: kinds::Kind>(ctx: &Context, key: &ObjectKey) -> Option<(String, String)> {
    let cached = K::store(&ctx.stores).get(key)?;
    Some((
        cached.uid().to_owned(),
        cached.resource_version().to_owned(),
    ))
}

/// Reads `target`'s metadata and judges the cache by it; with the verdict,
/// the resourceVersion the read found (empty when gone or failed).
async fn check(ctx: &Context, target: &Target, second: bool) -> (Verdict, String) {
    ctx.metrics.ghost_scan_reads.inc();
    let read = per_kind!(target.kind, read_meta(ctx, &target.key).await);
    let found = match read {
        Ok(LiveRead::Found(meta)) => Some(meta),
        Ok(LiveRead::Gone) => None,
        Err(err) => {
            debug!(object = %target.key, resource = target.kind.resource(), error = %err, "ghost scan: read failed; skipped");
            return (Verdict::Fine, String::new());
        }
    };
    let cached = cached_meta(ctx, target);
    let cached = cached.as_ref().map(|(uid, rv)| (uid.as_str(), rv.as_str()));
    let judged = verdict(found.as_ref(), cached, &target.uid, second);
    (
        judged,
        found.map(|m| m.resource_version).unwrap_or_default(),
    )
}

async fn read_meta<K: kinds::Kind>(
    ctx: &Context,
    key: &ObjectKey,
) -> Result<LiveRead<LiveMeta>, kube::Error> {
    live::get_meta::<K::Object>(&ctx.client, &(), key).await
}

/// The cache still holds an older state of `target` than etcd: reads it
/// whole and puts it into the cache as a live read (the watch stays the
/// source of anything newer, see `Store::restore`), then queues its Services.
async fn repair(ctx: &Arc<Context>, target: &Target) {
    let resource = target.kind.resource();
    ctx.metrics.ghost_scan_reads.inc();
    match per_kind!(target.kind, repair_as(ctx, target).await) {
        Ok(true) => {
            ctx.metrics.ghost(resource);
            warn!(object = %target.key, resource, "the watch lost an update: the cache held an older state than etcd; repaired from a live read and its Services queued");
        }
        Ok(false) => {}
        Err(err) => {
            debug!(object = %target.key, resource, error = %err, "ghost scan: repair read failed; the next pass reads it again");
        }
    }
}

/// Whether the read of `target` changed the cache (its change then goes to
/// the kind's handler, as a watch event's would). Gone meanwhile, or another
/// incarnation: the next pass reads it as a suspect.
async fn repair_as<K: kinds::Kind>(
    ctx: &Arc<Context>,
    target: &Target,
) -> Result<bool, kube::Error> {
    let store = K::store(&ctx.stores);
    let stamp = store.read_stamp();
    let LiveRead::Found(obj) = live::get::<K::Object>(&ctx.client, &(), &target.key).await? else {
        return Ok(false);
    };
    let Some(cached) = K::project(obj).filter(|c| c.uid() == target.uid) else {
        return Ok(false);
    };
    match store.restore(cached, &stamp).outcome {
        Outcome::Applied(change) => {
            K::on_change(ctx, &change, Instant::now());
            Ok(true)
        }
        Outcome::Stale(_) | Outcome::Unchanged => Ok(false),
    }
}

fn evict(ctx: &Arc<Context>, target: &Target) {
    let resource = target.kind.resource();
    warn!(object = %target.key, resource, "ghost found: the API server's watch cache holds an object etcd does not; evicted from the cache");
    ctx.metrics.ghost(resource);
    per_kind!(target.kind, evict_as(ctx, target));
    info!(object = %target.key, resource, "ghost evicted; its Services are queued");
}

fn evict_as<K: kinds::Kind>(ctx: &Arc<Context>, target: &Target) {
    if let Some(change) = K::store(&ctx.stores).evict_ghost(&target.key, &target.uid) {
        K::on_change(ctx, &change, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::Kind;

    /// The metric labels of the scan and the audit are the kinds they read.
    #[test]
    fn the_metrics_name_the_scanned_kinds() {
        assert_eq!(
            crate::metrics::SCANNED,
            [Kind::Pod.resource(), Kind::Service.resource()]
        );
    }
}
