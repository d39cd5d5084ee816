//! How a [`WatchCore`] takes what a watch stream brings: its start and end,
//! each line (events, bookmarks, ERRORs), and the drift an event explains or
//! settles.

use tracing::{debug, warn};

use super::core::WatchCore;
use super::decode::{RawMeta, WatchInput};
use super::error::ApiErrorKind;
use super::object::{Cached, Outcome, WatchEventKind};
use super::rv::{RvObservation, compare_rv};

impl<T: Cached> WatchCore<T> {
    /// The WATCH request itself failed.
    pub fn on_watch_start_error(&mut self, err: &kube::Error) {
        let reason = self
            .machine
            .on_watch_start_error(ApiErrorKind::classify(err));
        warn!(error = %err, reason = reason.metric_label(), "watch start failed");
        self.observer.restart(self.resource(), reason);
    }

    /// The answer to [`Action::Probe`](super::machine::Action::Probe): the
    /// store's current revision (a one-item consistent LIST's RV), or why
    /// it could not be had. A revision below what this cache has seen means
    /// the store was rewound: relist now rather than watch from an RV the
    /// store has not reached, which the API server accepts and never
    /// answers.
    pub fn on_probe(&mut self, store_rv: Result<String, kube::Error>) {
        if self.exact == super::core::ExactResync::Probing {
            self.on_resync_probe(store_rv);
            return;
        }
        match store_rv {
            Ok(store_rv) => {
                let floor = self.store.read().list_floor();
                let behind = !store_rv.is_empty()
                    && super::cache::Cache::<T>::is_rewound(floor.as_deref(), &store_rv);
                if let Some(reason) = self.machine.on_probe(behind) {
                    warn!(
                        store_rv,
                        known_rv = floor.as_deref().unwrap_or("unknown"),
                        "the store's revision is below what this watcher has seen; relisting"
                    );
                    self.observer.restart(self.resource(), reason);
                }
            }
            Err(err) => {
                debug!(error = %err, "probe before resuming the watch failed");
                self.machine.on_probe_error(ApiErrorKind::classify(&err));
            }
        }
    }

    /// The WATCH request was accepted.
    pub fn on_watch_started(&mut self) {
        self.machine.on_watch_started();
        self.on_watch_opened();
    }

    /// The stream ended cleanly (the server's timeout).
    pub fn on_stream_end(&mut self) {
        self.on_watch_closed();
        let reason = self.machine.on_stream_end();
        debug!(reason = reason.metric_label(), resume_rv = ?self.machine.resume_rv(), "watch ended");
        self.observer.restart(self.resource(), reason);
    }

    /// The connection broke, or went silent.
    pub fn on_connect_error(&mut self) {
        self.on_watch_closed();
        let reason = self.machine.on_connect_error();
        self.observer.restart(self.resource(), reason);
    }

    /// One line of the watch stream, its object decoded by `decode`. Returns
    /// whether the watch must end (an ERROR: relist). The driver decodes
    /// first and calls [`WatchCore::on_input`]; the scripted tests feed lines.
    #[cfg(test)]
    pub fn on_line(
        &mut self,
        line: &str,
        decode: impl FnOnce(&serde_json::value::RawValue) -> Result<T, super::decode::Undecodable>,
    ) -> bool {
        self.on_input(super::decode::parse_watch_line(line).decode(decode))
    }

    /// One watch event, its object already decoded (from a JSON line or a
    /// protobuf frame). Returns whether the watch must end (an ERROR: relist).
    pub fn on_input(&mut self, input: WatchInput<T>) -> bool {
        match input {
            WatchInput::Object(kind, decoded) => {
                match decoded {
                    Ok(obj) => {
                        self.on_event(kind, obj);
                    }
                    Err(bad) => {
                        // Its RV still counts for the resume point: the event exists.
                        if let Some(meta) = &bad.meta {
                            self.observe_rv(&meta.resource_version);
                        }
                        self.undecodable(bad.meta.as_ref(), &bad.error);
                    }
                }
                false
            }
            WatchInput::Bookmark(rv) => {
                self.machine.on_bookmark(&rv);
                self.store.write().note_bookmark(&rv);
                self.settle_drift(&rv);
                false
            }
            WatchInput::Error(status) | WatchInput::Status(status) => {
                warn!(code = status.code, reason = %status.reason, message = %status.message, "watch ERROR event; relisting");
                self.on_watch_closed();
                let reason = self
                    .machine
                    .on_watch_error_event(status.code, &status.reason);
                self.observer.restart(self.resource(), reason);
                true
            }
            // Neither a watch event nor a real Status.
            WatchInput::Unrecognised(error) => {
                self.undecodable(None, &error);
                false
            }
            WatchInput::Truncated => false,
        }
    }

    fn undecodable(&self, meta: Option<&RawMeta>, error: &str) {
        let key = meta.map(|m| m.key.to_string());
        warn!(object = ?key, error, "skipping undecodable object");
        self.observer.undecodable(self.resource());
    }

    /// Feeds an event's RV to the resume point; returns whether it was opaque.
    fn observe_rv(&mut self, rv: &str) -> bool {
        let seen = self.machine.on_watch_event(rv);
        match seen {
            RvObservation::Regressed => {
                debug!(rv, resume_rv = ?self.machine.resume_rv(), "event RV below resume point; resume point kept");
                self.observer.rv_regression(self.resource());
            }
            RvObservation::Opaque => self.observer.opaque_rv(self.resource()),
            RvObservation::Advanced | RvObservation::Same => {}
        }
        seen == RvObservation::Opaque
    }

    /// An ADDED / MODIFIED event read only as far as its object's metadata
    /// (`peek_watch_line`): true when the cache holds exactly that state,
    /// which is then the whole of the event (the resume point and drift
    /// move as for any event; the cache is unchanged). False: nothing done,
    /// the event is to be decoded and applied.
    pub fn on_known_event(&mut self, meta: &RawMeta) -> bool {
        if !self.store.write().apply_unchanged_event(meta) {
            return false;
        }
        let rv = &meta.resource_version;
        self.note_event_beside(&meta.key, rv);
        self.observe_rv(rv);
        self.note_replay(rv);
        self.settle_drift(rv);
        true
    }

    /// Whether an event at `rv` replays what the last list already held; the
    /// first event past it ends the replay.
    fn note_replay(&mut self, rv: &str) -> bool {
        let replayed = self.replay_until.as_deref().is_some_and(|until| {
            matches!(
                compare_rv(rv, until),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        });
        if !replayed {
            self.replay_until = None;
        }
        replayed
    }

    /// Applies one decoded ADDED / MODIFIED / DELETED event; returns what it
    /// did to the cache.
    pub fn on_event(&mut self, kind: WatchEventKind, obj: T) -> Outcome<T> {
        let key = obj.key();
        let rv = obj.resource_version().to_owned();
        self.note_event_beside(&key, &rv);
        let opaque = self.observe_rv(&rv);
        let (outcome, fell_back) = {
            let mut cache = self.store.write();
            let before = cache.opaque_rv_count();
            let outcome = cache.apply_event(kind, obj);
            (outcome, cache.opaque_rv_count() > before)
        };
        if fell_back && !opaque {
            self.observer.opaque_rv(self.resource());
        }
        let replayed = self.note_replay(&rv);
        match &outcome {
            Outcome::Applied(change) => {
                self.emit(change.clone());
                self.report_size();
            }
            Outcome::Stale(reason) if !replayed => {
                debug!(object = %key, rv, ?kind, reason = reason.metric_label(), "stale event ignored");
                self.observer.stale_ignored(self.resource(), *reason);
            }
            Outcome::Stale(_) | Outcome::Unchanged => {}
        }
        self.settle_drift(&rv);
        outcome
    }

    fn settle_drift(&mut self, progress_rv: &str) {
        let settled = self.store.write().settle_drift(progress_rv);
        for kind in settled {
            self.observer.drift(self.resource(), kind);
        }
    }
}
