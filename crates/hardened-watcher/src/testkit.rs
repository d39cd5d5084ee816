//! Test fixtures: a tiny cached type, a deterministic backoff, the one list
//! path applied in a single call, and a harness around the very
//! [`WatchCore`] the driver runs.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::runtime::utils::Backoff;

use super::cache::{Cache, Cached, Change, ObjectKey, Outcome, StaleReason, WatchEventKind};
use super::core::{Step, WatchCore};
use super::decode::Listed;
use super::list::{ListDiffBuilder, ListMode, ListOutcome, Page};
use super::machine::{Action, Machine, RestartReason};
use super::object::{ListDiff, LiveRead};
use super::observer::CountingObserver;
use super::store::Store;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub key: ObjectKey,
    pub uid: String,
    pub rv: String,
    /// Stands for the object's content (e.g. a Service's selector).
    pub data: String,
}

impl Cached for Obj {
    fn key(&self) -> ObjectKey {
        self.key.clone()
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.rv
    }
}

/// `name` in namespace "ns", with `uid` and `rv`.
pub fn obj(name: &str, uid: &str, rv: &str) -> Obj {
    Obj {
        key: key(name),
        uid: uid.to_owned(),
        rv: rv.to_owned(),
        data: format!("{name}@{rv}"),
    }
}

/// An API error answer with `code` and `reason`.
pub fn api_error(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("test", reason)
            .with_code(code)
            .boxed(),
    )
}

/// A 429 answer asking for a pause of `retry_after_seconds`.
pub fn throttled_error(retry_after_seconds: u32) -> kube::Error {
    let mut throttled = api_error(429, "TooManyRequests");
    if let kube::Error::Api(status) = &mut throttled {
        status.details = Some(kube::core::response::StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds,
        });
    }
    throttled
}

pub fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ns", name)
}

/// Steps of 1 s, 2 s, ..., counting resets (so tests see when backoff restarts).
#[derive(Clone, Default)]
pub struct TestBackoff {
    pub resets: Arc<AtomicU32>,
    pub steps: Arc<AtomicU32>,
}

impl Iterator for TestBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let step = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        Some(Duration::from_secs(u64::from(step)))
    }
}

impl Backoff for TestBackoff {
    fn reset(&mut self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.steps.store(0, Ordering::SeqCst);
    }
}

pub fn machine() -> Machine {
    Machine::new(500, Box::new(TestBackoff::default()))
}

/// A list applied through the one list path as a single page, in `mode`.
pub fn list_in<T: Cached>(
    cache: &mut Cache<T>,
    items: Vec<Listed<T>>,
    list_rv: &str,
    mode: ListMode,
) -> ListOutcome<T> {
    let mut builder = ListDiffBuilder::new(cache, mode);
    builder.apply_page(cache, items, list_rv);
    builder.finish(cache)
}

/// A relist of `items` at `list_rv` (one page, [`ListMode::Recover`]).
pub fn apply_list<T: Cached>(cache: &mut Cache<T>, items: Vec<T>, list_rv: &str) -> ListDiff<T> {
    list_in(
        cache,
        items.into_iter().map(Listed::Item).collect(),
        list_rv,
        ListMode::Recover,
    )
    .diff
}

/// [`apply_list`] with keys that were listed but could not be decoded.
pub fn apply_list_with_unknown(
    cache: &mut Cache<Obj>,
    items: Vec<Obj>,
    list_rv: &str,
    unknown: &HashSet<ObjectKey>,
) -> ListDiff<Obj> {
    let entries = items
        .into_iter()
        .map(Listed::Item)
        .chain(unknown.iter().cloned().map(|k| Listed::Unknown(Some(k))))
        .collect();
    list_in(cache, entries, list_rv, ListMode::Recover).diff
}

/// The RV of the live object `name`.
pub fn rv_of(cache: &Cache<Obj>, name: &str) -> Option<String> {
    cache.get(&key(name)).map(|o| o.rv.clone())
}

/// Objects as the items of a list page.
pub fn items(objs: &[Obj]) -> Vec<Listed<Obj>> {
    objs.iter().cloned().map(Listed::Item).collect()
}

/// A cache with `items` listed at `list_rv`.
pub fn cache_with(items: Vec<Obj>, list_rv: &str) -> Cache<Obj> {
    let mut cache = Cache::new();
    let diff = apply_list(&mut cache, items, list_rv);
    assert_eq!(diff.deletion_candidates, 0);
    cache
}

/// One page as the driver hands it to the core.
pub fn page(items: Vec<Obj>, token: Option<&str>, list_rv: &str) -> Page<Obj> {
    Page {
        items: items.into_iter().map(Listed::Item).collect(),
        resource_version: list_rv.to_owned(),
        continue_token: token.map(str::to_owned),
        remaining_item_count: None,
    }
}

/// The [`WatchCore`] the driver runs, driven by hand: pages, events and live
/// reads go in; the changes it delivers and what it reports come out.
pub struct Harness {
    pub core: WatchCore<Obj>,
    pub store: Store<Obj>,
    delivered: Arc<Mutex<Vec<Change<Obj>>>>,
    pub observer: Arc<CountingObserver>,
}

impl Harness {
    pub fn new() -> Self {
        let store = Store::new("objs");
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let sink_log = delivered.clone();
        let observer = Arc::new(CountingObserver::default());
        let core = WatchCore::new(
            store.clone(),
            Arc::new(move |change: &Change<Obj>, _arrived| {
                sink_log
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(change.clone());
            }),
            observer.clone(),
            500,
            Box::new(TestBackoff::default()),
        );
        Self {
            core,
            store,
            delivered,
            observer,
        }
    }

    /// Runs the initial list (one page) and asserts the core then watches.
    pub fn synced_with(items: Vec<Obj>, list_rv: &str) -> Self {
        let mut h = Self::new();
        h.expect_list(None);
        h.page(items, None, list_rv);
        h.expect_watch(list_rv);
        h.take_changes();
        h
    }

    pub fn step(&mut self) -> Step {
        self.core.next_step()
    }

    pub fn expect_list(&mut self, token: Option<&str>) {
        self.expect_list_at(token, None);
    }

    /// A resync's start: the probe reads the store's revision, `store_rv`,
    /// and the first page asks for exactly that.
    pub fn expect_resync_list(&mut self, store_rv: &str) {
        self.probe(store_rv);
        self.expect_list_at(None, Some(store_rv));
    }

    pub fn expect_list_at(&mut self, token: Option<&str>, exact_rv: Option<&str>) {
        let step = self.step();
        assert_eq!(
            step,
            Step::Act(Action::List {
                continue_token: token.map(str::to_owned),
                limit: 500,
                exact_rv: exact_rv.map(str::to_owned),
            }),
            "phase: {:?}",
            self.core.machine().phase()
        );
    }

    pub fn expect_watch(&mut self, rv: &str) {
        assert_eq!(
            self.step(),
            Step::Act(Action::Watch {
                resource_version: rv.to_owned()
            })
        );
    }

    /// The probe (after a lost connection, or before a resync's list),
    /// answered with the store's `store_rv`.
    pub fn probe(&mut self, store_rv: &str) {
        assert_eq!(
            self.step(),
            Step::Act(Action::Probe),
            "phase: {:?}",
            self.core.machine().phase()
        );
        self.core.on_probe(Ok(store_rv.to_owned()));
    }

    pub fn expect_read(&mut self, name: &str) {
        assert_eq!(self.step(), Step::Read { key: key(name) });
    }

    /// Feeds one list page (the core applies it at once).
    pub fn page(&mut self, items: Vec<Obj>, token: Option<&str>, list_rv: &str) {
        self.core.on_list_page(Ok(page(items, token, list_rv)));
    }

    pub fn event(&mut self, kind: WatchEventKind, o: Obj) -> Outcome<Obj> {
        self.core.on_event(kind, o)
    }

    pub fn bookmark(&mut self, rv: &str) {
        let line = format!(
            r#"{{"type":"BOOKMARK","object":{{"kind":"Obj","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}}}}}}"#
        );
        let ends = self
            .core
            .on_line(&line, |_| panic!("a bookmark has no object to decode"));
        assert!(!ends);
    }

    pub fn error_event(&mut self, code: u16, reason: &str) {
        let line = format!(
            r#"{{"type":"ERROR","object":{{"kind":"Status","apiVersion":"v1","status":"Failure","code":{code},"reason":"{reason}"}}}}"#
        );
        let ends = self
            .core
            .on_line(&line, |_| panic!("an ERROR has no object to decode"));
        assert!(ends, "an ERROR event ends the watch");
    }

    /// Answers the pending [`Step::Read`].
    pub fn read(&mut self, read: LiveRead<Obj>) {
        self.core.on_read(Ok(read));
    }

    /// Every change delivered so far, in order.
    pub fn changes(&self) -> Vec<Change<Obj>> {
        self.delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn take_changes(&self) -> Vec<Change<Obj>> {
        std::mem::take(
            &mut *self
                .delivered
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    pub fn deletion_candidates(&self) -> Vec<ObjectKey> {
        self.changes()
            .iter()
            .filter_map(|c| match c {
                Change::DeletionCandidate(o) => Some(o.key.clone()),
                _ => None,
            })
            .collect()
    }

    /// What the observer counted under `what` (e.g. "stale/older_rv").
    pub fn count(&self, what: &str) -> u64 {
        self.observer.get(&format!("objs/{what}"))
    }

    /// Stale events reported, by reason.
    pub fn stale(&self) -> Vec<(StaleReason, u64)> {
        [
            StaleReason::OlderRv,
            StaleReason::OlderUid,
            StaleReason::AlreadyDeleted,
        ]
        .into_iter()
        .map(|r| (r, self.count(&format!("stale/{}", r.metric_label()))))
        .filter(|(_, n)| *n > 0)
        .collect()
    }

    pub fn restarts(&self, reason: RestartReason) -> u64 {
        self.count(&format!("restart/{}", reason.metric_label()))
    }

    pub fn data(&self, name: &str) -> Option<String> {
        self.store.get(&key(name)).map(|o| o.data.clone())
    }
}

/// One event logged through `tracing`: its message and its other fields,
/// each as the log line shows it.
#[derive(Clone, Debug, Default)]
pub struct Logged {
    pub message: String,
    pub fields: BTreeMap<&'static str, String>,
}

impl tracing::field::Visit for Logged {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record(field, value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}"));
    }
}

impl Logged {
    fn record(&mut self, field: &tracing::field::Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.insert(field.name(), value);
        }
    }
}

/// A `tracing` layer that keeps every event.
struct Recorder(Arc<Mutex<Vec<Logged>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut logged = Logged::default();
        event.record(&mut logged);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(logged);
    }
}

/// Runs `f` with a subscriber on this thread that records what it logs.
pub fn logged<R>(f: impl FnOnce() -> R) -> (R, Vec<Logged>) {
    use tracing_subscriber::layer::SubscriberExt;
    let events = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Recorder(events.clone()));
    let result = tracing::subscriber::with_default(subscriber, f);
    let events = std::mem::take(&mut *events.lock().unwrap_or_else(PoisonError::into_inner));
    (result, events)
}
