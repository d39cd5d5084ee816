//! The compaction audit: a LIST that reaches etcd once per compaction of
//! etcd, for ghosts the watch cache serves where nothing else does.
//!
//! kube-apiserver compacts etcd to the revision of its own previous
//! compaction write (`compact_rev_key`, k8s.io/apiserver `etcd3/compact.go`,
//! every `--etcd-compaction-interval`, 5 minutes by default), and its watch
//! cache then drops every snapshot below that revision (`cacher/compactor.go`,
//! polled every 15 s). No pod or Service was written at that revision, so no
//! snapshot covers it, and a LIST at exactly that revision is served by etcd
//! (`cacher.go`, `shouldDelegateExactRV`) however busy the resource is, and
//! whether or not kube-apiserver checks its cache (`DetectCacheInconsistency`).
//! Below it an exact LIST answers 410, at or above it it is served: the
//! revision is found by bisection with one-item LISTs, and, once known, one
//! one-item LIST at it a period tells whether etcd was compacted since.
//!
//! When it was, etcd's count of the objects at the new revision (one
//! one-item LIST there) is set against the count the cache held at that
//! revision (`Cache::count_at`): a DELETE or a creation the watch lost
//! before it makes them differ. While they agree, only every
//! `--compaction-audit-full-every`th revision is listed in full, which is
//! what a lost update, or a lost creation and a lost deletion that cancel
//! out, waits for. A revision the cache's count does not reach back to (it
//! started after it) is left to the next one, which a ghost's count
//! reaches. Otherwise the objects' metadata at the new revision is
//! listed (pages of
//! `--list-page-size`, `PartialObjectMetadataList` in protobuf), and every
//! scan target whose cached state is at or below that revision is compared
//! with it: one the list lacks, or holds as another
//! incarnation or a newer state, is read at once as the scan reads (a ghost
//! is confirmed by two reads, a stale state repaired from a whole one). A
//! ghost is found within about two compaction intervals of its DELETE, plus
//! `--compaction-audit-interval`: the DELETE's revision has to be below the
//! compaction revision (docs/ghosts.md). Only the leader audits, as only it
//! scans.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use hardened_watcher::live::{self, MetaPage, PageFrom};
use hardened_watcher::{ObjectKey, WatchObserver as _, compare_rv};
use tracing::{debug, info, warn};

use super::{Kind, Target};
use crate::metrics::AuditResult;
use crate::reconcile::Context;
use crate::reconcile::kinds::{self, PodKind, ServiceKind};

/// How often the audit asks, and its page size.
#[derive(Clone, Copy, Debug)]
pub struct CompactionAudit {
    /// How often to ask whether etcd was compacted (zero: never).
    pub every: Duration,
    /// Items per page of the list at a compaction revision
    /// (`--list-page-size`).
    pub page_size: u32,
    /// Every how many compaction revisions a kind is listed in full even
    /// when the counts agree (`--compaction-audit-full-every`; 1: at each).
    pub full_every: u32,
    /// The share of the time that scheduled listing's pages take
    /// (`--paced-list-share`); a listing for counts that differ is not
    /// paced.
    pub list_share: f64,
}

/// When the audit runs and what it found last, per kind.
pub(super) struct Audit {
    every: Duration,
    page_size: u32,
    full_every: u32,
    list_share: f64,
    next: Instant,
    /// The compaction revision each kind was last audited at.
    listed_at: HashMap<Kind, u64>,
    /// Revisions each kind was counted at since it was last listed in full.
    counted_since_full: HashMap<Kind, u32>,
    /// The kinds whose paced listing etcd compacted past before it ended:
    /// their next listing is not paced, or it might never end.
    unpaced: HashSet<Kind>,
    /// The kinds whose last audit failed: a failure is logged when it
    /// starts, and again when it ends.
    failing: HashSet<Kind>,
}

impl Audit {
    /// Off when `config.every` is zero.
    pub(super) fn new(config: CompactionAudit) -> Option<Self> {
        let CompactionAudit {
            every,
            page_size,
            full_every,
            list_share,
        } = config;
        (!every.is_zero()).then(|| Self {
            every,
            page_size: page_size.max(1),
            full_every: full_every.max(1),
            list_share,
            next: Instant::now() + every,
            listed_at: HashMap::new(),
            counted_since_full: HashMap::new(),
            unpaced: HashSet::new(),
            failing: HashSet::new(),
        })
    }

    pub(super) fn next(&self) -> Instant {
        self.next
    }

    /// Not leading: the period starts again.
    pub(super) fn postpone(&mut self, now: Instant) {
        if now >= self.next {
            self.next = now + self.every;
        }
    }

    /// Audits every kind the scan reads, if due; returns the targets to read
    /// now.
    pub(super) async fn run_if_due(&mut self, ctx: &Context, now: Instant) -> Vec<Target> {
        if now < self.next {
            return Vec::new();
        }
        self.next = now + self.every;
        let mut listings = Vec::new();
        for kind in [Kind::Pod, Kind::Service] {
            let last = self.listed_at.get(&kind).copied();
            let counted = self.counted_since_full.get(&kind).copied().unwrap_or(0);
            let may_count = counted + 1 < self.full_every;
            // Paced only when listed because it is due, not because the
            // counts differ.
            let paced = !may_count && !self.unpaced.contains(&kind);
            let pages = Pages {
                size: self.page_size,
                share: if paced { self.list_share } else { 1.0 },
            };
            let result = per_kind!(kind, listing(ctx, last, pages, may_count).await);
            let resource = kind.resource();
            let label = match result {
                Ok(Audited::Unchanged) => AuditResult::Unchanged,
                Ok(Audited::Overtaken) => {
                    debug!(
                        resource,
                        paced,
                        "compaction audit: etcd compacted again while listing; the next revision is listed"
                    );
                    if paced {
                        self.unpaced.insert(kind);
                    }
                    AuditResult::Unchanged
                }
                Ok(Audited::Counted { revision, count }) => {
                    debug!(
                        resource,
                        revision, count, "compaction audit: etcd's count agrees with the cache's"
                    );
                    self.listed_at.insert(kind, revision);
                    self.counted_since_full.insert(kind, counted + 1);
                    AuditResult::Counted
                }
                Ok(Audited::Deferred { revision }) => {
                    debug!(
                        resource,
                        revision,
                        "compaction audit: the cache's count at the revision is not known; the next revision decides"
                    );
                    self.listed_at.insert(kind, revision);
                    self.counted_since_full.insert(kind, counted + 1);
                    AuditResult::Deferred
                }
                Ok(Audited::Listed(listing)) => {
                    self.listed_at.insert(kind, listing.revision);
                    self.counted_since_full.insert(kind, 0);
                    self.unpaced.remove(&kind);
                    for _ in 0..listing.unreadable {
                        ctx.metrics.undecodable(resource);
                    }
                    listings.push((kind, listing));
                    AuditResult::Listed
                }
                Err(err) if self.failing.insert(kind) => {
                    warn!(resource, error = %err, "compaction audit failed: ghosts are left to the resync and the ghost scan until it succeeds; tried again every period");
                    AuditResult::Failed
                }
                Err(err) => {
                    debug!(resource, error = %err, "compaction audit failed again");
                    AuditResult::Failed
                }
            };
            if label != AuditResult::Failed && self.failing.remove(&kind) {
                info!(resource, "compaction audit succeeded again");
            }
            ctx.metrics.compaction_audit(resource, label);
        }
        if listings.is_empty() {
            return Vec::new();
        }
        let targets = super::targets(ctx);
        let mut reads = Vec::new();
        for (kind, listing) in listings {
            let revision = listing.revision.to_string();
            let found: Vec<Target> = targets
                .iter()
                .filter(|t| t.kind == kind)
                .filter(|t| {
                    super::cached_meta(ctx, t).is_some_and(|(uid, rv)| {
                        disagrees(listing.objects.get(&t.key), (&uid, &rv), &revision)
                    })
                })
                .cloned()
                .collect();
            if !found.is_empty() {
                info!(resource = kind.resource(), revision = %revision, suspects = found.len(), "compaction audit: etcd disagrees with the cache; reading them");
                ctx.metrics
                    .compaction_audit_suspects(kind.resource(), found.len());
            }
            reads.extend(found);
        }
        reads
    }
}

/// What one kind's audit did.
enum Audited {
    /// etcd was not compacted since the last audit.
    Unchanged,
    /// etcd held as many objects at the new compaction revision as the
    /// cache did: not listed.
    Counted { revision: u64, count: u64 },
    /// etcd's count at the new compaction revision is known, the cache's
    /// is not (it started after that revision, or was rewound since): not
    /// listed. A ghost stays in the cache, so the next revision's counts
    /// differ; a cache that never knows its count is listed at its turn.
    Deferred { revision: u64 },
    /// Listed in full at the new compaction revision.
    Listed(Listing),
    /// etcd was compacted again while the revision was listed: the next
    /// revision is listed instead.
    Overtaken,
}

/// The objects' metadata at a compaction revision.
struct Listing {
    revision: u64,
    /// key → (UID, resourceVersion).
    objects: HashMap<ObjectKey, (String, String)>,
    /// Items without a readable name: skipped, and counted as undecodable.
    unreadable: usize,
}

/// Whether etcd's state at the compaction revision `revision`, `listed`
/// (`None`: no object of that key), contradicts what the cache holds,
/// `cached` (UID, resourceVersion) (pure). A cached state newer than the
/// revision is not covered by the list.
pub(super) fn disagrees(
    listed: Option<&(String, String)>,
    cached: (&str, &str),
    revision: &str,
) -> bool {
    let (cached_uid, cached_rv) = cached;
    if compare_rv(cached_rv, revision).is_none_or(|o| o.is_gt()) {
        return false;
    }
    match listed {
        None => true,
        Some((uid, rv)) => {
            uid != cached_uid || compare_rv(rv, cached_rv).is_some_and(|o| o.is_gt())
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum AuditError {
    #[error(transparent)]
    Request(#[from] kube::Error),
    #[error("resourceVersion {0:?} is not a revision")]
    NotARevision(String),
    #[error("no revision at or below {0} answered")]
    NothingServed(u64),
}

/// How a LIST at an exact revision ended.
enum Exact {
    Page(MetaPage),
    /// 410: etcd has compacted past it.
    Compacted,
}

/// What a one-item LIST at an exact revision found.
enum Probe {
    /// Served; the store's count there, when the server counted.
    Served(Option<u64>),
    /// 410: etcd has compacted past it.
    Compacted,
}

/// A one-item metadata LIST of `K` at exactly `rv`.
async fn probe<K: kinds::Kind>(ctx: &Context, rv: u64) -> Result<Probe, kube::Error> {
    let rv = rv.to_string();
    match live::count_at::<K::Object>(&ctx.client, &(), &rv, "compaction_audit").await {
        Ok(count) => Ok(Probe::Served(count)),
        Err(kube::Error::Api(status)) if status.code == 410 => Ok(Probe::Compacted),
        Err(err) => Err(err),
    }
}

/// A metadata LIST page of every `K`, in protobuf when kube-apiserver
/// serves it (about three quarters of the JSON's bytes, docs/ghosts.md).
async fn list_meta<K: kinds::Kind>(
    ctx: &Context,
    limit: u32,
    from: PageFrom<'_>,
) -> Result<Exact, kube::Error> {
    match live::list_meta_page::<K::Object>(&ctx.client, &(), limit, from, "compaction_audit").await
    {
        Ok(page) => Ok(Exact::Page(page)),
        Err(kube::Error::Api(status)) if status.code == 410 => Ok(Exact::Compacted),
        Err(err) => Err(err),
    }
}

/// How a listing asks for its pages.
#[derive(Clone, Copy, Debug)]
struct Pages {
    /// Items per page.
    size: u32,
    /// The share of the time its pages take (1: back to back; see
    /// [`hardened_watcher::pace`]).
    share: f64,
}

/// The audit at the compaction revision when it moved past `last`: the
/// counts compared when `may_count`, the listing when they differ or may
/// not be compared.
async fn listing<K: kinds::Kind>(
    ctx: &Context,
    last: Option<u64>,
    pages: Pages,
    may_count: bool,
) -> Result<Audited, AuditError> {
    if let Some(last) = last
        && let Probe::Served(_) = probe::<K>(ctx, last).await?
    {
        return Ok(Audited::Unchanged);
    }
    let Exact::Page(now) = list_meta::<K>(ctx, 1, PageFrom::Current).await? else {
        return Err(AuditError::NothingServed(0));
    };
    let newest = revision(&now.resource_version)?;
    let (revision, probed) = compaction_revision::<K>(ctx, last.unwrap_or(0), newest).await?;
    if last == Some(revision) {
        return Ok(Audited::Unchanged);
    }
    let at = revision.to_string();
    if may_count {
        let listed = match probed {
            Some(count) => Some(count),
            None => match probe::<K>(ctx, revision).await? {
                Probe::Served(count) => count,
                // Compacted again meanwhile: the next period audits the new one.
                Probe::Compacted => return Ok(Audited::Unchanged),
            },
        };
        let cached = K::store(&ctx.stores).with_cache(|cache| cache.count_at(revision));
        match (listed, cached) {
            (Some(listed), Some(cached)) if listed == cached => {
                return Ok(Audited::Counted {
                    revision,
                    count: listed,
                });
            }
            (Some(_), None) => return Ok(Audited::Deferred { revision }),
            _ => {}
        }
        debug!(
            resource = K::RESOURCE,
            revision,
            ?listed,
            ?cached,
            "compaction audit: counts differ or are unknown; listing"
        );
    }
    let mut objects = HashMap::new();
    let mut unreadable = 0;
    let mut token: Option<String> = None;
    let started = Instant::now();
    loop {
        let from = token
            .as_deref()
            .map_or(PageFrom::Exactly(&at), PageFrom::Continue);
        let asked = Instant::now();
        let page = match list_meta::<K>(ctx, pages.size, from).await? {
            Exact::Page(page) => page,
            // Compacted again meanwhile: the next period lists the new one.
            Exact::Compacted => return Ok(Audited::Overtaken),
        };
        for (key, meta) in page.items {
            objects.insert(key, (meta.uid, meta.resource_version));
        }
        unreadable += page.unreadable;
        token = page.continue_token;
        if token.is_none() {
            break;
        }
        // The pages are not counted here: the pauses stop once the span
        // is spent, before etcd compacts the revision listed.
        let pause = hardened_watcher::pace::pause_within_span(
            asked.elapsed(),
            pages.share,
            started.elapsed(),
            None,
        );
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(Audited::Listed(Listing {
        revision,
        objects,
        unreadable,
    }))
}

fn revision(rv: &str) -> Result<u64, AuditError> {
    rv.parse()
        .map_err(|_| AuditError::NotARevision(rv.to_owned()))
}

/// The oldest revision in `(below, newest]` an exact LIST is served at
/// (`below` answered 410 or is 0; `newest` is served): etcd's compaction
/// revision, found by bisection; with the store's count there when a probe
/// at exactly that revision gave one (not when `newest` is the answer).
async fn compaction_revision<K: kinds::Kind>(
    ctx: &Context,
    below: u64,
    newest: u64,
) -> Result<(u64, Option<u64>), AuditError> {
    let (mut below, mut served, mut count) = (below, newest, None);
    if served <= below {
        return Err(AuditError::NothingServed(newest));
    }
    while served - below > 1 {
        let mid = below + (served - below) / 2;
        match probe::<K>(ctx, mid).await? {
            Probe::Compacted => below = mid,
            Probe::Served(at_mid) => (served, count) = (mid, at_mid),
        }
    }
    Ok((served, count))
}

#[cfg(test)]
mod tests {
    use super::disagrees;

    fn listed(uid: &str, rv: &str) -> Option<(String, String)> {
        Some((uid.to_owned(), rv.to_owned()))
    }

    #[test]
    fn the_list_at_the_compaction_revision_judges_only_older_cached_states() {
        let cases = [
            (
                "etcd has no such object: a ghost",
                None,
                ("u1", "90"),
                "100",
                true,
            ),
            (
                "the same state",
                listed("u1", "90"),
                ("u1", "90"),
                "100",
                false,
            ),
            (
                "another incarnation in etcd",
                listed("u2", "95"),
                ("u1", "90"),
                "100",
                true,
            ),
            (
                "a newer state in etcd: the watch lost an update",
                listed("u1", "95"),
                ("u1", "90"),
                "100",
                true,
            ),
            (
                "cached at exactly the revision",
                None,
                ("u1", "100"),
                "100",
                true,
            ),
            (
                "cached after the revision: not covered",
                None,
                ("u1", "101"),
                "100",
                false,
            ),
            (
                "a newer state cached, an older listed (never from etcd)",
                listed("u1", "80"),
                ("u1", "90"),
                "100",
                false,
            ),
            (
                "opaque resourceVersions: nothing to judge",
                None,
                ("u1", "x"),
                "100",
                false,
            ),
        ];
        for (what, list, cached, revision, expected) in cases {
            assert_eq!(
                disagrees(list.as_ref(), cached, revision),
                expected,
                "{what}"
            );
        }
    }
}
