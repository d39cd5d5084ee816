//! The list/watch state machine: synchronous, no client, no clock, so every
//! failure sequence can be scripted in a unit test. The async driver
//! (`driver.rs`) only executes [`Machine::next_action`] and reports results.
//!
//! Rules (the failures behind them are in the crate documentation):
//! - LIST is consistent (resourceVersion unset, never "0"; a resync's at
//!   exactly the store's current revision) and paginated; its pages are
//!   applied as they come ([`ListDiffBuilder`](super::list::ListDiffBuilder)).
//! - WATCH starts from the list's RV; bookmarks and events advance the resume
//!   point, which never goes backwards, except when a consistent list shows
//!   the store itself was rewound ([`Machine::rewind_to`]).
//! - A resync lists beside the open watch (`core_beside.rs`); a resync that
//!   cannot (a failed probe, a refused exact list, a rewound store) ends the
//!   watch, lists, and resumes the watch from where it was, so the events
//!   the list overtook still arrive and tell lag from drift.
//! - 410 Expired, ERROR 500 (PrevKv=nil) or any other ERROR event → relist.
//! - A clean stream end → resume from the highest RV.
//! - Connection errors → backoff with jitter, then a probe (a one-item
//!   consistent LIST) before resuming: a store that came back below the
//!   resume point (etcd restored from a backup while the API server was
//!   down) relists at once instead of watching a future RV, which the API
//!   server accepts and answers with silence.

use std::time::Duration;

use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;

use super::error::ApiErrorKind;
use super::rv::{ResumePoint, RvObservation};

pub use super::reason::RestartReason;

/// Default LIST page size.
pub const DEFAULT_PAGE_LIMIT: u32 = 500;

/// Where the machine is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Fetching list pages; `None` is the first page.
    Listing {
        /// `None` for the first page.
        continue_token: Option<String>,
    },
    /// Watching (or about to) from `resume_rv`, the highest RV seen.
    Watching {
        /// The highest RV seen.
        resume_rv: String,
    },
    /// After a lost connection: a one-item consistent LIST tells whether the
    /// store is still at or past `resume_rv` before the watch resumes there.
    Probing {
        /// The RV the watch resumes from if the store has not gone back.
        resume_rv: String,
    },
    /// A relist is due (the first page has not been fetched yet).
    Relisting {
        /// Why the relist.
        reason: RestartReason,
    },
    /// Waiting `delay` before going on with `next`.
    BackingOff {
        /// How long to wait.
        delay: Duration,
        /// The phase after the wait.
        next: Box<Phase>,
    },
}

/// What the driver must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// A consistent LIST page: resourceVersion unset, or for the first page
    /// of a resync exactly the store's current revision (`exact_rv`, set by
    /// the core: see `WatchCore::next_step`); `continue_token` for pages
    /// after the first.
    List {
        /// `None` for the first page.
        continue_token: Option<String>,
        /// Page size.
        limit: u32,
        /// `resourceVersion` with `resourceVersionMatch=Exact`, for the
        /// first page of a resync only. The machine never sets it.
        exact_rv: Option<String>,
    },
    /// WATCH from `resource_version` with bookmarks.
    Watch {
        /// The RV to watch from.
        resource_version: String,
    },
    /// A consistent LIST of one item, for its resourceVersion only (the
    /// store's current revision); then [`Machine::on_probe`].
    Probe,
    /// Sleep, then call [`Machine::on_backoff_elapsed`].
    Backoff(Duration),
}

/// Result of feeding a list page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageOutcome {
    /// More pages to fetch.
    More,
    /// The last page: the list is complete at `list_rv`. The caller ends the
    /// list and says where the watch starts: [`Machine::watch_from_list`],
    /// [`Machine::resume_after_list`] or [`Machine::rewind_to`].
    Complete {
        /// The RV of the whole list (its first page's).
        list_rv: String,
    },
    /// The page had no resourceVersion: discarded, backing off to relist.
    Invalid,
}

/// The list/watch state machine.
pub struct Machine {
    phase: Phase,
    resume: ResumePoint,
    page_limit: u32,
    backoff: Box<dyn Backoff>,
    /// The RV of the list being fetched (its first page's).
    list_rv: Option<String>,
    /// Events seen in the current watch connection.
    events_this_watch: u64,
    /// Consecutive relists without a successful list + event in between,
    /// to stop a server that errors right away from making us relist in a
    /// hot loop.
    relists_without_progress: u32,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("phase", &self.phase)
            .field("resume", &self.resume.get())
            .finish()
    }
}

impl Default for Machine {
    fn default() -> Self {
        Self::new(DEFAULT_PAGE_LIMIT, Box::new(DefaultBackoff::default()))
    }
}

impl Machine {
    /// A machine that starts with a consistent list.
    pub fn new(page_limit: u32, backoff: Box<dyn Backoff>) -> Self {
        Self {
            phase: Phase::Listing {
                continue_token: None,
            },
            resume: ResumePoint::default(),
            page_limit: page_limit.max(1),
            backoff,
            list_rv: None,
            events_this_watch: 0,
            relists_without_progress: 0,
        }
    }

    /// Where the machine is.
    #[cfg(test)]
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The highest RV seen (the point a watch resumes from).
    pub fn resume_rv(&self) -> Option<&str> {
        self.resume.get()
    }

    /// The LIST page size.
    pub fn page_limit(&self) -> u32 {
        self.page_limit
    }

    /// What the driver must do next.
    pub fn next_action(&self) -> Action {
        action_for(&self.phase, self.page_limit)
    }

    /// Whether the next action starts a new list (its first page).
    pub fn starts_list(&self) -> bool {
        matches!(
            self.phase,
            Phase::Listing {
                continue_token: None
            } | Phase::Relisting { .. }
        )
    }

    /// A LIST page arrived (`list_rv` is its metadata.resourceVersion; its
    /// items are the caller's business).
    pub fn on_list_page(&mut self, continue_token: Option<String>, list_rv: &str) -> PageOutcome {
        if list_rv.is_empty() {
            self.reset_list();
            self.back_off_then(Phase::Relisting {
                reason: RestartReason::ListError,
            });
            return PageOutcome::Invalid;
        }
        // All pages of one list share the snapshot of the first.
        if self.list_rv.is_none() {
            self.list_rv = Some(list_rv.to_owned());
        }
        match continue_token.filter(|token| !token.is_empty()) {
            Some(token) => {
                self.phase = Phase::Listing {
                    continue_token: Some(token),
                };
                PageOutcome::More
            }
            None => {
                let list_rv = self.list_rv.take().unwrap_or_else(|| list_rv.to_owned());
                self.backoff.reset();
                PageOutcome::Complete { list_rv }
            }
        }
    }

    /// After a first list or a relist: watch from the list's RV (or from a
    /// higher RV already seen).
    pub fn watch_from_list(&mut self, list_rv: &str) {
        self.resume.observe(list_rv);
        self.start_watching();
    }

    /// After a resync list: resume the watch where it was, so that the events
    /// the list overtook still arrive (they tell watch lag from drift).
    pub fn resume_after_list(&mut self) {
        self.start_watching();
    }

    /// After a list that found the store rewound: the resume point goes back
    /// to the list's RV, the only point the store can serve from.
    pub fn rewind_to(&mut self, list_rv: &str) {
        self.resume = ResumePoint::at(list_rv);
        self.start_watching();
    }

    fn start_watching(&mut self) {
        self.phase = match self.resume.get() {
            Some(rv) => Phase::Watching {
                resume_rv: rv.to_owned(),
            },
            None => Phase::Relisting {
                reason: RestartReason::ListError,
            },
        };
        self.events_this_watch = 0;
    }

    /// A LIST page failed. Returns the restart reason.
    pub fn on_list_error(&mut self, err: ApiErrorKind) -> RestartReason {
        let mid_list = matches!(
            self.phase,
            Phase::Listing {
                continue_token: Some(_)
            }
        );
        self.reset_list();
        match err {
            // The continue token's snapshot was compacted: start over from
            // scratch, at once (the server is healthy).
            ApiErrorKind::Expired if mid_list => {
                self.phase = Phase::Relisting {
                    reason: RestartReason::ContinueExpired,
                };
                RestartReason::ContinueExpired
            }
            ApiErrorKind::Connect => {
                self.back_off_then(Phase::Relisting {
                    reason: RestartReason::ConnectError,
                });
                RestartReason::ConnectError
            }
            _ => {
                self.back_off_then(Phase::Relisting {
                    reason: RestartReason::ListError,
                });
                RestartReason::ListError
            }
        }
    }

    /// A LIST page was refused with 429 Too Many Requests (API Priority
    /// and Fairness, or a server's in-flight limit): the same page is asked
    /// for again once the pause the server asked for (`retry_after`, 1 to
    /// 60 s) is over, the pages already applied kept. A throttled page never
    /// restarts a long list from its first page, which would only add load
    /// to a server that asked for less.
    pub fn on_list_throttled(&mut self, retry_after: Duration) {
        let again = match std::mem::replace(
            &mut self.phase,
            Phase::Relisting {
                reason: RestartReason::ListError,
            },
        ) {
            Phase::BackingOff { next, .. } => *next,
            other => other,
        };
        self.phase = Phase::BackingOff {
            delay: retry_after.clamp(Duration::from_secs(1), Duration::from_secs(60)),
            next: Box::new(again),
        };
    }

    /// The watch request was accepted (HTTP 200).
    pub fn on_watch_started(&mut self) {
        self.events_this_watch = 0;
    }

    /// An ADDED/MODIFIED/DELETED event with object RV `rv` (also for
    /// undecodable objects whose RV could be read).
    pub fn on_watch_event(&mut self, rv: &str) -> RvObservation {
        self.observe(rv)
    }

    /// A BOOKMARK: advances the resume point without an object.
    pub fn on_bookmark(&mut self, rv: &str) -> RvObservation {
        self.observe(rv)
    }

    fn observe(&mut self, rv: &str) -> RvObservation {
        if self.events_this_watch == 0 {
            // The connection works again: the next failure starts small.
            self.backoff.reset();
        }
        self.events_this_watch += 1;
        self.relists_without_progress = 0;
        let seen = self.resume.observe(rv);
        if let (Phase::Watching { resume_rv }, Some(highest)) = (&mut self.phase, self.resume.get())
            && resume_rv != highest
        {
            *resume_rv = highest.to_owned();
        }
        seen
    }

    /// An ERROR event in the stream (`code`, `reason` from its Status):
    /// always a relist, never a resume.
    pub fn on_watch_error_event(&mut self, code: u16, reason: &str) -> RestartReason {
        let why = match ApiErrorKind::from_status(code, reason) {
            ApiErrorKind::Expired => RestartReason::Expired,
            _ if code == 500 => RestartReason::WatchError500,
            _ => RestartReason::OtherWatchError,
        };
        self.relist(why);
        why
    }

    /// The WATCH request itself failed.
    pub fn on_watch_start_error(&mut self, err: ApiErrorKind) -> RestartReason {
        match err {
            ApiErrorKind::Expired => {
                self.relist(RestartReason::Expired);
                RestartReason::Expired
            }
            // Server unreachable, restarting or throttling: what we have is
            // still valid, resume after a pause.
            ApiErrorKind::Connect | ApiErrorKind::Transient(_) => {
                self.back_off_then(self.probing());
                RestartReason::ConnectError
            }
            ApiErrorKind::Rejected(_) | ApiErrorKind::Decode => {
                self.back_off_then(Phase::Relisting {
                    reason: RestartReason::WatchRejected,
                });
                RestartReason::WatchRejected
            }
        }
    }

    /// The connection broke mid-stream (I/O error, reset).
    pub fn on_connect_error(&mut self) -> RestartReason {
        match self.phase {
            Phase::Watching { .. } | Phase::Probing { .. } => self.back_off_then(self.probing()),
            _ => {
                self.reset_list();
                self.back_off_then(Phase::Relisting {
                    reason: RestartReason::ConnectError,
                });
            }
        }
        RestartReason::ConnectError
    }

    /// The server closed the stream cleanly: resume from the highest RV. If
    /// the stream ended without a single event, pause first so a proxy that
    /// closes at once cannot make us spin.
    pub fn on_stream_end(&mut self) -> RestartReason {
        let next = self.watching();
        if self.events_this_watch == 0 {
            self.back_off_then(next);
        } else {
            self.phase = next;
        }
        self.events_this_watch = 0;
        RestartReason::StreamEnded
    }

    /// The probe's answer: `store_behind` when the store's revision is below
    /// what was already seen (it was rewound). Returns the restart reason
    /// when that makes a relist.
    pub fn on_probe(&mut self, store_behind: bool) -> Option<RestartReason> {
        if store_behind {
            self.relist(RestartReason::RewindSuspected);
            return Some(RestartReason::RewindSuspected);
        }
        self.phase = self.watching();
        None
    }

    /// The probe failed. The server still unreachable or overloaded: probe
    /// again after a pause. Any other answer (a LIST forbidden where the
    /// WATCH is allowed, a body we cannot read) skips the probe, which is
    /// only an early check: the periodic resync still finds a rewind.
    pub fn on_probe_error(&mut self, err: ApiErrorKind) {
        match err {
            ApiErrorKind::Connect | ApiErrorKind::Transient(_) => {
                self.back_off_then(self.probing());
            }
            ApiErrorKind::Expired | ApiErrorKind::Rejected(_) | ApiErrorKind::Decode => {
                self.phase = self.watching();
            }
        }
    }

    /// The backoff is over: go on with the phase that waited.
    pub fn on_backoff_elapsed(&mut self) {
        let phase = std::mem::replace(
            &mut self.phase,
            Phase::Listing {
                continue_token: None,
            },
        );
        self.phase = match phase {
            Phase::BackingOff { next, .. } => *next,
            other => other,
        };
    }

    /// Relists now, whatever the phase (a resync, or a rewound store).
    pub fn request_relist(&mut self, why: RestartReason) {
        self.reset_list();
        self.events_this_watch = 0;
        self.phase = Phase::Relisting { reason: why };
    }

    fn relist(&mut self, why: RestartReason) {
        self.reset_list();
        self.events_this_watch = 0;
        self.relists_without_progress += 1;
        let next = Phase::Relisting { reason: why };
        // 410 is the normal compaction path: relist at once. Repeated errors
        // with no progress in between back off.
        if self.relists_without_progress > 1 {
            self.back_off_then(next);
        } else {
            self.phase = next;
        }
    }

    /// Where a resume goes after a lost connection: probe first.
    fn probing(&self) -> Phase {
        match self.watching() {
            Phase::Watching { resume_rv } => Phase::Probing { resume_rv },
            other => other,
        }
    }

    fn watching(&self) -> Phase {
        match (&self.phase, self.resume.get()) {
            (_, Some(rv)) => Phase::Watching {
                resume_rv: rv.to_owned(),
            },
            (Phase::Watching { resume_rv } | Phase::Probing { resume_rv }, None) => {
                Phase::Watching {
                    resume_rv: resume_rv.clone(),
                }
            }
            // Never watched: nothing to resume from, list first.
            (_, None) => Phase::Relisting {
                reason: RestartReason::ConnectError,
            },
        }
    }

    fn back_off_then(&mut self, next: Phase) {
        // DefaultBackoff never ends; a custom one that does caps at 30 s.
        let delay = self.backoff.next().unwrap_or(Duration::from_secs(30));
        self.phase = Phase::BackingOff {
            delay,
            next: Box::new(next),
        };
    }

    fn reset_list(&mut self) {
        self.list_rv = None;
    }
}

fn action_for(phase: &Phase, limit: u32) -> Action {
    match phase {
        Phase::Listing { continue_token } => Action::List {
            continue_token: continue_token.clone(),
            limit,
            exact_rv: None,
        },
        Phase::Relisting { .. } => Action::List {
            continue_token: None,
            limit,
            exact_rv: None,
        },
        Phase::Watching { resume_rv } => Action::Watch {
            resource_version: resume_rv.clone(),
        },
        Phase::Probing { .. } => Action::Probe,
        Phase::BackingOff { delay, .. } => Action::Backoff(*delay),
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
