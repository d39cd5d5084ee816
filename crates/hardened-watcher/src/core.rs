//! [`WatchCore`]: everything a watcher decides, without I/O. The async
//! driver (`driver.rs`) performs the [`Step`]s it asks for and hands back
//! what came of them; the unit tests drive the very same core with scripted
//! pages, lines and reads.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kube::runtime::utils::Backoff;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use super::cache::ReadStamp;
use super::count::CountCheck;
use super::decode::Listed;
use super::error::ApiErrorKind;
use super::list::{ListDiffBuilder, ListMode, ListOutcome, Page};
use super::machine::{Action, Machine, PageOutcome, RestartReason};
use super::object::{Cached, Change, Dispute, LiveRead, ObjectKey, Resolution};
use super::observer::WatchObserver;
use super::rv::compare_rv;
use super::store::{Request, ResyncReport, Store};

/// Where a watcher delivers every change it applies, in order: watch events,
/// list diffs and repairs alike. Deletion candidates included: the receiver
/// confirms them with a live read before acting. Called on the watcher's
/// task with no lock held; it must not block.
///
/// The [`Instant`] is when what the change came from arrived: the watch
/// line, the list page that completed the list, or the live read's answer
/// (see [`WatchCore::input_arrived`]). A receiver measures from it how long
/// it takes to act on a change, decoding and caching included.
pub type Sink<T> = Arc<dyn Fn(&Change<T>, Instant) + Send + Sync>;

/// What the driver must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// What the state machine asks: a LIST page, a WATCH, or a pause (then
    /// [`WatchCore::on_backoff_elapsed`]).
    Act(Action),
    /// GET `key` with resourceVersion unset, then call [`WatchCore::on_read`].
    Read {
        /// The object to read.
        key: ObjectKey,
    },
}

/// A list whose disputed items are being read live: what it ended at, and
/// what the store was known to have reached before it (the evidence a
/// confirmed rewind is logged with).
#[derive(Debug)]
pub(super) struct DisputedList {
    list_rv: String,
    mode: ListMode,
    known_rv: Option<String>,
}

/// What the end of a complete list leaves to do.
pub(super) enum Finished {
    /// Its pages came from different snapshots: list again.
    Inconsistent,
    /// Live reads must settle some of its items first.
    Disputed,
    /// No list was in progress.
    NoList,
    /// Applied: the watch goes on.
    Applied {
        /// The list's RV.
        list_rv: String,
        /// The mode it ended in.
        mode: ListMode,
    },
}

/// The decisions of one watcher.
pub struct WatchCore<T: Cached> {
    pub(super) machine: Machine,
    pub(super) store: Store<T>,
    pub(super) observer: Arc<dyn WatchObserver>,
    pub(super) sink: Sink<T>,
    /// The list being fetched.
    pub(super) list: Option<ListDiffBuilder<T>>,
    /// The mode of the next list to start.
    pub(super) next_mode: ListMode,
    /// Items of the last list that live reads must settle, and how to go
    /// on with that list afterwards.
    pub(super) disputes: VecDeque<Dispute<T>>,
    pub(super) after_disputes: Option<DisputedList>,
    /// A read settled a dispute as a rewound store.
    pub(super) rewind_confirmed: bool,
    /// Taken when a [`Step::Read`] is handed out.
    pub(super) read_stamp: Option<ReadStamp>,
    /// Resyncs waiting for the next list to be applied.
    pub(super) waiting: Vec<oneshot::Sender<ResyncReport>>,
    /// After a resync list the watch resumes from before it: events up to the
    /// list's RV were overtaken by the list and are not reported as stale.
    pub(super) replay_until: Option<String>,
    /// Changes of the list that ended, for the next resync report.
    pub(super) report: ResyncReport,
    /// When the input being applied arrived; handed to the sink with every
    /// change it causes.
    pub(super) arrived: Instant,
    /// Where the resync in progress stands on its list at an exact RV.
    pub(super) exact: ExactResync,
    /// Items of the list in progress that could not be decoded or projected.
    pub(super) list_skipped: usize,
    /// A watch stream is open (from [`WatchCore::on_watch_started`] until it
    /// ends): a resync then lists beside it rather than closing it.
    pub(super) watch_open: bool,
    /// The resync listing beside the open watch (`core_beside.rs`).
    pub(super) beside: Option<super::core_beside::Beside>,
    /// Whether that listing pauses after its pages, and the share of the
    /// time its pages may take then.
    pub(super) beside_pace: super::core_beside::Pace,
}

/// A resync lists at exactly the store's current revision, which a one-item
/// consistent LIST (the probe) reads first: see [`WatchCore::next_step`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum ExactResync {
    /// The next resync list probes for the store's revision first.
    #[default]
    Unasked,
    /// The probe is out.
    Probing,
    /// The store's revision: the resync's first page asks for it exactly.
    At(String),
    /// The first page asked for this exact RV and the list is in progress
    /// (a throttled first page asks for it again).
    Listing(String),
    /// The probe or the exact list failed, or the store is below what the
    /// cache has seen (a rewind, which the latest state shows): this resync
    /// lists the latest state.
    Refused,
}

impl<T: Cached> WatchCore<T> {
    /// A core for `store`, delivering to `sink`, reporting to `observer`,
    /// listing `page_limit` objects a page and backing off with `backoff`.
    pub fn new(
        store: Store<T>,
        sink: Sink<T>,
        observer: Arc<dyn WatchObserver>,
        page_limit: u32,
        backoff: Box<dyn Backoff>,
    ) -> Self {
        Self {
            machine: Machine::new(page_limit, backoff),
            store,
            observer,
            sink,
            list: None,
            next_mode: ListMode::Recover,
            disputes: VecDeque::new(),
            after_disputes: None,
            rewind_confirmed: false,
            read_stamp: None,
            waiting: Vec::new(),
            replay_until: None,
            report: ResyncReport::default(),
            arrived: Instant::now(),
            exact: ExactResync::Unasked,
            list_skipped: 0,
            watch_open: false,
            beside: None,
            beside_pace: super::core_beside::Pace::default(),
        }
    }

    /// The share of the time a paced resync's pages take, when it lists
    /// beside the open watch (see `WatcherBuilder::resync_list_share`).
    pub fn pace_resync_lists(&mut self, share: f64) {
        self.beside_pace.share = crate::pace::valid_share(share);
    }

    /// Records when the next input (a watch line, a list page, a live read's
    /// answer) arrived, before it is handed to `on_line`, `on_list_page` or
    /// `on_read`: the changes it causes reach the sink with this instant. The
    /// driver calls it the moment the input is read, so the time spent
    /// decoding and caching counts as the receiver's; without a call, changes
    /// carry the previous input's instant.
    pub fn input_arrived(&mut self, at: Instant) {
        self.arrived = at;
    }

    pub(super) fn resource(&self) -> &str {
        self.store.resource()
    }

    /// The state machine (for tests and debugging).
    #[cfg(test)]
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The store this core fills.
    pub fn store(&self) -> &Store<T> {
        &self.store
    }

    /// The next step. Starting a list takes the cache's high-water mark now,
    /// before the request is sent.
    ///
    /// A resync first reads the store's current revision (a one-item
    /// consistent LIST, [`Action::Probe`]), then asks for exactly that
    /// revision (`resourceVersionMatch=Exact`) rather than the latest state.
    /// Served from the API server's watch cache it is the same list as a
    /// consistent one, at the cost of one more one-item request: every
    /// change up to now is in it, a DELETE the watch never delivered too.
    /// But kube-apiserver (v1.34+, DetectCacheInconsistency) serves an exact
    /// list from etcd once its own check found its watch cache inconsistent
    /// (it drops the cache's snapshots and takes no more), and whenever no
    /// snapshot covers the RV. So a DELETE the watch cache lost, which every
    /// consistent list keeps serving, is missing from such a list: the diff
    /// makes the ghost a deletion candidate, and a live read confirms it.
    /// Where the probe or the exact list fails (an API server that refuses
    /// it), or the revision is below what the cache has seen (a rewound
    /// store, which the latest state shows), the resync lists consistently.
    pub fn next_step(&mut self) -> Step {
        if let Some(dispute) = self.disputes.front() {
            self.read_stamp = Some(self.store.read_stamp());
            return Step::Read {
                key: dispute.listed.key(),
            };
        }
        if self.machine.starts_list() && self.list.is_none() {
            if self.next_mode == ListMode::Resync
                && matches!(self.exact, ExactResync::Unasked | ExactResync::Probing)
            {
                self.exact = ExactResync::Probing;
                return Step::Act(Action::Probe);
            }
            self.list = Some(ListDiffBuilder::new(&self.store.read(), self.next_mode));
            self.list_skipped = 0;
        }
        let mut action = self.machine.next_action();
        if let Action::List {
            continue_token: None,
            exact_rv,
            ..
        } = &mut action
        {
            *exact_rv = self.exact_resync_rv();
            if let Some(rv) = exact_rv {
                self.exact = ExactResync::Listing(rv.clone());
            }
        }
        Step::Act(action)
    }

    /// The RV a resync's first page asks for exactly: the store's revision
    /// the probe read, where it is a decimal RV not below the list's floor.
    fn exact_resync_rv(&mut self) -> Option<String> {
        let list = self.list.as_ref()?;
        let (ExactResync::At(store_rv) | ExactResync::Listing(store_rv)) = &self.exact else {
            return None;
        };
        if list.mode() != ListMode::Resync {
            return None;
        }
        let decimal = !store_rv.is_empty() && store_rv.bytes().all(|b| b.is_ascii_digit());
        let behind = list.floor().is_some_and(|floor| {
            compare_rv(store_rv, floor).is_none_or(|order| order == Ordering::Less)
        });
        if !decimal || behind {
            self.exact = ExactResync::Refused;
            return None;
        }
        Some(store_rv.clone())
    }

    /// The answer to a resync's probe: the store's revision, or why it could
    /// not be had (the resync then lists the latest state).
    pub(super) fn on_resync_probe(&mut self, store_rv: Result<String, kube::Error>) {
        self.exact = match store_rv {
            Ok(store_rv) => ExactResync::At(store_rv),
            Err(err) => {
                debug!(error = %err, "reading the store's revision for a resync failed; it lists the latest state");
                ExactResync::Refused
            }
        };
    }

    /// The pause asked by [`Action::Backoff`] is over.
    pub fn on_backoff_elapsed(&mut self) {
        self.machine.on_backoff_elapsed();
    }

    /// A LIST page arrived, or the request failed.
    pub fn on_list_page(&mut self, page: Result<Page<T>, kube::Error>) {
        let page = match page {
            Ok(page) if !page.resource_version.is_empty() => page,
            Ok(_) => {
                self.abort_list();
                self.machine.on_list_page(None, "");
                warn!("list page without resourceVersion; relisting after backoff");
                self.observer
                    .restart(self.resource(), RestartReason::ListError);
                return;
            }
            Err(err) => {
                if let Some(retry_after) = throttled(&err) {
                    warn!(error = %err, ?retry_after, "list page throttled; asking for the same page again after the server's pause");
                    self.machine.on_list_throttled(retry_after);
                    return;
                }
                self.abort_list();
                if matches!(self.exact, ExactResync::Listing(_)) {
                    self.exact = ExactResync::Refused;
                    warn!(error = %err, "a resync list at an exact resourceVersion failed; this resync lists the latest state instead");
                }
                let reason = self.machine.on_list_error(ApiErrorKind::classify(&err));
                warn!(error = %err, reason = reason.metric_label(), "list failed");
                self.observer.restart(self.resource(), reason);
                return;
            }
        };
        if !self.apply_page(page.items, &page.resource_version) {
            // A page without a list started: cannot happen with `next_step`.
            warn!("list page arrived outside a list; relisting");
            self.machine.request_relist(RestartReason::ListError);
            return;
        }
        match self
            .machine
            .on_list_page(page.continue_token, &page.resource_version)
        {
            PageOutcome::More | PageOutcome::Invalid => {}
            PageOutcome::Complete { list_rv } => self.finish_list(list_rv),
        }
    }

    /// Applies a page's items to the list in progress (counting the
    /// undecodable ones); false when no list is in progress.
    pub(super) fn apply_page(&mut self, items: Vec<Listed<T>>, page_rv: &str) -> bool {
        let undecodable = items
            .iter()
            .filter(|e| matches!(e, Listed::Unknown(_)))
            .count();
        for _ in 0..undecodable {
            self.observer.undecodable(self.resource());
        }
        self.list_skipped += undecodable;
        let Some(builder) = self.list.as_mut() else {
            return false;
        };
        let was_rewound = builder.rewound();
        builder.apply_page(&mut self.store.write(), items, page_rv);
        if builder.rewound() && !was_rewound {
            // The store's own high-water mark already is the list's RV here:
            // the list's floor is what it held before.
            let known_rv = builder.floor().map(str::to_owned);
            self.start_rewind(page_rv, known_rv.as_deref(), "the consistent list's RV");
        }
        true
    }

    /// The store went back from `known_rv` (the highest RV known before the
    /// list that showed it) to `list_rv`.
    fn start_rewind(&mut self, list_rv: &str, known_rv: Option<&str>, evidence: &str) {
        warn!(
            list_rv,
            known_rv = known_rv.unwrap_or("unknown"),
            evidence,
            "the store was rewound (etcd restored from a backup?): the cache starts over from a consistent list"
        );
        self.observer.store_rewind(self.resource());
        self.next_mode = ListMode::Rewind;
        if self.store.set_synced(false) {
            self.observer.synced(self.resource(), false);
            // Found here first (a store told to start over is unsynced
            // already): the other caches of this store must hear of it.
            self.store.announce_rewind();
        }
    }

    /// A list that failed midway: its upserts are real changes; nothing
    /// was taken for deleted.
    pub(super) fn abort_list(&mut self) {
        if let Some(builder) = self.list.take() {
            let diff = builder.abort();
            self.emit_all(diff.changes);
        }
    }

    fn finish_list(&mut self, list_rv: String) {
        match self.end_list(list_rv) {
            Finished::Inconsistent => self.machine.request_relist(RestartReason::ListError),
            Finished::Disputed | Finished::NoList => {}
            Finished::Applied { list_rv, mode } => self.after_list(&list_rv, mode),
        }
    }

    /// Ends the complete list in progress: applies its diff, hands its
    /// changes to the sink, and sets its disputes aside for live reads.
    pub(super) fn end_list(&mut self, list_rv: String) -> Finished {
        let Some(builder) = self.list.take() else {
            return Finished::NoList;
        };
        let known_rv = builder.floor().map(str::to_owned);
        let outcome: ListOutcome<T> = {
            let mut cache = self.store.write();
            cache.skipped = self.list_skipped;
            builder.finish(&mut cache)
        };
        for kind in &outcome.leftover_drift {
            self.observer.drift(self.resource(), *kind);
        }
        let diff = outcome.diff;
        info!(
            list_rv,
            mode = ?outcome.mode,
            added = diff.added,
            updated = diff.updated,
            deletion_candidates = diff.deletion_candidates,
            stale = diff.stale.len(),
            kept_newer = diff.kept_newer,
            disputed = diff.disputes.len(),
            released = diff.released,
            "consistent list applied as a diff"
        );
        self.observer.relist(self.resource());
        for reason in &diff.stale {
            self.observer.stale_ignored(self.resource(), *reason);
        }
        self.report = ResyncReport {
            changes: diff.changes.len(),
            disputes: diff.disputes.len(),
        };
        self.emit_all(diff.changes);
        if outcome.list_rv.is_none() {
            // Pages of different snapshots: nothing was deleted; list again.
            warn!("list pages disagreed on the resourceVersion; relisting");
            return Finished::Inconsistent;
        }
        if diff.disputes.is_empty() {
            return Finished::Applied {
                list_rv,
                mode: outcome.mode,
            };
        }
        self.disputes = diff.disputes.into();
        self.after_disputes = Some(DisputedList {
            list_rv,
            mode: outcome.mode,
            known_rv,
        });
        Finished::Disputed
    }

    /// The list is in: say where the watch starts, and that the cache is synced.
    pub(super) fn after_list(&mut self, list_rv: &str, mode: ListMode) {
        match mode {
            ListMode::Recover => self.machine.watch_from_list(list_rv),
            ListMode::Resync => {
                self.machine.resume_after_list();
                self.replay_until = Some(list_rv.to_owned());
            }
            ListMode::Rewind => {
                self.machine.rewind_to(list_rv);
                self.replay_until = None;
            }
        }
        self.list_applied();
    }

    /// A list's diff is in the cache: the cache is synced, and the resyncs
    /// waiting for a list hear what it changed.
    pub(super) fn list_applied(&mut self) {
        self.next_mode = ListMode::Recover;
        if self.store.set_synced(true) {
            self.observer.synced(self.resource(), true);
        }
        let report = std::mem::take(&mut self.report);
        for waiter in self.waiting.drain(..) {
            // A resync that gave up waiting no longer listens.
            let _ = waiter.send(report.clone());
        }
        self.report_size();
    }

    /// The answer to the [`Step::Read`] of the first pending dispute.
    pub fn on_read(&mut self, read: Result<LiveRead<T>, kube::Error>) {
        let Some(dispute) = self.disputes.pop_front() else {
            return;
        };
        let stamp = self
            .read_stamp
            .take()
            .unwrap_or_else(|| self.store.read_stamp());
        let key = dispute.listed.key();
        match read {
            Err(err) => {
                // Unsettled: the cache keeps its copy; the next list asks again.
                warn!(object = %key, error = %err, "could not read a disputed list item live; keeping the cached state");
            }
            Ok(read) => {
                let resolution = self.store.write().resolve_dispute(dispute, read, &stamp);
                match resolution {
                    Resolution::Rewound => {
                        info!(object = %key, "a live read confirms the list: the store went back in time");
                        self.rewind_confirmed = true;
                        self.disputes.clear();
                    }
                    Resolution::StillGone => {
                        debug!(object = %key, "a known ghost is still in the API server's watch cache");
                    }
                    Resolution::Ghost(change) => {
                        warn!(object = %key, "the API server's watch cache disagrees with etcd (a lost event); etcd's state kept");
                        self.observer.ghost(self.resource());
                        if let Some(change) = change {
                            self.emit(change);
                        }
                    }
                }
            }
        }
        if !self.disputes.is_empty() {
            return;
        }
        let after = self.after_disputes.take();
        if std::mem::take(&mut self.rewind_confirmed) {
            let (list_rv, known_rv) = after
                .map(|list| (list.list_rv, list.known_rv))
                .unwrap_or_default();
            self.start_rewind(
                &list_rv,
                known_rv.as_deref(),
                "a live read of a disputed item",
            );
            self.machine.request_relist(RestartReason::StoreRewound);
            self.observer
                .restart(self.resource(), RestartReason::StoreRewound);
        } else if let Some(list) = after {
            self.after_list(&list.list_rv, list.mode);
        }
    }

    /// Something asks for a relist. Returns whether a watch in progress must
    /// end for it.
    pub(super) fn on_request(&mut self, request: Request) -> bool {
        let busy = self.list.is_some()
            || self.beside.is_some()
            || !self.disputes.is_empty()
            || self.machine.starts_list();
        let paced = matches!(request, Request::PacedResync(_));
        match request {
            Request::Resync(reply) | Request::PacedResync(reply) => {
                self.waiting.push(reply);
                if busy {
                    // The list in progress answers it, without pauses from
                    // now on if this one is not paced.
                    self.beside_pace.paced &= paced;
                    return false;
                }
                self.exact = ExactResync::Unasked;
                if self.watch_open && self.next_mode == ListMode::Recover {
                    // The watch goes on; the list runs beside it.
                    self.start_beside(paced);
                    return false;
                }
                if self.next_mode == ListMode::Recover {
                    self.next_mode = ListMode::Resync;
                }
                self.relist(RestartReason::Resync)
            }
            Request::Relist(reason) => {
                if busy {
                    return false;
                }
                self.relist(reason)
            }
            // The driver answers it while watching; anywhere else only a
            // full list can tell.
            Request::CountCheck(reply) => {
                let _ = reply.send(CountCheck::Unknown("the watcher is not watching".into()));
                false
            }
        }
    }

    pub(super) fn relist(&mut self, reason: RestartReason) -> bool {
        debug!(reason = reason.metric_label(), "relist requested");
        self.machine.request_relist(reason);
        self.observer.restart(self.resource(), reason);
        true
    }

    fn emit_all(&self, changes: Vec<Change<T>>) {
        for change in changes {
            self.emit(change);
        }
        self.report_size();
    }

    pub(super) fn emit(&self, change: Change<T>) {
        if let Change::DeletionCandidate(obj) = &change {
            let source = self.store.read().tombstone(&obj.key()).map(|t| t.source);
            if let Some(source) = source {
                self.observer.deletion_candidate(self.resource(), source);
            }
        }
        (self.sink)(&change, self.arrived);
    }

    pub(super) fn report_size(&self) {
        let (live, tombstones) = {
            let cache = self.store.read();
            (cache.len(), cache.tombstone_count())
        };
        self.observer.cache_size(self.resource(), live, tombstones);
    }
}

/// The pause a 429 Too Many Requests asks for (its Status's
/// `retryAfterSeconds`, else one second); `None` for any other error.
pub(super) fn throttled(err: &kube::Error) -> Option<std::time::Duration> {
    match err {
        kube::Error::Api(status) if status.code == 429 => {
            let seconds = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
            Some(std::time::Duration::from_secs(u64::from(seconds.max(1))))
        }
        _ => None,
    }
}
