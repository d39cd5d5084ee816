//! The async driver: executes the [`Machine`]'s actions against `kube::Api`
//! and feeds the [`Cache`]. All decisions live in the machine and the cache;
//! this file only does I/O, locking and reporting.

use std::fmt::Debug;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::{AsyncBufReadExt, Stream, StreamExt};
use kube::api::{Api, WatchParams};
use kube::runtime::watcher::DefaultBackoff;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use super::cache::{Cache, Cached, Change, ListDiff, Outcome, Tombstone, WatchEventKind};
use super::decode::{Listed, RawMeta, WatchLine, decode_object, parse_watch_line};
use super::error::{ApiErrorKind, WatchError};
use super::list::{ListSnapshot, decode_page, fetch_page, snapshot_of};
use super::machine::{Action, Machine, PageOutcome, RestartReason};
use super::observer::WatchObserver;
use super::rv::RvObservation;

/// Tuning of one watcher.
#[derive(Clone, Copy, Debug)]
pub struct WatchConfig {
    /// Bounded resource label for logs and metrics ("services", "pods", ...).
    pub resource: &'static str,
    /// LIST page size.
    pub page_limit: u32,
    /// Server-side watch timeout; the server closes the stream after it and
    /// we resume from the highest RV.
    pub watch_timeout_secs: u32,
}

impl WatchConfig {
    pub fn new(resource: &'static str) -> Self {
        Self {
            resource,
            page_limit: super::machine::DEFAULT_PAGE_LIMIT,
            watch_timeout_secs: 290,
        }
    }
}

/// How long past the server-side watch timeout a silent stream is tolerated.
const WATCH_GRACE_SECS: u64 = 30;

/// The cache shared between the watcher (writer) and the reconciler.
pub type SharedCache<T> = Arc<RwLock<Cache<T>>>;

/// Where a watcher delivers its results.
pub struct WatchContext<T: Cached> {
    pub config: WatchConfig,
    pub cache: SharedCache<T>,
    /// Every applied change, in order. Deletion candidates included: the
    /// receiver must confirm them with a live read before acting.
    pub changes: mpsc::UnboundedSender<Change<T>>,
    pub observer: Arc<dyn WatchObserver>,
    /// Flips to `true` once the first consistent list has been applied.
    pub synced: watch::Sender<bool>,
}

/// Runs the watcher until `shutdown` turns `true` (→ `Ok(())`) or the change
/// receiver is dropped (→ `Err(ReceiverGone)`). API failures never end it:
/// they relist, resume or back off.
///
/// `project` turns a decoded `K` into the cached `T`; returning `None` means
/// "cannot be represented" and is counted as undecodable (do not use it to
/// filter: a filtered object would neither appear nor ever look deleted).
pub async fn run<K, T, P>(
    api: Api<K>,
    project: P,
    ctx: WatchContext<T>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), WatchError>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + 'static,
    T: Cached,
    P: Fn(K) -> Option<T> + Send + Sync,
{
    let span = info_span!("watch", resource = ctx.config.resource);
    let machine = Machine::new(ctx.config.page_limit, Box::new(DefaultBackoff::default()));
    let mut driver = Driver {
        api,
        project,
        ctx,
        machine,
        shutdown,
    };
    driver.run_loop().instrument(span).await
}

struct Driver<K, T: Cached, P> {
    api: Api<K>,
    project: P,
    ctx: WatchContext<T>,
    machine: Machine<Listed<T>>,
    shutdown: watch::Receiver<bool>,
}

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

impl<K, T, P> Driver<K, T, P>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + 'static,
    T: Cached,
    P: Fn(K) -> Option<T> + Send + Sync,
{
    fn resource(&self) -> &'static str {
        self.ctx.config.resource
    }

    async fn run_loop(&mut self) -> Result<(), WatchError> {
        let client = self.api.clone().into_client();
        let request = kube::core::Request::new(self.api.resource_url());
        info!("watcher starting");
        loop {
            if *self.shutdown.borrow() {
                return Ok(());
            }
            let flow = match self.machine.next_action() {
                Action::Backoff(delay) => self.backoff(delay).await,
                Action::List {
                    continue_token,
                    limit,
                } => {
                    self.list_page(&client, &request, limit, continue_token.as_deref())
                        .await?
                }
                Action::Watch { resource_version } => {
                    self.watch(&client, &request, &resource_version).await?
                }
            };
            if let Flow::Stop = flow {
                info!("watcher stopped");
                return Ok(());
            }
        }
    }

    async fn stopped(shutdown: &mut watch::Receiver<bool>) {
        // A dropped sender means nobody can ask us to stop any more: run on.
        if shutdown.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    async fn backoff(&mut self, delay: Duration) -> Flow {
        debug!(?delay, "backing off");
        tokio::select! {
            () = tokio::time::sleep(delay) => {
                self.machine.on_backoff_elapsed();
                Flow::Continue
            }
            () = Self::stopped(&mut self.shutdown) => Flow::Stop,
        }
    }

    async fn list_page(
        &mut self,
        client: &kube::Client,
        request: &kube::core::Request,
        limit: u32,
        continue_token: Option<&str>,
    ) -> Result<Flow, WatchError> {
        let page = tokio::select! {
            page = fetch_page(client, request, limit, continue_token) => page,
            () = Self::stopped(&mut self.shutdown) => return Ok(Flow::Stop),
        };
        match page.and_then(|body| decode_page(&body, &self.project)) {
            Ok(list) => {
                let entries = list.items;
                let bad = entries
                    .iter()
                    .filter(|e| matches!(e, Listed::Unknown(_)))
                    .count();
                for _ in 0..bad {
                    self.ctx.observer.undecodable(self.resource());
                }
                match self.machine.on_list_page(
                    entries,
                    list.continue_token,
                    &list.resource_version,
                ) {
                    PageOutcome::More => {}
                    PageOutcome::Complete(done) => self.apply_list(snapshot_of(done))?,
                    PageOutcome::Invalid => {
                        warn!("list page without resourceVersion; relisting after backoff");
                        self.ctx
                            .observer
                            .restart(self.resource(), RestartReason::ListError);
                    }
                }
            }
            Err(err) => {
                let reason = self.machine.on_list_error(ApiErrorKind::classify(&err));
                warn!(error = %err, reason = reason.metric_label(), "list failed");
                self.ctx.observer.restart(self.resource(), reason);
            }
        }
        Ok(Flow::Continue)
    }

    fn apply_list(&mut self, snapshot: ListSnapshot<T>) -> Result<(), WatchError> {
        let resource = self.resource();
        let diff: ListDiff<T> = {
            let mut cache = self
                .ctx
                .cache
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let unknown = if snapshot.complete {
                snapshot.unknown
            } else {
                // An unreadable item could be any cached object: let nothing
                // from this list count as deleted.
                cache
                    .iter()
                    .map(|obj| obj.key())
                    .chain(snapshot.unknown)
                    .collect()
            };
            cache.apply_list_with_unknown(snapshot.items, &snapshot.resource_version, &unknown)
        };
        info!(
            list_rv = %snapshot.resource_version,
            added = diff.added,
            updated = diff.updated,
            deletion_candidates = diff.deletion_candidates,
            stale = diff.stale.len(),
            kept_newer = diff.kept_newer,
            "consistent list applied as a diff"
        );
        self.ctx.observer.relist(resource);
        for reason in &diff.stale {
            self.ctx.observer.stale_ignored(resource, *reason);
        }
        for change in diff.changes {
            self.emit(change)?;
        }
        let flipped = self
            .ctx
            .synced
            .send_if_modified(|synced| !std::mem::replace(synced, true));
        if flipped {
            self.ctx.observer.synced(resource, true);
        }
        Ok(())
    }

    fn emit(&self, change: Change<T>) -> Result<(), WatchError> {
        if let Change::DeletionCandidate(obj) = &change {
            let cache = self
                .ctx
                .cache
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(Tombstone { source, .. }) = cache.tombstone(&obj.key()) {
                self.ctx
                    .observer
                    .deletion_candidate(self.resource(), *source);
            }
        }
        self.ctx
            .changes
            .send(change)
            .map_err(|_| WatchError::ReceiverGone {
                resource: self.resource(),
            })
    }

    async fn watch(
        &mut self,
        client: &kube::Client,
        request: &kube::core::Request,
        rv: &str,
    ) -> Result<Flow, WatchError> {
        let params = WatchParams::default().timeout(self.ctx.config.watch_timeout_secs);
        // bookmarks: WatchParams::default() asks for them; say so anyway.
        let params = WatchParams {
            bookmarks: true,
            ..params
        };
        let mut req = request
            .watch(&params, rv)
            .map_err(|source| WatchError::Request {
                resource: self.resource(),
                source,
            })?;
        req.extensions_mut().insert("watch");
        debug!(resource_version = rv, "watch starting");
        let started = tokio::select! {
            started = watch_lines(client, req) => started,
            () = Self::stopped(&mut self.shutdown) => return Ok(Flow::Stop),
        };
        let stream = match started {
            Ok(stream) => stream,
            Err(err) => {
                let reason = self
                    .machine
                    .on_watch_start_error(ApiErrorKind::classify(&err));
                warn!(error = %err, reason = reason.metric_label(), "watch start failed");
                self.ctx.observer.restart(self.resource(), reason);
                return Ok(Flow::Continue);
            }
        };
        self.machine.on_watch_started();
        let idle_limit =
            Duration::from_secs(u64::from(self.ctx.config.watch_timeout_secs) + WATCH_GRACE_SECS);
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle_limit, stream.next()) => next,
                () = Self::stopped(&mut self.shutdown) => return Ok(Flow::Stop),
            };
            let Ok(next) = next else {
                // The server should have closed the watch at its timeout: a
                // silent connection is a dead one (half-open TCP, lost NAT).
                warn!(?idle_limit, "watch silent past its timeout; reconnecting");
                self.ctx
                    .observer
                    .restart(self.resource(), self.machine.on_connect_error());
                return Ok(Flow::Continue);
            };
            let restart = match next {
                None => Some(self.machine.on_stream_end()),
                Some(Ok(line)) => self.on_line(&line)?,
                Some(Err(err)) => {
                    warn!(error = %err, "watch stream broke");
                    Some(self.machine.on_connect_error())
                }
            };
            if let Some(reason) = restart {
                debug!(reason = reason.metric_label(), resume_rv = ?self.machine.resume_rv(), "watch ended");
                self.ctx.observer.restart(self.resource(), reason);
                return Ok(Flow::Continue);
            }
        }
    }

    fn undecodable(&self, meta: Option<&RawMeta>, error: &str) {
        let key = meta.map(|m| m.key.to_string());
        warn!(object = ?key, error, "skipping undecodable object");
        self.ctx.observer.undecodable(self.resource());
    }

    fn observe_rv(&mut self, rv: &str) -> bool {
        let seen = self.machine.on_watch_event(rv);
        match seen {
            RvObservation::Regressed => {
                debug!(rv, resume_rv = ?self.machine.resume_rv(), "event RV below resume point; resume point kept");
                self.ctx.observer.rv_regression(self.resource());
            }
            RvObservation::Opaque => self.ctx.observer.opaque_rv(self.resource()),
            RvObservation::Advanced | RvObservation::Same => {}
        }
        seen == RvObservation::Opaque
    }

    /// One line of the watch stream: split into event type and raw object,
    /// then the object decoded straight from its text (see [`parse_watch_line`]).
    fn on_line(&mut self, line: &str) -> Result<Option<RestartReason>, WatchError> {
        match parse_watch_line(line) {
            WatchLine::Object(kind, raw) => self.on_event(kind, raw),
            WatchLine::Bookmark(rv) => {
                self.machine.on_bookmark(&rv);
                Ok(None)
            }
            WatchLine::Error(status) => {
                warn!(code = status.code, reason = %status.reason, message = %status.message, "watch ERROR event; relisting");
                Ok(Some(
                    self.machine
                        .on_watch_error_event(status.code, &status.reason),
                ))
            }
            // A bare Status line (some proxies send one): same as ERROR.
            WatchLine::Status(status) => Ok(Some(
                self.machine
                    .on_watch_error_event(status.code, &status.reason),
            )),
            // Neither a watch event nor a real Status.
            WatchLine::Unrecognised(error) => {
                self.undecodable(None, &error);
                Ok(None)
            }
            WatchLine::Truncated => Ok(None),
        }
    }

    fn on_event(
        &mut self,
        kind: WatchEventKind,
        raw: &RawValue,
    ) -> Result<Option<RestartReason>, WatchError> {
        let obj = match decode_object::<K, T>(raw, &self.project) {
            Ok(obj) => obj,
            Err(bad) => {
                // Its RV still counts for the resume point: the event exists.
                if let Some(meta) = &bad.meta {
                    self.observe_rv(&meta.resource_version);
                }
                self.undecodable(bad.meta.as_ref(), &bad.error);
                return Ok(None);
            }
        };
        let key = obj.key();
        let rv = obj.resource_version().to_owned();
        let opaque = self.observe_rv(&rv);
        let (outcome, fell_back) = {
            let mut cache = self
                .ctx
                .cache
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let before = cache.opaque_rv_count();
            let outcome = cache.apply_event(kind, obj);
            (outcome, cache.opaque_rv_count() > before)
        };
        if fell_back && !opaque {
            self.ctx.observer.opaque_rv(self.resource());
        }
        match outcome {
            Outcome::Applied(change) => self.emit(change)?,
            Outcome::Stale(reason) => {
                debug!(object = %key, rv, ?kind, reason = reason.metric_label(), "stale event ignored");
                self.ctx.observer.stale_ignored(self.resource(), reason);
            }
            Outcome::Unchanged => {}
        }
        Ok(None)
    }
}

/// The lines of a WATCH response, framed and filtered as kube's
/// `Client::request_events` does, but left undecoded: the driver splits each
/// into its event type and raw object ([`parse_watch_line`]) instead of
/// building a `WatchEvent<serde_json::Value>`.
async fn watch_lines(
    client: &kube::Client,
    mut req: http::Request<Vec<u8>>,
) -> Result<impl Stream<Item = Result<String, kube::Error>> + use<>, kube::Error> {
    // As kube does: Kubernetes >= 1.37 gzips watch streams one member per
    // event, which the decompression layer cannot read.
    req.headers_mut()
        .entry(http::header::ACCEPT_ENCODING)
        .or_insert(http::HeaderValue::from_static("identity"));
    let body = client.request_stream(req).await?;
    Ok(body.lines().filter_map(|line| async move {
        match line {
            Ok(line) => Some(Ok(line)),
            // Our client timeout, or an unexpected EOF from the chunked
            // decoder or TLS (tends to happen after 300+ s): end the stream
            // so that it is resumed.
            Err(err) if err.kind() == std::io::ErrorKind::TimedOut => {
                warn!(error = %err, "timeout in watch poll");
                None
            }
            Err(err) if ends_like_eof(&err) => {
                warn!(error = ?err, "eof in watch poll");
                None
            }
            Err(err) => Some(Err(kube::Error::ReadEvents(err))),
        }
    }))
}

/// Whether a body read error is an unexpected EOF, however deeply nested
/// (kube-client's own test for resumable watch ends).
fn ends_like_eof(err: &std::io::Error) -> bool {
    // HTTP and TLS stacks nest a handful of errors; stop on a cycle.
    const MAX_SOURCE_DEPTH: usize = 16;
    if err.kind() == std::io::ErrorKind::UnexpectedEof
        || err.to_string().contains("unexpected EOF during chunk")
    {
        return true;
    }
    let mut current = err
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    for _ in 0..MAX_SOURCE_DEPTH {
        let Some(err) = current else {
            return false;
        };
        if let Some(io_err) = err.downcast_ref::<std::io::Error>()
            && io_err.kind() == std::io::ErrorKind::UnexpectedEof
        {
            return true;
        }
        if err.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        current = err.source();
    }
    false
}
