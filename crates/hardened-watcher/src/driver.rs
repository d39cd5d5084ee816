//! The async driver: performs the [`WatchCore`]'s steps against the API
//! server and hands back what came of them. Every decision lives in the core
//! (and its machine and cache); this file only does I/O and waiting.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::OptionFuture;
use futures::{AsyncBufReadExt, AsyncRead, AsyncReadExt, Stream, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::api::{Api, WatchParams};
use kube::runtime::watcher::DefaultBackoff;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use super::core::{Sink, Step, WatchCore};
use super::core_beside::BesideStep;
use super::count::{self, CountCheck, listed_count};
use super::decode::{WatchInput, decode_object, parse_watch_line, peek_watch_line};
use super::error::WatchError;
use super::list::{
    ListBody, PageAt, check_status, content_type, decode_page, fetch_page, fetch_page_either,
    page_rv,
};
use super::live;
use super::machine::Action;
use super::object::{Cached, Change, LiveRead};
use super::observer::WatchObserver;
use super::protobuf::{self, ProtobufDecode};
use super::selectors::Selectors;
use super::store::{Request, Store};

/// Tuning of one watcher (set through [`WatcherBuilder`](crate::WatcherBuilder)).
#[derive(Clone, Debug)]
pub(crate) struct WatchConfig {
    /// LIST page size.
    pub page_limit: u32,
    /// Server-side watch timeout; the server closes the stream after it and
    /// we resume from the highest RV.
    pub watch_timeout_secs: u32,
    /// Which objects it sees.
    pub selectors: Selectors,
    /// The share of the time a paced resync's pages take.
    pub resync_list_share: f64,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            page_limit: super::machine::DEFAULT_PAGE_LIMIT,
            watch_timeout_secs: 290,
            selectors: Selectors::default(),
            resync_list_share: 1.0,
        }
    }
}

/// How long past the server-side watch timeout a silent stream is tolerated.
const WATCH_GRACE_SECS: u64 = 30;

/// How long a watch that has delivered a BOOKMARK may then stay silent.
/// kube-apiserver's watch cache sends each watcher a bookmark about once a
/// minute: two and a half of its periods without a byte mean the server
/// (or the connection to it: a half-open TCP, a load balancer that dropped
/// it) is gone, long before the watch's own timeout would say so.
const BOOKMARK_SILENCE: Duration = Duration::from_secs(150);

/// What the watcher knows of the server's bookmarks, across its watches.
/// kube-apiserver sends them on every watch that asks (a watch served from
/// its cache, the default for every resource), so they are expected from
/// the first watch on; a server that lets two watches in a row go silent
/// without ever having sent one is taken not to send any (its watch cache
/// off), and its watches are then given their timeout instead.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bookmarks {
    seen: bool,
    silent_watches: u8,
}

impl Bookmarks {
    /// Watches found silent, none with a bookmark ever seen, before the
    /// server is taken not to send bookmarks.
    const SILENT_WATCHES_BEFORE_GIVING_UP: u8 = 2;

    pub(crate) fn on_bookmark(&mut self) {
        self.seen = true;
        self.silent_watches = 0;
    }

    /// A watch was given up for its silence.
    pub(crate) fn on_silent_watch(&mut self) {
        self.silent_watches = self.silent_watches.saturating_add(1);
    }

    fn expected(self) -> bool {
        self.seen || self.silent_watches < Self::SILENT_WATCHES_BEFORE_GIVING_UP
    }

    /// How long a watch may be silent before it is taken for dead: while
    /// bookmarks are expected, [`BOOKMARK_SILENCE`] (or its timeout and a
    /// grace, if shorter); otherwise its timeout and a grace.
    pub(crate) fn idle_limit(self, watch_timeout_secs: u32) -> Duration {
        let timeout = Duration::from_secs(u64::from(watch_timeout_secs) + WATCH_GRACE_SECS);
        if self.expected() {
            timeout.min(BOOKMARK_SILENCE)
        } else {
            timeout
        }
    }
}

/// Resolves once `shutdown` turns true. A dropped sender means nobody can ask
/// us to stop any more: then it never resolves.
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One watcher: what it watches, how each object is cached, where the
/// changes go. Made by [`Watcher::builder`]; [`Watcher::run`] runs it, or
/// [`Watcher::into_event_stream`] turns it into a stream of kube-runtime
/// events.
pub struct Watcher<K: kube::Resource, T: Cached, P> {
    pub(crate) api: Api<K>,
    pub(crate) dyntype: K::DynamicType,
    project: P,
    /// Decodes an object's protobuf message; `None` (as assembled): JSON only.
    pub(crate) protobuf: Option<ProtobufDecode<K>>,
    store: Store<T>,
    sink: Sink<T>,
    observer: Arc<dyn WatchObserver>,
    config: WatchConfig,
}

/// Reports nothing: the observer of a [`Watcher`] not given one.
struct Silent;

impl WatchObserver for Silent {}

impl<K, T, P> Watcher<K, T, P>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    T: Cached,
    P: Fn(K) -> Option<T> + Send + Sync,
{
    /// What [`WatcherBuilder::build`](crate::WatcherBuilder::build) made.
    pub(crate) fn assemble(
        api: Api<K>,
        dyntype: K::DynamicType,
        project: P,
        store: Store<T>,
        sink: Sink<T>,
        observer: Option<Arc<dyn WatchObserver>>,
        config: WatchConfig,
    ) -> Self {
        Self {
            api,
            dyntype,
            project,
            protobuf: None,
            store,
            sink,
            observer: observer.unwrap_or_else(|| Arc::new(Silent)),
            config,
        }
    }

    /// The store this watcher fills: read it, repair it after live reads,
    /// ask it for a resync. Cheap to clone; take it before `run`.
    pub fn store(&self) -> Store<T> {
        self.store.clone()
    }

    /// Calls `also` after the change handler the builder was given.
    pub(crate) fn chain_sink(&mut self, also: Sink<T>) {
        let first = Arc::clone(&self.sink);
        self.sink = Arc::new(move |change: &Change<T>, arrived: Instant| {
            first(change, arrived);
            also(change, arrived);
        });
    }

    /// Runs until `shutdown` turns `true`. API failures never end it: they
    /// relist, resume or back off. Fails only when the store already has a
    /// watcher.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<(), WatchError> {
        let requests = self
            .store
            .take_requests()
            .ok_or_else(|| WatchError::AlreadyWatched {
                resource: self.store.resource().to_owned(),
            })?;
        let span = info_span!("watch", resource = self.store.resource());
        let mut core = WatchCore::new(
            self.store,
            self.sink,
            self.observer,
            self.config.page_limit,
            Box::new(DefaultBackoff::default()),
        );
        core.pace_resync_lists(self.config.resync_list_share);
        let mut driver = Driver {
            api: self.api,
            dyntype: self.dyntype,
            project: self.project,
            protobuf: self.protobuf,
            core,
            config: self.config,
            requests,
            shutdown,
            bookmarks: Bookmarks::default(),
        };
        driver.run_loop().instrument(span).await
    }
}

struct Driver<K: kube::Resource, T: Cached, P> {
    api: Api<K>,
    /// What `K` is, for the URLs of live reads.
    dyntype: K::DynamicType,
    project: P,
    protobuf: Option<ProtobufDecode<K>>,
    core: WatchCore<T>,
    config: WatchConfig,
    requests: mpsc::UnboundedReceiver<Request>,
    shutdown: watch::Receiver<bool>,
    bookmarks: Bookmarks,
}

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

impl<K, T, P> Driver<K, T, P>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    T: Cached,
    P: Fn(K) -> Option<T> + Send + Sync,
{
    async fn run_loop(&mut self) -> Result<(), WatchError> {
        let client = self.api.clone().into_client();
        let request = kube::core::Request::new(self.api.resource_url());
        info!("watcher starting");
        loop {
            if *self.shutdown.borrow() {
                return Ok(());
            }
            let flow = match self.core.next_step() {
                Step::Act(Action::Backoff(delay)) => self.backoff(delay).await,
                Step::Act(Action::List {
                    continue_token,
                    limit,
                    exact_rv,
                }) => {
                    let selectors = self.config.selectors.clone();
                    let page = PageAt {
                        limit,
                        continue_token: continue_token.as_deref(),
                        exact_rv: exact_rv.as_deref(),
                        selectors: Some(&selectors),
                    };
                    self.list_page(&client, &request, &page).await
                }
                Step::Act(Action::Probe) => {
                    let store_rv = tokio::select! {
                        store_rv = store_revision(&client, &request) => store_rv,
                        () = stopped(&mut self.shutdown) => return Ok(()),
                    };
                    self.core.input_arrived(Instant::now());
                    self.core.on_probe(store_rv);
                    Flow::Continue
                }
                Step::Act(Action::Watch { resource_version }) => {
                    self.watch(&client, &request, &resource_version).await?
                }
                Step::Read { key } => {
                    let read = tokio::select! {
                        read = read_live::<K>(&client, &self.dyntype, &key, &self.config.selectors) => read,
                        () = stopped(&mut self.shutdown) => return Ok(()),
                    };
                    self.core.input_arrived(Instant::now());
                    let project = &self.project;
                    let read = read.and_then(|read| match read {
                        LiveRead::Found(obj) => project(obj)
                            .map(LiveRead::Found)
                            .ok_or_else(|| unprojectable(&key)),
                        LiveRead::Gone => Ok(LiveRead::Gone),
                    });
                    self.core.on_read(read);
                    Flow::Continue
                }
            };
            if let Flow::Stop = flow {
                info!("watcher stopped");
                return Ok(());
            }
        }
    }

    /// A count check (see `count.rs`): the store's current resourceVersion
    /// (a one-item consistent LIST, as a resync's probe), then a one-item
    /// LIST at exactly that resourceVersion, whose count is set against how
    /// many objects the cache holds.
    async fn count_check(
        &self,
        client: &kube::Client,
        request: &kube::core::Request,
    ) -> CountCheck {
        let store_rv = match store_revision(client, request).await {
            Ok(rv) if !rv.is_empty() => rv,
            Ok(_) => return CountCheck::Unknown("the store's resourceVersion was empty".into()),
            Err(err) => {
                return CountCheck::Unknown(format!(
                    "reading the store's resourceVersion failed: {err}"
                ));
            }
        };
        // With a selector the server gives no count past the first item:
        // the check then answers Unknown, and a full list follows.
        let exact = PageAt {
            limit: 1,
            exact_rv: Some(&store_rv),
            selectors: Some(&self.config.selectors),
            ..PageAt::default()
        };
        let listed = fetch_page(client, request, &exact)
            .await
            .and_then(|body| listed_count(&body).map_err(kube::Error::SerdeError))
            .map_err(|err| err.to_string());
        // What the last full list could not decode the store still holds.
        let (cached, cache_rv) = {
            let cache = self.core.store().read();
            (
                cache.len() + cache.skipped_in_last_list(),
                cache.highest_rv().map(str::to_owned),
            )
        };
        let checked = count::compare(&store_rv, cached, listed);
        debug!(?checked, ?cache_rv, "count check");
        // Repairs and housekeeping change the cache outside any list or
        // event: its size gauges are brought up to date here, as a full
        // list would.
        self.core.report_size();
        checked
    }

    async fn backoff(&mut self, delay: Duration) -> Flow {
        debug!(?delay, "backing off");
        let deadline = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    self.core.on_backoff_elapsed();
                    return Flow::Continue;
                }
                request = self.requests.recv() => {
                    if let Some(request) = request
                        && self.core.on_request(request)
                    {
                        return Flow::Continue;
                    }
                }
                () = stopped(&mut self.shutdown) => return Flow::Stop,
            }
        }
    }

    async fn list_page(
        &mut self,
        client: &kube::Client,
        request: &kube::core::Request,
        page: &PageAt<'_>,
    ) -> Flow {
        let protobuf = self.protobuf.is_some();
        let page = tokio::select! {
            page = fetch_list_body(client, request, page, protobuf) => page,
            () = stopped(&mut self.shutdown) => return Flow::Stop,
        };
        self.core.input_arrived(Instant::now());
        let page = self.decode_list_body(page);
        self.core.on_list_page(page);
        Flow::Continue
    }

    /// Decodes a LIST page's body object by object.
    fn decode_list_body(
        &self,
        body: Result<ListBody, kube::Error>,
    ) -> Result<super::list::Page<T>, kube::Error> {
        let project = &self.project;
        body.and_then(|body| match (self.protobuf, &body) {
            (Some(decode), _) => body.decode(decode, project),
            (None, ListBody::Json(text)) => decode_page(text, project),
            // Protobuf comes only from a list that asked for it.
            (None, ListBody::Protobuf(_)) => {
                Err(kube::Error::Service("an unrequested protobuf list".into()))
            }
        })
    }

    /// Hands the answer of a request of the resync listing beside the watch
    /// to the core; returns whether the watch must end.
    fn on_beside_answer(&mut self, answer: BesideAnswer) -> bool {
        self.core.input_arrived(Instant::now());
        match answer {
            BesideAnswer::Probe(store_rv) => self.core.on_beside_probe(store_rv),
            BesideAnswer::Page(body, took) => {
                let page = self.decode_list_body(body);
                self.core.on_beside_page(page, took)
            }
            BesideAnswer::PauseOver => {
                self.core.on_beside_pause_elapsed();
                false
            }
        }
    }

    async fn watch(
        &mut self,
        client: &kube::Client,
        request: &kube::core::Request,
        rv: &str,
    ) -> Result<Flow, WatchError> {
        let flow = self.watch_until_closed(client, request, rv).await;
        // However it ended, a resync listing beside it ends with it.
        self.core.on_watch_closed();
        flow
    }

    async fn watch_until_closed(
        &mut self,
        client: &kube::Client,
        request: &kube::core::Request,
        rv: &str,
    ) -> Result<Flow, WatchError> {
        let params = self.config.selectors.on_watch(WatchParams {
            // WatchParams::default() asks for bookmarks; say so anyway.
            bookmarks: true,
            ..WatchParams::default().timeout(self.config.watch_timeout_secs)
        });
        let mut req = request
            .watch(&params, rv)
            .map_err(|source| WatchError::Request {
                resource: self.core.store().resource().to_owned(),
                source,
            })?;
        req.extensions_mut().insert("watch");
        debug!(resource_version = rv, "watch starting");
        let started = tokio::select! {
            started = watch_stream(client, req, self.protobuf.is_some()) => started,
            () = stopped(&mut self.shutdown) => return Ok(Flow::Stop),
        };
        let stream = match started {
            Ok(stream) => stream,
            Err(err) => {
                self.core.on_watch_start_error(&err);
                return Ok(Flow::Continue);
            }
        };
        self.core.on_watch_started();
        let mut stream = std::pin::pin!(stream);
        let mut heard = tokio::time::Instant::now();
        // The request of a resync listing beside this watch, while one is out.
        let mut beside: Option<BesideRequest> = None;
        loop {
            if beside.is_none()
                && let Some(step) = self.core.beside_step()
            {
                beside = Some(beside_request(
                    client,
                    request,
                    step,
                    self.protobuf.is_some(),
                    &self.config.selectors,
                ));
            }
            let idle_limit = self.bookmarks.idle_limit(self.config.watch_timeout_secs);
            let next = tokio::select! {
                next = tokio::time::timeout_at(heard + idle_limit, stream.next()) => next,
                Some(answer) = OptionFuture::from(beside.as_mut()), if beside.is_some() => {
                    beside = None;
                    if self.on_beside_answer(answer) {
                        return Ok(Flow::Continue);
                    }
                    continue;
                }
                asked = self.requests.recv() => {
                    let Some(asked) = asked else { continue };
                    // A count check is answered here, the stream left unread
                    // meanwhile: the cache stays where the check took it.
                    if let Request::CountCheck(reply) = asked {
                        let mut shutdown = self.shutdown.clone();
                        let checked = tokio::select! {
                            checked = self.count_check(client, request) => checked,
                            () = stopped(&mut shutdown) => return Ok(Flow::Stop),
                        };
                        let _ = reply.send(checked);
                    } else if self.core.on_request(asked) {
                        return Ok(Flow::Continue);
                    }
                    continue;
                }
                () = stopped(&mut self.shutdown) => return Ok(Flow::Stop),
            };
            let Ok(next) = next else {
                // The server should have closed the watch at its timeout, or
                // sent a bookmark: a silent connection is a dead one
                // (half-open TCP, lost NAT, a dropped load balancer flow).
                warn!(?idle_limit, "watch silent too long; reconnecting");
                self.bookmarks.on_silent_watch();
                self.core.on_connect_error();
                return Ok(Flow::Continue);
            };
            match next {
                None => {
                    self.core.on_stream_end();
                    return Ok(Flow::Continue);
                }
                Some(Ok(chunk)) => {
                    heard = tokio::time::Instant::now();
                    self.core.input_arrived(Instant::now());
                    let project = &self.project;
                    let input = match (chunk, self.protobuf) {
                        // Our own write coming back (the cache already
                        // holds its answer): known from the metadata.
                        (Chunk::Line(line), _)
                            if peek_watch_line(&line)
                                .is_some_and(|(_, meta)| self.core.on_known_event(&meta)) =>
                        {
                            continue;
                        }
                        (Chunk::Line(line), _) => parse_watch_line(&line)
                            .decode(|raw| decode_object::<K, T>(raw, project)),
                        (Chunk::Frame(frame), Some(decode)) => {
                            protobuf::parse_watch_frame(&frame, |raw| {
                                protobuf::decode_object(raw, decode, project)
                            })
                        }
                        // Frames come only from a watch that asked for them.
                        (Chunk::Frame(_), None) => {
                            WatchInput::Unrecognised("unrequested protobuf frame".to_owned())
                        }
                    };
                    if matches!(input, WatchInput::Bookmark(_)) {
                        self.bookmarks.on_bookmark();
                    }
                    if self.core.on_input(input) {
                        return Ok(Flow::Continue);
                    }
                }
                Some(Err(err)) => {
                    warn!(error = %err, "watch stream broke");
                    self.core.on_connect_error();
                    return Ok(Flow::Continue);
                }
            }
        }
    }
}

/// A live read whose object the projection rejects: the dispute stays open.
fn unprojectable(key: &super::object::ObjectKey) -> kube::Error {
    kube::Error::Service(format!("{key}: the object read live could not be projected").into())
}

/// Reads `key` live as a watcher with `selectors` sees it: a GET, or with
/// selectors a LIST of that one object through them.
async fn read_live<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    key: &super::object::ObjectKey,
    selectors: &Selectors,
) -> Result<LiveRead<K>, kube::Error>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    if selectors.is_empty() {
        live::get::<K>(client, dyntype, key).await
    } else {
        live::get_selected::<K>(client, dyntype, key, selectors).await
    }
}

/// The store's current revision: the resourceVersion of a one-item
/// consistent LIST (the probe).
async fn store_revision(
    client: &kube::Client,
    request: &kube::core::Request,
) -> Result<String, kube::Error> {
    let one = PageAt {
        limit: 1,
        ..PageAt::default()
    };
    fetch_page(client, request, &one)
        .await
        .and_then(|body| page_rv(&body))
}

/// A LIST page's body, in protobuf where the watcher decodes it.
async fn fetch_list_body(
    client: &kube::Client,
    request: &kube::core::Request,
    page: &PageAt<'_>,
    protobuf: bool,
) -> Result<ListBody, kube::Error> {
    if protobuf {
        fetch_page_either(client, request, page).await
    } else {
        fetch_page(client, request, page).await.map(ListBody::Json)
    }
}

/// What a request of a resync listing beside the watch brought back.
enum BesideAnswer {
    Probe(Result<String, kube::Error>),
    /// The page, and how long it took from asking to answer.
    Page(Result<ListBody, kube::Error>, Duration),
    PauseOver,
}

/// A request of a resync listing beside the watch, in flight.
type BesideRequest = Pin<Box<dyn Future<Output = BesideAnswer> + Send>>;

/// Sends what [`WatchCore::beside_step`] asked for.
fn beside_request(
    client: &kube::Client,
    request: &kube::core::Request,
    step: BesideStep,
    protobuf: bool,
    selectors: &Selectors,
) -> BesideRequest {
    let client = client.clone();
    let request = request.clone();
    let selectors = selectors.clone();
    Box::pin(async move {
        match step {
            BesideStep::Probe => BesideAnswer::Probe(store_revision(&client, &request).await),
            BesideStep::List {
                continue_token,
                limit,
                exact_rv,
            } => {
                let page = PageAt {
                    limit,
                    continue_token: continue_token.as_deref(),
                    exact_rv: exact_rv.as_deref(),
                    selectors: Some(&selectors),
                };
                let asked = Instant::now();
                let body = fetch_list_body(&client, &request, &page, protobuf).await;
                BesideAnswer::Page(body, asked.elapsed())
            }
            BesideStep::Pause(delay) => {
                tokio::time::sleep(delay).await;
                BesideAnswer::PauseOver
            }
        }
    })
}

/// One unit of a WATCH response: a JSON line, or a protobuf frame (its
/// length prefix removed).
enum Chunk {
    Line(String),
    Frame(Vec<u8>),
}

/// The events of a WATCH response, framed as kube's
/// `Client::request_events` frames lines, but left undecoded: the driver
/// splits each into its event type and object ([`parse_watch_line`],
/// [`protobuf::parse_watch_frame`]). With `protobuf`, the request asks for
/// protobuf first, and the answer's Content-Type says which framing it has:
/// a server or proxy that only speaks JSON answers JSON lines.
async fn watch_stream(
    client: &kube::Client,
    mut req: http::Request<Vec<u8>>,
    protobuf: bool,
) -> Result<impl Stream<Item = Result<Chunk, kube::Error>> + use<>, kube::Error> {
    // As kube does: Kubernetes >= 1.37 gzips watch streams one member per
    // event, which the decompression layer cannot read.
    req.headers_mut()
        .entry(http::header::ACCEPT_ENCODING)
        .or_insert(http::HeaderValue::from_static("identity"));
    if protobuf {
        req.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(protobuf::ACCEPT),
        );
    }
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let res = check_status(res).await?;
    let framed = protobuf && protobuf::is_protobuf(content_type(&res).as_deref());
    let body = res
        .into_body()
        .into_data_stream()
        .map_err(std::io::Error::other)
        .into_async_read();
    let chunks = if framed {
        // The body is dropped after an error: nothing follows a broken frame.
        futures::stream::unfold(Some(body), |body| async move {
            let mut body = body?;
            match next_frame(&mut body).await {
                Ok(Some(frame)) => Some((Ok(Chunk::Frame(frame)), Some(body))),
                Ok(None) => None,
                Err(err) => Some((Err(err), None)),
            }
        })
        .left_stream()
    } else {
        body.lines().map_ok(Chunk::Line).right_stream()
    };
    Ok(chunks.filter_map(|chunk| async move {
        match chunk {
            Ok(chunk) => Some(Ok(chunk)),
            // Our client timeout, or an unexpected EOF from the chunked
            // decoder or TLS (tends to happen after 300+ s), or a stream
            // cut mid-frame: end the stream so that it is resumed.
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

/// The next length-prefixed frame; `None` at the end of the stream between
/// frames. A stream that ends inside a frame is an unexpected EOF (as a
/// truncated last JSON line, it ends the watch); a length past
/// [`protobuf::MAX_FRAME`] is no frame, and fails the stream.
pub(crate) async fn next_frame(
    body: &mut (impl AsyncRead + Unpin),
) -> std::io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        let n = body.read(&mut prefix[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += n;
    }
    let len = usize::try_from(u32::from_be_bytes(prefix)).unwrap_or(usize::MAX);
    if len > protobuf::MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("watch frame of {len} bytes"),
        ));
    }
    let mut frame = vec![0; len];
    body.read_exact(&mut frame).await?;
    Ok(Some(frame))
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

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
