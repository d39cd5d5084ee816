//! A resync that lists beside the open watch.
//!
//! A resync used to end the watch, list, and resume the watch from where it
//! was, so that the events the list overtook still arrived. Every change
//! made while the list ran then waited for it: 4 s at 100,000 pods, and as
//! long as the API server kept the list waiting (30 s and more while its
//! etcd client hung on a stopped member). Listing beside the watch, the
//! events go on being applied as they come, and the list's pages are
//! applied between them.
//!
//! Nothing in the list's diff needs the watch to stand still: the list is
//! at one resourceVersion R (the store's revision, read by a probe first,
//! as [`WatchCore::next_step`] explains), and the cache's rules for a list
//! already keep what is newer than R — an object an event brought past R
//! is kept over the listed copy, a DELETE past R keeps the object gone, an
//! object created past R is no deletion candidate. Events at or below R
//! that arrive after a page overtook them are replays, and explain the
//! differences the page made (watch lag, not drift).
//!
//! Whatever the beside list cannot do alone it hands back to the list the
//! watch waits for: a failed or refused probe or page (that resync lists
//! the latest state, watch closed), a store below the cache's mark, pages
//! of different snapshots, disputed items that need live reads. A watch
//! that ends while the list runs takes the list with it (its upserts
//! stand); the resync starts over beside the next watch, or the relist that
//! follows answers it.

use std::cmp::Ordering;
use std::time::Duration;

use tracing::{debug, warn};

use super::core::{ExactResync, Finished, WatchCore};
use super::list::{ListDiffBuilder, ListMode, Page};
use super::machine::RestartReason;
use super::object::{Cached, ObjectKey};
use super::rv::compare_rv;

/// Where a resync listing beside the open watch stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Beside {
    /// The probe for the store's revision is to be sent.
    Probe,
    /// A page is to be asked for: the first (at exactly the probed
    /// revision) when `continue_token` is `None`.
    Page {
        /// `None` for the first page.
        continue_token: Option<String>,
    },
    /// A page is asked for after `delay`: a throttled page again after the
    /// server's pause, or a paced resync's next page.
    Pause {
        /// How long to wait.
        delay: Duration,
        /// The page to ask for then.
        continue_token: Option<String>,
    },
    /// A request is out: its answer comes next.
    Waiting {
        /// The page asked for (`None`: the probe or the first page).
        continue_token: Option<String>,
    },
}

/// What the resync listing beside the watch asks the driver for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BesideStep {
    /// A one-item consistent LIST for the store's revision; then
    /// [`WatchCore::on_beside_probe`].
    Probe,
    /// A LIST page; then [`WatchCore::on_beside_page`].
    List {
        /// `None` for the first page.
        continue_token: Option<String>,
        /// Page size.
        limit: u32,
        /// For the first page: the probed revision, exactly.
        exact_rv: Option<String>,
    },
    /// A pause (a throttled page, or a paced resync between pages); then
    /// [`WatchCore::on_beside_pause_elapsed`].
    Pause(Duration),
}

/// How a resync listing beside the watch paces its pages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Pace {
    /// Whether this resync pauses between its pages (a scheduled one that
    /// nothing urgent has joined).
    pub paced: bool,
    /// The share of the time its pages may take, in (0, 1].
    pub share: f64,
    /// How long this resync's list has run: its pages and pauses so far.
    pub spent: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            paced: false,
            share: 1.0,
            spent: Duration::ZERO,
        }
    }
}

impl Pace {
    /// The pause after a page that took `took`, with `pages_left` pages
    /// still to come when the server counted them (none when not paced):
    /// see [`crate::pace::pause_within_span`]. Counts the page and the
    /// pause into the time spent.
    pub fn pause_after(&mut self, took: Duration, pages_left: Option<u64>) -> Duration {
        self.spent += took;
        if !self.paced {
            return Duration::ZERO;
        }
        let pause = crate::pace::pause_within_span(took, self.share, self.spent, pages_left);
        self.spent += pause;
        pause
    }
}

impl<T: Cached> WatchCore<T> {
    /// Starts a resync beside the open watch, `paced` or not.
    pub(super) fn start_beside(&mut self, paced: bool) {
        debug!(paced, "resync listing beside the open watch");
        self.beside = Some(Beside::Probe);
        self.beside_pace.paced = paced;
        self.beside_pace.spent = Duration::ZERO;
        self.exact = ExactResync::Unasked;
    }

    /// The next request of the resync listing beside the watch, if one is
    /// to be sent now: a probe, a list page, or a pause. The driver sends
    /// it while it goes on reading the watch, and hands back its answer to
    /// [`WatchCore::on_beside_probe`], [`WatchCore::on_beside_page`] or
    /// [`WatchCore::on_beside_pause_elapsed`].
    pub fn beside_step(&mut self) -> Option<BesideStep> {
        let limit = self.machine.page_limit();
        let (action, sent) = match self.beside.take()? {
            Beside::Probe => {
                // The floor is taken before the probe: the revision it reads
                // is then at or past everything the cache holds, unless the
                // store went back.
                self.list = Some(ListDiffBuilder::new(&self.store.read(), ListMode::Resync));
                self.list_skipped = 0;
                self.exact = ExactResync::Probing;
                (BesideStep::Probe, None)
            }
            Beside::Page { continue_token } => {
                // The probed revision stays: a throttled first page asks
                // for it again.
                let exact_rv = match (&continue_token, &self.exact) {
                    (None, ExactResync::At(rv)) => Some(rv.clone()),
                    _ => None,
                };
                let action = BesideStep::List {
                    continue_token: continue_token.clone(),
                    limit,
                    exact_rv,
                };
                (action, continue_token)
            }
            Beside::Pause {
                delay,
                continue_token,
            } => (BesideStep::Pause(delay), continue_token),
            waiting @ Beside::Waiting { .. } => {
                self.beside = Some(waiting);
                return None;
            }
        };
        self.beside = Some(Beside::Waiting {
            continue_token: sent,
        });
        Some(action)
    }

    /// The probe's answer: the store's revision, which the list then asks
    /// for exactly. Returns whether the watch must end (the resync goes on
    /// without it).
    pub fn on_beside_probe(&mut self, store_rv: Result<String, kube::Error>) -> bool {
        let store_rv = match store_rv {
            Ok(store_rv) => store_rv,
            Err(err) => {
                debug!(error = %err, "reading the store's revision for a resync failed; it lists the latest state");
                return self.beside_gives_up();
            }
        };
        let decimal = !store_rv.is_empty() && store_rv.bytes().all(|b| b.is_ascii_digit());
        let behind = self
            .list
            .as_ref()
            .and_then(ListDiffBuilder::floor)
            .is_some_and(|floor| {
                compare_rv(&store_rv, floor).is_none_or(|order| order == Ordering::Less)
            });
        if !decimal || behind {
            // Below what the cache has seen: a rewound store, which the
            // latest state shows.
            return self.beside_gives_up();
        }
        // Events up to the list's revision may arrive after a page overtook
        // them: replays, not stale news.
        self.replay_until = Some(store_rv.clone());
        self.exact = ExactResync::At(store_rv);
        self.beside = Some(Beside::Page {
            continue_token: None,
        });
        false
    }

    /// A page's answer, which took `took` from asking to answer (what a
    /// paced resync's pause is measured by). Returns whether the watch must
    /// end.
    pub fn on_beside_page(&mut self, page: Result<Page<T>, kube::Error>, took: Duration) -> bool {
        let asked = match &self.beside {
            Some(Beside::Waiting { continue_token }) => continue_token.clone(),
            _ => return false,
        };
        let page = match page {
            Ok(page) if !page.resource_version.is_empty() => page,
            Ok(_) => {
                warn!(
                    "resync list page without resourceVersion; the resync lists again without the watch"
                );
                return self.beside_gives_up();
            }
            Err(err) => {
                if let Some(retry_after) = super::core::throttled(&err) {
                    warn!(error = %err, ?retry_after, "resync list page throttled; asking for the same page again after the server's pause");
                    let delay = retry_after.clamp(Duration::from_secs(1), Duration::from_secs(60));
                    self.beside_pace.spent += took + delay;
                    self.beside = Some(Beside::Pause {
                        delay,
                        continue_token: asked,
                    });
                    return false;
                }
                warn!(error = %err, "a resync list beside the watch failed; this resync lists the latest state instead");
                return self.beside_gives_up();
            }
        };
        if !self.apply_page(page.items, &page.resource_version) {
            return self.beside_gives_up();
        }
        if let Some(token) = page.continue_token.filter(|token| !token.is_empty()) {
            let continue_token = Some(token);
            let pages_left =
                crate::pace::pages_for(page.remaining_item_count, self.machine.page_limit());
            let pause = self.beside_pace.pause_after(took, pages_left);
            self.beside = Some(if pause.is_zero() {
                Beside::Page { continue_token }
            } else {
                Beside::Pause {
                    delay: pause,
                    continue_token,
                }
            });
            return false;
        }
        self.beside = None;
        self.exact = ExactResync::Unasked;
        match self.end_list(page.resource_version) {
            Finished::Applied {
                list_rv,
                mode: ListMode::Resync,
            } => {
                // Events up to the list's RV still to come are replays.
                self.replay_until = Some(list_rv);
                self.list_applied();
                false
            }
            // A rewound store: the watch starts over from the list.
            Finished::Applied { list_rv, mode } => {
                self.after_list(&list_rv, mode);
                true
            }
            Finished::Inconsistent => {
                self.machine.request_relist(RestartReason::ListError);
                true
            }
            // Live reads first (the driver makes them between watches);
            // then the watch resumes where it was.
            Finished::Disputed => true,
            Finished::NoList => self.beside_gives_up(),
        }
    }

    /// The pause before the next page (a throttled page's, or a paced
    /// resync's) is over.
    pub fn on_beside_pause_elapsed(&mut self) {
        if let Some(Beside::Waiting { continue_token }) = self.beside.take() {
            self.beside = Some(Beside::Page { continue_token });
        }
    }

    /// The watch stream ended (for whatever reason): a resync listing
    /// beside it ends too, its upserts kept and nothing taken for deleted.
    /// The resync starts over beside the next watch, unless a relist answers
    /// it first.
    pub fn on_watch_closed(&mut self) {
        self.watch_open = false;
        if self.beside.take().is_some() {
            debug!("the watch ended while a resync listed beside it; the resync starts over");
            self.abort_list();
            self.exact = ExactResync::Unasked;
        }
    }

    /// A watch stream opened: a resync that a closed watch interrupted
    /// starts over beside it.
    pub(super) fn on_watch_opened(&mut self) {
        self.watch_open = true;
        if !self.waiting.is_empty()
            && self.list.is_none()
            && self.beside.is_none()
            && self.disputes.is_empty()
            && self.next_mode == ListMode::Recover
        {
            let paced = self.beside_pace.paced;
            self.start_beside(paced);
        }
    }

    /// An event for `key` at `rv` arrived while a resync lists beside the
    /// watch: at or below the list's revision, it explains what the list
    /// changed about `key` (the watch was only behind).
    pub(super) fn note_event_beside(&mut self, key: &ObjectKey, rv: &str) {
        if self.beside.is_some()
            && let Some(list) = self.list.as_mut()
        {
            list.note_event(key, rv);
        }
    }

    /// The resync cannot go on beside the watch: its list ends (upserts
    /// kept, nothing deleted), and the resync lists the latest state with
    /// the watch closed, as a resync did before. Returns true: the watch
    /// ends.
    fn beside_gives_up(&mut self) -> bool {
        self.beside = None;
        self.abort_list();
        self.exact = ExactResync::Refused;
        if self.next_mode == ListMode::Recover {
            self.next_mode = ListMode::Resync;
        }
        self.relist(RestartReason::Resync)
    }
}

#[cfg(test)]
#[path = "core_beside_tests.rs"]
mod tests;
