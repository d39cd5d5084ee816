//! The periodic resync, the start-up sweep and the aging of deletion evidence.
//!
//! A watch can lose events for good (a lost DELETE leaves a ghost until a
//! relist; upstream informers relist only after errors, and their 12–24 h
//! resync replays the cache rather than reading the API). Every interval each
//! watcher checks its count against the store's at the store's current
//! resourceVersion (two one-item LISTs, the watch left open: see
//! `crates/hardened-watcher/src/count.rs`), and relists in full where the
//! count differs or cannot be had, and every `--full-resync-interval`. A full
//! relist takes the same page-by-page path as any relist and resumes the
//! watch from where it was: the differences the list found count as drift
//! only if the watch does not explain them (see
//! `crates/hardened-watcher/src/cache_list.rs`). Then every Service is
//! queued: a reconcile with nothing to change writes nothing, and a key that
//! ran out of retries comes back at least once per interval.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::{BoxFuture, join_all};
use tracing::info;

use super::{Context, enqueue_all};
use crate::desired::scope::{EndpointsRole, Handling};
use crate::error::{Error, Result};
use crate::reconcile::kinds::{Kind, KindVisitor, for_each_kind};
use crate::settings::Controller;
use hardened_watcher::{Cache, Cached, Confirmation, CountCheck, ResyncReport, WatchError};

/// How long one resync waits for a watcher's list.
const LIST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long it waits for a paced list at most: the resyncs after it wait
/// meanwhile, and a list at one revision fails anyway once etcd compacts
/// that revision (5 to 10 minutes at kube-apiserver's default).
const PACED_LIST_TIMEOUT: Duration = Duration::from_secs(600);

/// Housekeeping ticks after which an unconfirmed tombstone that nothing names
/// is released, and a confirmation forgotten.
const TOMBSTONE_TICKS: u64 = 2;
const RELEASED_CONFIRMATION_TICKS: u64 = 2;
/// Confirmations by a live read stop ghosts from coming back through a list
/// served by a watch cache that still holds them: kept longer.
const LIVE_READ_CONFIRMATION_TICKS: u64 = 12;

/// When resyncs run, and how deep.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// `--resync-interval`: zero, none.
    pub interval: Duration,
    /// `--full-resync-interval`.
    pub full_interval: Duration,
    /// `--paced-list-share`: the share of the time a scheduled full
    /// resync's pages take.
    pub paced_list_share: f64,
}

impl Timing {
    /// How deep the resync due now goes: in full on election (the catch-up,
    /// at once), paced once `full_interval` has passed since the last full
    /// one, and always when that is no longer than the interval itself; by
    /// counts otherwise.
    pub fn depth(&self, elected: bool, since_full: Duration) -> Depth {
        if elected {
            Depth::Full
        } else if self.full_interval <= self.interval || since_full >= self.full_interval {
            Depth::Paced
        } else {
            Depth::Counts
        }
    }

    /// How long one resync at `depth` waits for a watcher's list: a paced
    /// list's pauses stretch it by up to 1 / share, within
    /// [`PACED_LIST_TIMEOUT`].
    pub fn list_timeout(&self, depth: Depth) -> Duration {
        match depth {
            Depth::Paced => LIST_TIMEOUT
                .mul_f64(1.0 / hardened_watcher::pace::valid_share(self.paced_list_share))
                .min(PACED_LIST_TIMEOUT),
            _ => LIST_TIMEOUT,
        }
    }
}

/// What one resync does for each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// A count check, and a full relist where it does not match.
    Counts,
    /// A full relist at once.
    Full,
    /// A full relist that nothing suspect calls for, its pages paced
    /// ([`hardened_watcher::Store::resync_paced`]).
    Paced,
}

impl Depth {
    /// Whether every kind is listed in full.
    pub fn is_full(self) -> bool {
        matches!(self, Depth::Full | Depth::Paced)
    }

    /// Whether the kinds are resynced one after another rather than at
    /// once. A paced list keeps kube-apiserver serving its pages a share of
    /// the time; five paced at once would keep it serving up to five times
    /// that share while they overlap. What is not paced is urgent (an
    /// election's catch-up) or cheap (count checks), and goes at once.
    pub fn in_turn(self) -> bool {
        self == Depth::Paced
    }
}

/// One kind's part of a resync.
#[derive(Debug, Default)]
struct KindResync {
    report: ResyncReport,
    /// Listed in full (a count check that did not match, or a full resync).
    listed: bool,
}

/// Every kind's resync, to run at once or in turn; each answer with its
/// resource.
struct Relists<'a> {
    ctx: &'a Context,
    depth: Depth,
    timeout: Duration,
    relists: Vec<BoxFuture<'a, (&'static str, Result<KindResync>)>>,
}

impl KindVisitor for Relists<'_> {
    fn visit<K: Kind>(&mut self) {
        let (ctx, depth, timeout) = (self.ctx, self.depth, self.timeout);
        self.relists.push(Box::pin(async move {
            (K::RESOURCE, resync_kind::<K>(ctx, depth, timeout).await)
        }));
    }
}

/// Resyncs kind `K` if it is watched (an unwatched kind reports nothing):
/// at [`Depth::Counts`] a count check first, and a full relist only where
/// the count differs or cannot be had, at once; at [`Depth::Paced`] a paced
/// relist unless the cache awaits a list.
async fn resync_kind<K: Kind>(
    ctx: &Context,
    depth: Depth,
    timeout: Duration,
) -> Result<KindResync> {
    if !K::needed(ctx.controllers()) {
        return Ok(KindResync::default());
    }
    let store = K::store(&ctx.stores);
    // Deletion candidates and drift held from the last list are settled by
    // the next list, which a count check is not.
    let awaits_a_list = store.with_cache(Cache::awaits_a_list);
    if depth == Depth::Counts && !awaits_a_list {
        let checked = match tokio::time::timeout(LIST_TIMEOUT, store.count_check()).await {
            Ok(checked) => checked?,
            Err(_) => CountCheck::Unknown("no answer in time".into()),
        };
        ctx.metrics
            .resync_count_checks
            .with_label_values(&[K::RESOURCE, checked.metric_label()])
            .inc();
        match checked {
            CountCheck::Matches => return Ok(KindResync::default()),
            other => {
                info!(resource = K::RESOURCE, checked = ?other, "count check: listing in full")
            }
        }
    }
    let paced = depth == Depth::Paced && !awaits_a_list;
    Ok(KindResync {
        report: relist::<K>(store, paced, timeout).await?,
        listed: true,
    })
}

/// A full relist of one kind's watcher: `paced`, waited for `timeout`, or at
/// once, waited for [`LIST_TIMEOUT`].
async fn relist<K: Kind>(
    store: &hardened_watcher::Store<K::Cached>,
    paced: bool,
    timeout: Duration,
) -> Result<ResyncReport> {
    let resynced = if paced {
        tokio::time::timeout(timeout, store.resync_paced()).await
    } else {
        tokio::time::timeout(LIST_TIMEOUT, store.resync()).await
    };
    match resynced {
        Ok(report) => report.map_err(Error::from),
        Err(_) => Err(Error::Watch(WatchError::WatcherGone {
            resource: store.resource().to_owned(),
        })),
    }
}

/// One resync: every watcher checks its count or relists (at `depth`, each
/// list given `timeout`; at once, or one after another when the depth is
/// [`Depth::in_turn`]), then the caches are compared with each other and
/// every Service is queued.
pub async fn resync_once(ctx: &Arc<Context>, depth: Depth, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut relists = Relists {
        ctx,
        depth,
        timeout,
        relists: Vec::new(),
    };
    for_each_kind(&mut relists);
    let resynced = if depth.in_turn() {
        let mut done = Vec::with_capacity(relists.relists.len());
        for relist in relists.relists {
            done.push(relist.await);
        }
        done
    } else {
        join_all(relists.relists).await
    };
    let mut changes = Vec::new();
    let mut listed = Vec::new();
    let mut disputes = 0;
    for (resource, resynced) in resynced {
        let KindResync {
            report,
            listed: in_full,
        } = resynced?;
        disputes += report.disputes;
        if in_full {
            listed.push(resource);
        }
        if report.changes > 0 {
            changes.push((resource, report.changes));
        }
    }
    let queued = enqueue_all(ctx);
    let elapsed = start.elapsed().as_secs_f64();
    ctx.metrics.resync_duration.observe(elapsed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    ctx.metrics.last_successful_resync.set(now);
    info!(
        seconds = elapsed,
        ?depth,
        ?listed,
        ?changes,
        disputes,
        queued,
        "resync done"
    );
    Ok(())
}

/// Compares Services with what the controllers made for them: Endpoints or
/// slices whose Service is missing are queued (the reconcile confirms with a
/// live read before deleting anything of ours, and only counts, never deletes,
/// Endpoints we do not manage: see [`super::orphans`]); selector Services
/// without Endpoints are queued.
pub fn sweep(ctx: &Context) {
    if ctx.controllers().contains(Controller::Endpointslices) {
        sweep_slices(ctx);
    }
    if ctx.controllers().contains(Controller::Endpoints) {
        sweep_endpoints(ctx);
    }
}

fn sweep_slices(ctx: &Context) {
    let managers = ctx.policy.scope.managers();
    let orphaned: Vec<_> = ctx.stores.slices.with_cache(|slices| {
        slices
            .iter()
            .filter(|slice| slice.is_ours(managers))
            .filter_map(|slice| slice.service_key())
            .filter(|key| ctx.stores.services.get(key).is_none())
            .collect()
    });
    for key in orphaned {
        ctx.enqueue_for(Controller::Endpointslices, key, None);
    }
}

/// Queues only: the unmanaged orphans are counted by their reconcile, which
/// runs again whenever their Service or Endpoints change. A count taken here
/// would compare two caches listed at different moments, and could call
/// Endpoints an orphan whose Service the Services cache has not seen yet.
fn sweep_endpoints(ctx: &Context) {
    ctx.stores.services.with_cache(|services| {
        ctx.stores.endpoints.with_cache(|endpoints| {
            for ep in endpoints.iter() {
                let key = ep.key();
                if services.get(&key).is_none() {
                    ctx.enqueue_for(Controller::Endpoints, key, None);
                }
            }
            for svc in services.iter() {
                let writes = matches!(
                    svc.handling(ctx.policy.scope),
                    Handling::Managed(m) if m.endpoints == EndpointsRole::Write
                );
                if writes && endpoints.get(&svc.key()).is_none() {
                    ctx.enqueue_for(Controller::Endpoints, svc.key(), None);
                }
            }
        });
    });
}

/// Ages deletion evidence by one tick and lets go of what has waited too
/// long with nothing at stake (see [`Kind::at_stake`]), and forgets old
/// confirmations. A tombstone something still names stays until its
/// reconcile reads the object live or a consistent list proves it gone.
pub fn housekeeping(ctx: &Arc<Context>) {
    let mut aging = Aging { ctx, released: 0 };
    for_each_kind(&mut aging);
    let released = aging.released;
    if released > 0 {
        info!(released, "housekeeping: old deletion evidence let go");
    }
}

/// Housekeeping of every kind, counting what went.
struct Aging<'a> {
    ctx: &'a Context,
    released: usize,
}

impl KindVisitor for Aging<'_> {
    fn visit<K: Kind>(&mut self) {
        self.released += age::<K>(self.ctx);
    }
}

/// Housekeeping of one kind; returns how many tombstones and confirmations went.
fn age<K: Kind>(ctx: &Context) -> usize {
    if !K::needed(ctx.controllers()) {
        return 0;
    }
    let store = K::store(&ctx.stores);
    store.tick();
    let aged = store.with_cache(|cache| cache.aged_tombstones(TOMBSTONE_TICKS));
    let released = aged
        .into_iter()
        .filter(|(key, uid)| {
            !K::at_stake(ctx, key, uid) && store.confirm_deleted(key, uid, Confirmation::Released)
        })
        .count();
    released + store.forget_confirmed(RELEASED_CONFIRMATION_TICKS, LIVE_READ_CONFIRMATION_TICKS)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Depth, Timing};

    #[test]
    fn counts_between_full_resyncs_and_in_full_on_election() {
        let secs = Duration::from_secs;
        let timing = Timing {
            interval: secs(90),
            full_interval: secs(1800),
            paced_list_share: 0.05,
        };
        assert_eq!(timing.depth(false, secs(90)), Depth::Counts);
        assert_eq!(timing.depth(false, secs(1799)), Depth::Counts);
        assert_eq!(timing.depth(false, secs(1800)), Depth::Paced);
        assert_eq!(timing.depth(true, secs(1)), Depth::Full);
        // A full interval no longer than the interval: every resync in full.
        let every = Timing {
            interval: secs(90),
            full_interval: secs(90),
            ..timing
        };
        assert_eq!(every.depth(false, secs(0)), Depth::Paced);
        // Only the paced resync lists its kinds one after another.
        assert!(Depth::Paced.in_turn());
        assert!(!Depth::Full.in_turn() && !Depth::Counts.in_turn());
        // Only a paced list waits longer, by its share.
        assert_eq!(timing.list_timeout(Depth::Paced), secs(600));
        let half = Timing {
            paced_list_share: 0.5,
            ..timing
        };
        assert_eq!(half.list_timeout(Depth::Paced), secs(240));
        assert_eq!(timing.list_timeout(Depth::Full), secs(120));
        let unpaced = Timing {
            paced_list_share: 1.0,
            ..timing
        };
        assert_eq!(unpaced.list_timeout(Depth::Paced), secs(120));
    }

    use hardened_watcher::{ObjectKey, WatchEventKind};

    use super::housekeeping;
    use crate::reconcile::testkit::{context, pod};

    /// Tombstones that nothing names go after two rounds; one a live Endpoints
    /// of ours names stays. Run on a thread of its own: a lock taken twice by
    /// one thread (a read guard kept alive across a write) hangs instead of
    /// failing, and the test must fail instead.
    #[test]
    fn aged_tombstones_with_nothing_at_stake_are_released_without_deadlock() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The context's client needs a runtime to exist, not to run.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|err| panic!("runtime: {err}"));
            let _entered = runtime.enter();
            let ctx = Arc::new(context());
            {
                let pods = &ctx.stores.pods;
                for (name, ip) in [("gone", "10.0.0.1"), ("named", "10.0.0.2")] {
                    pods.apply_watch_event(WatchEventKind::Added, pod("ns", name, "a", ip, "1"));
                    pods.apply_watch_event(WatchEventKind::Deleted, pod("ns", name, "a", ip, "2"));
                }
            }
            let named = crate::reconcile::testkit::endpoints("ns", "a", &[("named", "10.0.0.2")]);
            if let Some(cached) = crate::reconcile::kinds::CachedEndpoints::new(named) {
                ctx.stores
                    .endpoints
                    .apply_watch_event(WatchEventKind::Added, cached);
            }
            housekeeping(&ctx);
            let after_one = ctx
                .stores
                .pods
                .with_cache(hardened_watcher::Cache::tombstone_count);
            housekeeping(&ctx);
            let left: Vec<bool> = ["gone", "named"]
                .iter()
                .map(|n| {
                    ctx.stores
                        .pods
                        .with_cache(|pods| pods.tombstone(&ObjectKey::new("ns", *n)).is_some())
                })
                .collect();
            let _ = done.send((after_one, left));
        });
        let (after_one, left) = finished
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("housekeeping deadlocked"));
        assert_eq!(after_one, 2, "one round is not old enough");
        assert_eq!(left, [false, true], "the named pod's tombstone stays");
    }
}
