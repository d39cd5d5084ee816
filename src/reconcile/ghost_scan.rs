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
//! (docs/ghosts.md).
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

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::Context;
use super::kinds::{self, PodKind, ServiceKind};
use crate::shutdown::stopped;
use hardened_watcher::live::LiveMeta;
use hardened_watcher::{Cached, LiveRead, ObjectKey, Outcome, WatchObserver, compare_rv, live};

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

/// What the scan does with one answer.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The cache is right (or moved on since).
    Fine,
    /// Gone in etcd, still cached: read again later.
    Suspect,
    /// Confirmed: evict.
    Ghost,
    /// The same incarnation, newer in etcd than in the cache: repair unless
    /// the watch catches up first.
    Behind,
}

/// What the cache holds of a target now: its UID and resourceVersion.
type CachedMeta<'a> = Option<(&'a str, &'a str)>;

/// The rule, pure: `found` is what the read found (`None`: gone), `cached`
/// what the cache holds now, `second` whether this was the re-read of a
/// suspect.
fn verdict(
    found: Option<&LiveMeta>,
    cached: CachedMeta<'_>,
    target_uid: &str,
    second: bool,
) -> Verdict {
    if cached.is_none_or(|(uid, _)| uid != target_uid) {
        // The cache moved on (a DELETE arrived, or another incarnation).
        return Verdict::Fine;
    }
    match found {
        // Equal, older (the watch is ahead of the read) or opaque RVs
        // (nothing to compare: the resync covers them) are fine.
        Some(meta) if meta.uid == target_uid => {
            if still_behind(cached, target_uid, &meta.resource_version) {
                Verdict::Behind
            } else {
                Verdict::Fine
            }
        }
        // etcd holds another incarnation: the cached one is dead.
        Some(_) => Verdict::Ghost,
        None if second => Verdict::Ghost,
        None => Verdict::Suspect,
    }
}

/// Whether the cache, holding `cached` now, is still behind the state
/// `found_rv` a read found for incarnation `uid` (pure).
fn still_behind(cached: CachedMeta<'_>, uid: &str, found_rv: &str) -> bool {
    cached.is_some_and(|(cached_uid, cached_rv)| {
        cached_uid == uid && compare_rv(found_rv, cached_rv) == Some(std::cmp::Ordering::Greater)
    })
}

/// The slowest the scan reads while it has targets: however long the period,
/// a small cluster is read through in minutes, at a negligible cost.
const MIN_QPS: f64 = 0.5;

/// The reads due in this long are made together, as one round. A read made
/// alone, after the process has gone idle, costs about twice the CPU of one
/// made beside others (thread wake-ups, the connection's buffers gone cold:
/// `eg-readcost`, docs/bench.md); a round delays a read by at most this.
const ROUND: Duration = Duration::from_secs(5);

/// The most reads of a round in flight at once (each holds a connection).
const ROUND_CONCURRENCY: usize = 4;

/// How the scan spends its reads.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The most reads a second (0: the scan is off).
    pub qps: f64,
    /// One pass over all targets is spread over this long (0: as fast as
    /// `qps` allows).
    pub period: Duration,
}

/// When the scan reads: every `interval`, `reads` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rounds {
    interval: Duration,
    reads: usize,
}

impl Pace {
    /// The wait between two reads of a pass over `targets`: the pass spread
    /// over `period`, never slower than `MIN_QPS` reads a second and never
    /// faster than `qps`. The read rate grows with the cluster until `qps`
    /// caps it, so a small cluster is not read through every few seconds.
    fn gap(self, targets: usize) -> Duration {
        let fastest = Duration::from_secs_f64(1.0 / self.qps);
        let slowest = Duration::from_secs_f64(1.0 / MIN_QPS).max(fastest);
        let spread = self
            .period
            .checked_div(u32::try_from(targets.max(1)).unwrap_or(u32::MAX))
            .unwrap_or(Duration::ZERO);
        spread.clamp(fastest, slowest)
    }

    /// The same reads a second as [`Pace::gap`], grouped into rounds of at
    /// most `ROUND` and never longer than one period (a short period is a
    /// request for a short detection bound): the whole reads that fit, and
    /// a round exactly that many gaps long, so the rate is the gap's.
    fn rounds(self, targets: usize) -> Rounds {
        let gap = self.gap(targets);
        let longest = ROUND.min(self.period).max(gap);
        // A round holds at least one read; f64 → u32 saturates.
        let reads = ((longest.as_secs_f64() / gap.as_secs_f64()).floor() as u32).max(1);
        Rounds {
            interval: gap.saturating_mul(reads),
            reads: reads as usize,
        }
    }
}

/// One read of a round.
enum Read {
    /// A target of the pass, or (`second`) the re-read of a suspect.
    Check { target: Target, second: bool },
    /// A target whose cache was behind etcd's `found_rv`: read whole if it
    /// still is.
    Repair { target: Target, found_rv: String },
}

/// What the scan carries from round to round.
struct Scan {
    pass: VecDeque<Target>,
    pass_started: Instant,
    suspects: VecDeque<(Instant, Target)>,
    /// (when to look again, the target, the resourceVersion etcd had).
    behind: VecDeque<(Instant, Target, String)>,
}

impl Scan {
    /// Up to `reads` reads for this round: rechecks that are due first, then
    /// the pass. A pass that ends mid-round is not started again until the
    /// next round, so no target is read twice in one.
    /// The repairs due by `now`, between rounds.
    fn due_repairs(&mut self, now: Instant) -> Vec<Read> {
        let mut out = Vec::new();
        while self.behind.front().is_some_and(|(at, _, _)| *at <= now)
            && let Some((_, target, found_rv)) = self.behind.pop_front()
        {
            out.push(Read::Repair { target, found_rv });
        }
        out
    }

    fn round(&mut self, reads: usize, now: Instant) -> Vec<Read> {
        let mut out = Vec::with_capacity(reads);
        while out.len() < reads {
            if self.behind.front().is_some_and(|(at, _, _)| *at <= now)
                && let Some((_, target, found_rv)) = self.behind.pop_front()
            {
                out.push(Read::Repair { target, found_rv });
            } else if self.suspects.front().is_some_and(|(at, _)| *at <= now)
                && let Some((_, target)) = self.suspects.pop_front()
            {
                out.push(Read::Check {
                    target,
                    second: true,
                });
            } else if let Some(target) = self.pass.pop_front() {
                out.push(Read::Check {
                    target,
                    second: false,
                });
            } else {
                break;
            }
        }
        out
    }
}

/// Runs the scan until shutdown.
pub async fn run(ctx: Arc<Context>, pace: Pace, mut shutdown: watch::Receiver<bool>) {
    if pace.qps <= 0.0 {
        return;
    }
    let mut rounds = pace.rounds(0);
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
        let wake = scan
            .behind
            .front()
            .map_or(next_round, |(at, _, _)| (*at).min(next_round));
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            () = stopped(&mut shutdown) => return,
        }
        let now = Instant::now();
        if !ctx.stores.synced() {
            if now >= next_round {
                next_round = now + rounds.interval;
            }
            continue;
        }
        if now < next_round {
            let repairs = scan.due_repairs(now);
            run_reads(&ctx, &mut scan, repairs).await;
            continue;
        }
        if scan.pass.is_empty() {
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

/// Every pod an address of our Endpoints or an endpoint of our slices names,
/// and every Service with Endpoints or slices of ours, that the caches hold
/// now; each once. Pods behind a ready address come first: a ghost among
/// them is where traffic goes and fails, so a pass reads them before the
/// rest (not-ready and terminating pods, Services).
fn targets(ctx: &Context) -> Vec<Target> {
    let managers = ctx.scope.managers();
    // (Service key, the pods its objects name, each with whether it is
    // named by a ready address), from either controller.
    let mut named: Vec<(ObjectKey, Vec<(String, bool)>)> = Vec::new();
    let endpoints: Vec<_> = ctx
        .stores
        .endpoints
        .read()
        .iter()
        .filter(|ep| managers.endpoints(ep.managed_by()))
        .cloned()
        .collect();
    for ep in endpoints {
        let Ok(decoded) = ep.decode() else { continue };
        let subsets = decoded.subsets.iter().flatten();
        let pods = subsets
            .flat_map(|s| {
                let ready = s.addresses.iter().flatten().map(|a| (a, true));
                let not_ready = s.not_ready_addresses.iter().flatten().map(|a| (a, false));
                ready.chain(not_ready)
            })
            .filter_map(|(address, ready)| {
                let target = address.target_ref.as_ref()?;
                (target.kind.as_deref() == Some("Pod")).then_some(())?;
                Some((target.name.clone()?, ready))
            })
            .collect();
        named.push((ep.key(), pods));
    }
    let slices: Vec<_> = ctx
        .stores
        .slices
        .read()
        .iter()
        .filter(|s| s.is_ours(managers))
        .cloned()
        .collect();
    for slice in slices {
        let (Some(key), Ok(decoded)) = (slice.service_key(), slice.decode()) else {
            continue;
        };
        let pods = decoded
            .endpoints
            .iter()
            .flatten()
            .filter_map(|endpoint| {
                let target = endpoint.target_ref.as_ref()?;
                (target.kind.as_deref() == Some("Pod")).then_some(())?;
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                Some((target.name.clone()?, ready))
            })
            .collect();
        named.push((key, pods));
    }

    let services = ctx.stores.services.read();
    let pods = ctx.stores.pods.read();
    let mut seen: HashSet<(Kind, ObjectKey)> = HashSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    // Ready before not ready, so a pod named both ways counts as ready.
    let ordered = named.iter().flat_map(|(key, pods)| {
        pods.iter()
            .filter(|(_, ready)| *ready)
            .map(move |(name, _)| (key, name, true))
    });
    let not_ready = named.iter().flat_map(|(key, pods)| {
        pods.iter()
            .filter(|(_, ready)| !*ready)
            .map(move |(name, _)| (key, name, false))
    });
    for (key, name, ready) in ordered.chain(not_ready) {
        let pod_key = ObjectKey::new(key.namespace.clone(), name.as_str());
        if let Some(pod) = pods.get(&pod_key)
            && seen.insert((Kind::Pod, pod_key.clone()))
        {
            let target = Target {
                kind: Kind::Pod,
                uid: pod.uid().to_owned(),
                key: pod_key,
            };
            if ready {
                first.push(target)
            } else {
                rest.push(target)
            }
        }
    }
    for (key, _) in &named {
        if let Some(svc) = services.get(key)
            && seen.insert((Kind::Service, key.clone()))
        {
            rest.push(Target {
                kind: Kind::Service,
                uid: svc.uid().to_owned(),
                key: key.clone(),
            });
        }
    }
    first.extend(rest);
    first
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
    use super::*;

    #[test]
    fn a_pass_is_spread_over_the_period_within_one_read_every_two_seconds_and_qps() {
        let pace = Pace {
            qps: 20.0,
            period: Duration::from_secs(900),
        };
        let ms = |targets| pace.gap(targets).as_millis();
        // A few targets: one read every two seconds, not one per 900 s / 3.
        assert_eq!(ms(3), 2000);
        assert_eq!(ms(0), 2000);
        // 1,100 targets (100 Services × 1,000 pods): 900 s / 1,100.
        assert_eq!(ms(1_100), 818);
        // 11,000: 12.2 reads a second.
        assert_eq!(ms(11_000), 81);
        // 110,000: capped at 20 reads a second, the pass takes 5,500 s.
        assert_eq!(ms(110_000), 50);
        // Period 0: as fast as qps allows, at any size.
        let flat = Pace {
            qps: 20.0,
            period: Duration::ZERO,
        };
        assert_eq!(flat.gap(3).as_millis(), 50);
        // A budget below one read a second is kept.
        let slow = Pace {
            qps: 0.5,
            period: Duration::from_secs(900),
        };
        assert_eq!(slow.gap(3).as_millis(), 2000);
    }

    #[test]
    fn reads_are_grouped_into_rounds_at_the_same_rate() {
        let pace = Pace {
            qps: 20.0,
            period: Duration::from_secs(900),
        };
        let rounds = |targets| {
            let r = pace.rounds(targets);
            (r.interval.as_millis(), r.reads)
        };
        // One read every two seconds, two at a time.
        assert_eq!(rounds(3), (4_000, 2));
        // 1,100 targets: 1.22 reads a second, six every 4.9 s.
        assert_eq!(rounds(1_100), (4_909, 6));
        // The qps cap: 20 a second, a hundred every 5 s.
        assert_eq!(rounds(110_000), (5_000, 100));
        // A period shorter than a round: one round per period.
        let short = Pace {
            qps: 20.0,
            period: Duration::from_secs(2),
        };
        assert_eq!(short.rounds(4).interval.as_millis(), 2_000);
        assert_eq!(short.rounds(4).reads, 4);
        // Period 0: one read per gap, as fast as qps allows.
        let flat = Pace {
            qps: 20.0,
            period: Duration::ZERO,
        };
        assert_eq!(flat.rounds(3).interval.as_millis(), 50);
        assert_eq!(flat.rounds(3).reads, 1);
    }

    fn target(name: &str) -> Target {
        Target {
            kind: Kind::Pod,
            key: ObjectKey::new("ns", name),
            uid: format!("uid-{name}"),
        }
    }

    fn names(reads: &[Read]) -> Vec<String> {
        reads
            .iter()
            .map(|read| match read {
                Read::Check { target, second } => {
                    format!("{}{}", target.key.name, if *second { " again" } else { "" })
                }
                Read::Repair { target, .. } => format!("{} repair", target.key.name),
            })
            .collect()
    }

    #[test]
    fn a_round_takes_due_rechecks_first_and_reads_no_target_twice() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut scan = Scan {
            pass: ["a", "b", "c"].map(target).into(),
            pass_started: now,
            suspects: [(now, target("s")), (later, target("t"))].into(),
            behind: [(now, target("r"), "12".to_string())].into(),
        };
        assert_eq!(
            names(&scan.round(3, now)),
            ["r repair", "s again", "a"],
            "due rechecks first, then the pass"
        );
        assert_eq!(
            names(&scan.round(5, now)),
            ["b", "c"],
            "the pass ends: the round ends, a suspect not yet due waits"
        );
        assert_eq!(names(&scan.round(5, later)), ["t again"]);

        // Between rounds, only the repairs that are due.
        scan.behind = [
            (now, target("x"), "3".to_string()),
            (later, target("y"), "4".to_string()),
        ]
        .into();
        assert_eq!(names(&scan.due_repairs(now)), ["x repair"]);
        assert!(scan.due_repairs(now).is_empty());
        assert_eq!(names(&scan.due_repairs(later)), ["y repair"]);
    }

    #[test]
    fn a_ghost_takes_two_reads_a_newer_state_is_behind_and_a_cache_that_moved_on_is_fine() {
        let meta = |uid: &str, rv: &str| LiveMeta {
            uid: uid.into(),
            resource_version: rv.into(),
        };
        let cases = [
            (
                "found, same state",
                Some(meta("u1", "10")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "the watch is ahead of the read",
                Some(meta("u1", "9")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "etcd holds a newer state",
                Some(meta("u1", "12")),
                Some(("u1", "10")),
                false,
                Verdict::Behind,
            ),
            (
                "opaque resourceVersions",
                Some(meta("u1", "x")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "gone once: suspect",
                None,
                Some(("u1", "10")),
                false,
                Verdict::Suspect,
            ),
            (
                "gone twice: ghost",
                None,
                Some(("u1", "10")),
                true,
                Verdict::Ghost,
            ),
            (
                "another incarnation in etcd",
                Some(meta("u2", "3")),
                Some(("u1", "10")),
                false,
                Verdict::Ghost,
            ),
            (
                "the DELETE arrived meanwhile",
                None,
                None,
                true,
                Verdict::Fine,
            ),
            (
                "the cache holds a newer incarnation",
                None,
                Some(("u2", "11")),
                true,
                Verdict::Fine,
            ),
        ];
        for (case, found, cached, second, want) in cases {
            assert_eq!(
                verdict(found.as_ref(), cached, "u1", second),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn a_cache_that_caught_up_or_moved_on_needs_no_repair() {
        assert!(still_behind(Some(("u1", "10")), "u1", "12"), "still behind");
        assert!(!still_behind(Some(("u1", "12")), "u1", "12"), "caught up");
        assert!(!still_behind(Some(("u1", "13")), "u1", "12"), "ahead");
        assert!(
            !still_behind(Some(("u2", "1")), "u1", "12"),
            "another incarnation"
        );
        assert!(!still_behind(None, "u1", "12"), "deleted meanwhile");
    }
    /// A pass reads the pods behind ready addresses first (of Endpoints or
    /// slices), then the not-ready ones, then the Services.
    #[tokio::test]
    async fn a_pass_reads_pods_behind_ready_addresses_first() {
        use hardened_watcher::WatchEventKind::Added;

        use crate::reconcile::kinds::{CachedEndpoints, CachedService, CachedSlice};
        use crate::reconcile::testkit::{context, endpoints, pod, service};

        let ctx = context();
        ctx.stores
            .services
            .apply_watch_event(Added, CachedService::new(service("ns", "web", "web")));
        for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
            ctx.stores
                .pods
                .apply_watch_event(Added, pod("ns", name, "web", ip, "1"));
        }
        let mut ep = endpoints("ns", "web", &[("a", "10.0.0.1")]);
        let not_ready = endpoints("ns", "web", &[("b", "10.0.0.2")]);
        if let (Some(subset), Some(other)) = (
            ep.subsets.as_mut().and_then(|s| s.first_mut()),
            not_ready.subsets.and_then(|s| s.into_iter().next()),
        ) {
            subset.not_ready_addresses = other.addresses;
        }
        if let Some(cached) = CachedEndpoints::new(ep) {
            ctx.stores.endpoints.apply_watch_event(Added, cached);
        }
        let slice = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "uid": "s1", "resourceVersion": "3",
                "labels": {"kubernetes.io/service-name": "web",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false},
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "b", "uid": "b-uid"}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "c", "uid": "c-uid"}},
            ],
        }))
        .unwrap_or_else(|err| panic!("slice: {err}"));
        if let Some(cached) = CachedSlice::new(slice) {
            ctx.stores.slices.apply_watch_event(Added, cached);
        }
        let order: Vec<String> = targets(&ctx)
            .iter()
            .map(|t| format!("{:?} {}", t.kind, t.key.name))
            .collect();
        assert_eq!(order, ["Pod a", "Pod c", "Pod b", "Service web"]);
    }
}
