//! The ghost scan: reads that reach etcd, on a request budget, for what the
//! API server's watch cache may hold wrongly.
//!
//! When kube-apiserver's watch cache loses a DELETE (etcd issues 18089 and
//! 19179, kubernetes 123072), every watch and every LIST keeps the object,
//! because since v1.34 a consistent LIST is served from that same cache. The
//! periodic resync cannot see such a ghost; only a GET reaches etcd. So every
//! pod an address of our Endpoints or an endpoint of our slices points at,
//! and every Service that has either, is read by GET in turn. A pass is
//! spread over `--ghost-scan-period` (so its cost grows with the cluster, and
//! a small cluster is not read through every minute), at least one read a
//! second and at most `--ghost-scan-qps`: a ghost is found within about one
//! period plus `RECHECK_AFTER`, or targets / qps where the cap binds.
//!
//! A ghost is declared on two reads, `RECHECK_AFTER` apart, that both find
//! the object gone while the cache still holds the same incarnation: a
//! DELETE merely in flight on the watch arrives long before the second read.
//! It then leaves the cache as confirmed gone, its Services are queued, and
//! `endpoints_guard_ghosts_found_total{resource}` counts it.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::objects::{pod_target_refs, slice_pod_refs};
use super::{Context, handlers};
use hardened_watcher::{Cached, LiveRead, ObjectKey, WatchObserver, live, stopped};

/// The second read of a suspected ghost.
const RECHECK_AFTER: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Pod,
    Service,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Service => "services",
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
}

/// The rule, pure: `found_uid` is what the read found (`None`: gone),
/// `cached_uid` what the cache holds now, `second` whether this was the
/// re-read of a suspect.
fn verdict(
    found_uid: Option<&str>,
    cached_uid: Option<&str>,
    target_uid: &str,
    second: bool,
) -> Verdict {
    if cached_uid != Some(target_uid) {
        // The cache moved on (a DELETE arrived, or another incarnation).
        return Verdict::Fine;
    }
    match found_uid {
        Some(uid) if uid == target_uid => Verdict::Fine,
        // etcd holds another incarnation: the cached one is dead.
        Some(_) => Verdict::Ghost,
        None if second => Verdict::Ghost,
        None => Verdict::Suspect,
    }
}

/// The slowest the scan reads while it has targets: however long the period,
/// a small cluster is read through in seconds, at a negligible cost.
const MIN_QPS: f64 = 1.0;

/// How the scan spends its reads.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The most reads a second (0: the scan is off).
    pub qps: f64,
    /// One pass over all targets is spread over this long (0: as fast as
    /// `qps` allows).
    pub period: Duration,
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
}

/// Runs the scan until shutdown.
pub async fn run(ctx: Arc<Context>, pace: Pace, mut shutdown: watch::Receiver<bool>) {
    if pace.qps <= 0.0 {
        return;
    }
    let mut gap = pace.gap(0);
    let mut next_read = Instant::now();
    let mut pass: VecDeque<Target> = VecDeque::new();
    let mut suspects: VecDeque<(Instant, Target)> = VecDeque::new();
    let mut pass_started = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next_read.into()) => {}
            () = stopped(&mut shutdown) => return,
        }
        // Behind schedule (a slow read): go on from now rather than burst.
        next_read = (next_read + gap).max(Instant::now());
        if !ctx.stores.synced() {
            continue;
        }
        let due = suspects
            .front()
            .is_some_and(|(at, _)| *at <= Instant::now());
        let (target, second) = if due {
            match suspects.pop_front() {
                Some((_, target)) => (target, true),
                None => continue,
            }
        } else {
            if pass.is_empty() {
                let took = pass_started.elapsed().as_secs_f64();
                ctx.metrics.ghost_scan_pass_seconds.set(took);
                pass = targets(&ctx).into();
                pass_started = Instant::now();
                gap = pace.gap(pass.len());
                debug!(
                    targets = pass.len(),
                    read_gap_ms = gap.as_millis(),
                    last_pass_seconds = took,
                    "ghost scan: new pass"
                );
            }
            match pass.pop_front() {
                Some(target) => (target, false),
                None => continue,
            }
        };
        match check(&ctx, &target, second).await {
            Verdict::Fine => {}
            Verdict::Suspect => suspects.push_back((Instant::now() + RECHECK_AFTER, target)),
            Verdict::Ghost => evict(&ctx, &target),
        }
    }
}

/// Every pod an address of our Endpoints or an endpoint of our slices names,
/// and every Service with Endpoints or slices of ours, that the caches hold
/// now; each once.
fn targets(ctx: &Context) -> Vec<Target> {
    // (Service key, the pods its objects name), from either controller.
    let mut named: Vec<(ObjectKey, Vec<String>)> = Vec::new();
    let endpoints: Vec<_> = ctx
        .stores
        .endpoints
        .read()
        .iter()
        .filter(|ep| ep.is_deletable())
        .cloned()
        .collect();
    for ep in endpoints {
        let Ok(decoded) = ep.decode() else { continue };
        let pods = pod_target_refs(&decoded)
            .filter_map(|r| r.name.clone())
            .collect();
        named.push((ep.key(), pods));
    }
    let slices: Vec<_> = ctx
        .stores
        .slices
        .read()
        .iter()
        .filter(|s| s.is_adoptable())
        .cloned()
        .collect();
    for slice in slices {
        let (Some(key), Ok(decoded)) = (slice.service_key(), slice.decode()) else {
            continue;
        };
        let pods = slice_pod_refs(&decoded)
            .filter_map(|r| r.name.clone())
            .collect();
        named.push((key, pods));
    }

    let services = ctx.stores.services.read();
    let pods = ctx.stores.pods.read();
    let mut seen: HashSet<(Kind, ObjectKey)> = HashSet::new();
    let mut out = Vec::new();
    for (key, pod_names) in named {
        if let Some(svc) = services.get(&key)
            && seen.insert((Kind::Service, key.clone()))
        {
            out.push(Target {
                kind: Kind::Service,
                uid: svc.uid().to_owned(),
                key: key.clone(),
            });
        }
        for name in pod_names {
            let pod_key = ObjectKey::new(key.namespace.clone(), name);
            if let Some(pod) = pods.get(&pod_key)
                && seen.insert((Kind::Pod, pod_key.clone()))
            {
                out.push(Target {
                    kind: Kind::Pod,
                    uid: pod.uid().to_owned(),
                    key: pod_key,
                });
            }
        }
    }
    out
}

async fn check(ctx: &Context, target: &Target, second: bool) -> Verdict {
    ctx.metrics.ghost_scan_reads.inc();
    let read = match target.kind {
        Kind::Pod => live::get_uid::<Pod>(&ctx.client, &(), &target.key).await,
        Kind::Service => live::get_uid::<Service>(&ctx.client, &(), &target.key).await,
    };
    let found_uid = match read {
        Ok(LiveRead::Found(uid)) => Some(uid),
        Ok(LiveRead::Gone) => None,
        Err(err) => {
            debug!(object = %target.key, resource = target.kind.resource(), error = %err, "ghost scan: read failed; skipped");
            return Verdict::Fine;
        }
    };
    let cached_uid = match target.kind {
        Kind::Pod => ctx.stores.pods.get(&target.key).map(|p| p.uid().to_owned()),
        Kind::Service => ctx
            .stores
            .services
            .get(&target.key)
            .map(|s| s.uid().to_owned()),
    };
    verdict(
        found_uid.as_deref(),
        cached_uid.as_deref(),
        &target.uid,
        second,
    )
}

fn evict(ctx: &Arc<Context>, target: &Target) {
    let resource = target.kind.resource();
    warn!(object = %target.key, resource, "ghost found: the API server's watch cache holds an object etcd does not; evicted from the cache");
    ctx.metrics.ghost(resource);
    match target.kind {
        Kind::Pod => {
            if let Some(change) = ctx.stores.pods.evict_ghost(&target.key, &target.uid) {
                handlers::on_pod(ctx, &change);
            }
        }
        Kind::Service => {
            if let Some(change) = ctx.stores.services.evict_ghost(&target.key, &target.uid) {
                handlers::on_service(ctx, &change);
            }
        }
    }
    info!(object = %target.key, resource, "ghost evicted; its Services are queued");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_spread_over_the_period_within_one_read_a_second_and_qps() {
        let pace = Pace {
            qps: 20.0,
            period: Duration::from_secs(900),
        };
        let ms = |targets| pace.gap(targets).as_millis();
        // A few targets: one read a second, not one per 900 s / 3.
        assert_eq!(ms(3), 1000);
        assert_eq!(ms(0), 1000);
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
    fn a_ghost_takes_two_reads_and_a_cache_that_moved_on_is_fine() {
        let cases = [
            (
                "found, same incarnation",
                Some("u1"),
                Some("u1"),
                false,
                Verdict::Fine,
            ),
            (
                "gone once: suspect",
                None,
                Some("u1"),
                false,
                Verdict::Suspect,
            ),
            ("gone twice: ghost", None, Some("u1"), true, Verdict::Ghost),
            (
                "another incarnation in etcd",
                Some("u2"),
                Some("u1"),
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
                Some("u2"),
                true,
                Verdict::Fine,
            ),
        ];
        for (case, found, cached, second, want) in cases {
            assert_eq!(verdict(found, cached, "u1", second), want, "{case}");
        }
    }
}
