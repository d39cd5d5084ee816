//! [`WatcherBuilder`]: how a [`Watcher`] is put together. Everything but the
//! API has a default, so `Watcher::builder(api).build()` is a whole-object
//! watcher with its own store.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use serde::de::DeserializeOwned;

use super::core::Sink;
use super::driver::{WatchConfig, Watcher};
use super::object::{Cached, Change, Whole};
use super::observer::WatchObserver;
use super::protobuf::ProtobufDecode;
use super::store::Store;

/// The projection of a builder that keeps each object whole.
type WholeObject<K> = fn(K) -> Option<Whole<K>>;

/// Builder state: the cached type can still change ([`WatcherBuilder::project`]).
#[derive(Debug)]
pub struct Unbound;

/// Builder state: a store or a change handler fixed the cached type.
#[derive(Debug)]
pub struct Bound;

/// Puts a [`Watcher`] together; made by [`Watcher::builder`] or
/// [`Watcher::builder_with`].
///
/// `K` is the watched resource, `T` what the cache keeps of each object
/// ([`Whole<K>`] unless [`project`](WatcherBuilder::project) says otherwise),
/// `P` the projection. The last parameter only makes sure the projection is
/// chosen before anything that depends on `T` (the store, the change
/// handler).
#[must_use = "a builder does nothing until `build` and `run`"]
pub struct WatcherBuilder<K: kube::Resource, T: Cached, P, S = Unbound> {
    api: Api<K>,
    dyntype: K::DynamicType,
    project: P,
    protobuf: Option<ProtobufDecode<K>>,
    store: Option<Store<T>>,
    resource: Option<Arc<str>>,
    on_change: Option<Sink<T>>,
    observer: Option<Arc<dyn WatchObserver>>,
    config: WatchConfig,
    state: PhantomData<S>,
}

impl<K> Watcher<K, Whole<K>, WholeObject<K>>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
{
    /// A builder for a watcher of `api` that caches whole objects. For
    /// k8s-openapi types and `#[derive(CustomResource)]` types; a type found
    /// by discovery takes [`Watcher::builder_with`].
    pub fn builder(api: Api<K>) -> WatcherBuilder<K, Whole<K>, WholeObject<K>>
    where
        K::DynamicType: Default,
    {
        Self::builder_with(api, K::DynamicType::default())
    }

    /// [`Watcher::builder`] for a resource described by `dyntype` (an
    /// `ApiResource` for `DynamicObject`), as `Api::all_with` is to `Api::all`.
    pub fn builder_with(
        api: Api<K>,
        dyntype: K::DynamicType,
    ) -> WatcherBuilder<K, Whole<K>, WholeObject<K>> {
        WatcherBuilder {
            api,
            dyntype,
            project: |object| Some(Whole(object)),
            protobuf: None,
            store: None,
            resource: None,
            on_change: None,
            observer: None,
            config: WatchConfig::default(),
            state: PhantomData,
        }
    }
}

impl<K, T, P> WatcherBuilder<K, T, P, Unbound>
where
    K: kube::Resource,
    T: Cached,
{
    /// Caches `project(object)` instead of the whole object: a few fields of
    /// it, typically, so a large cluster's cache stays small.
    ///
    /// `project` returning `None` means "cannot be represented" and is
    /// counted as undecodable: do not use it to filter, since a filtered
    /// object would neither appear nor ever look deleted.
    pub fn project<U, F>(self, project: F) -> WatcherBuilder<K, U, F, Unbound>
    where
        U: Cached,
        F: Fn(K) -> Option<U> + Send + Sync,
    {
        WatcherBuilder {
            api: self.api,
            dyntype: self.dyntype,
            project,
            protobuf: self.protobuf,
            store: None,
            resource: self.resource,
            on_change: None,
            observer: self.observer,
            config: self.config,
            state: PhantomData,
        }
    }
}

impl<K, T, P, S> WatcherBuilder<K, T, P, S>
where
    K: kube::Resource,
    T: Cached,
{
    /// Fills `store`, made beforehand and shared with the rest of the
    /// program (default: a store of its own, from [`Watcher::store`]).
    pub fn store(self, store: Store<T>) -> WatcherBuilder<K, T, P, Bound> {
        WatcherBuilder {
            store: Some(store),
            ..self.bind()
        }
    }

    /// Calls `on_change` with every change the watcher applies, in order:
    /// watch events, list diffs and repairs alike, and the [`Instant`] the
    /// input it came from arrived (the watch line, the list page that
    /// completed the list, the live read's answer), to measure from. It runs on the watcher's
    /// task with no lock held, so it must not block: queue work, never do it
    /// there. Deletion candidates included: see [`Change::DeletionCandidate`].
    pub fn on_change(
        self,
        on_change: impl Fn(&Change<T>, Instant) + Send + Sync + 'static,
    ) -> WatcherBuilder<K, T, P, Bound> {
        WatcherBuilder {
            on_change: Some(Arc::new(on_change)),
            ..self.bind()
        }
    }

    /// The label of a store the builder makes itself (the store given to
    /// [`store`](WatcherBuilder::store) has its own): a bounded name such as
    /// "pods", used in logs and passed to the observer. Default: the type's
    /// name, such as "Pod".
    pub fn resource(mut self, resource: impl Into<Arc<str>>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// Where the watcher's counters go (default: nowhere).
    pub fn observer(mut self, observer: Arc<dyn WatchObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Objects per LIST page (default 500).
    pub fn page_limit(mut self, page_limit: u32) -> Self {
        self.config.page_limit = page_limit;
        self
    }

    /// The share of the time a paced resync
    /// ([`Store::resync_paced`](crate::Store::resync_paced)) that
    /// lists beside the open watch keeps the API server serving its pages
    /// (default 1: pages back to back). After each page it waits as long as
    /// the page took × (1 / share − 1), the watch's events applied
    /// meanwhile: the list's cost is spread, so that others' requests, and
    /// the events the watch delivers, are not answered slower behind
    /// back-to-back pages. Values outside (0, 1] count as 1.
    pub fn resync_list_share(mut self, share: f64) -> Self {
        self.config.resync_list_share = share;
        self
    }

    /// The server-side timeout of each WATCH request, after which the server
    /// closes it and the watcher resumes from the highest resourceVersion
    /// (default 290 s), in whole seconds, at least one (the API takes
    /// seconds, and 0 would mean the server's own default). A stream silent
    /// for 150 s counts as dead (kube-apiserver sends a bookmark a minute);
    /// one silent for the timeout and 30 s more, once two watches in a row
    /// went silent without the server ever having sent a bookmark.
    pub fn watch_timeout(mut self, timeout: Duration) -> Self {
        self.config.watch_timeout_secs =
            u32::try_from(timeout.as_secs()).map_or(u32::MAX, |secs| secs.max(1));
        self
    }

    /// Sees only the objects whose labels match `selector` (as `kubectl
    /// --selector` takes it, e.g. `app=web,tier!=cache`). The API server
    /// applies it to every LIST and WATCH: an object whose labels stop
    /// matching arrives as a DELETED event and is missing from the next
    /// list, as a deleted one is; a receiver that confirms deletion
    /// candidates live must read through the same selector
    /// ([`live::get_selected`](crate::live::get_selected)), as the
    /// watcher's own reads of disputed items do. The server gives no count
    /// for a list with a selector, so [`Store::count_check`] answers
    /// [`CountCheck::Unknown`](crate::CountCheck::Unknown) when more than
    /// one object matches.
    pub fn labels(mut self, selector: &str) -> Self {
        self.config.selectors.labels = Some(selector.to_owned());
        self
    }

    /// Sees only the objects whose fields match `selector` (as `kubectl
    /// --field-selector` takes it, e.g. `spec.nodeName=node-a`; the
    /// resource decides which fields it can select on). Everything
    /// [`labels`](WatcherBuilder::labels) says holds for it too.
    pub fn fields(mut self, selector: &str) -> Self {
        self.config.selectors.fields = Some(selector.to_owned());
        self
    }

    /// Asks the API server for protobuf (`application/vnd.kubernetes.protobuf`)
    /// on LIST and WATCH, and decodes each object's message with `decode`
    /// (default: JSON only). `decode` gets one object's own message, as
    /// k8s.io/api's `generated.proto` describes it (the `k8s\0` prefix and
    /// the `runtime.Unknown` envelope removed), and returns it as `K`, or why
    /// not; the projection then runs as for JSON. It may read only the
    /// fields the projection needs: prost skips the others unbuilt.
    ///
    /// The answer's Content-Type decides, request by request: a server that
    /// cannot serve protobuf (a custom API server, a CRD, a proxy that only
    /// speaks JSON) answers JSON, which is decoded as without this option.
    /// An object that `decode` rejects is skipped and counted, with its key
    /// and resourceVersion read from its ObjectMeta, as a bad JSON object is.
    /// Live reads of disputed objects stay JSON.
    pub fn protobuf(mut self, decode: fn(&[u8]) -> Result<K, String>) -> Self {
        self.protobuf = Some(decode);
        self
    }

    fn bind(self) -> WatcherBuilder<K, T, P, Bound> {
        WatcherBuilder {
            api: self.api,
            dyntype: self.dyntype,
            project: self.project,
            protobuf: self.protobuf,
            store: self.store,
            resource: self.resource,
            on_change: self.on_change,
            observer: self.observer,
            config: self.config,
            state: PhantomData,
        }
    }
}

impl<K, T, P, S> WatcherBuilder<K, T, P, S>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    T: Cached,
    P: Fn(K) -> Option<T> + Send + Sync,
{
    /// The watcher; [`Watcher::run`] or [`Watcher::into_event_stream`] runs it.
    pub fn build(self) -> Watcher<K, T, P> {
        let store = self.store.unwrap_or_else(|| {
            Store::new(
                self.resource
                    .unwrap_or_else(|| short_type_name::<K>().into()),
            )
        });
        let mut watcher = Watcher::assemble(
            self.api,
            self.dyntype,
            self.project,
            store,
            self.on_change.unwrap_or_else(|| Arc::new(|_, _| {})),
            self.observer,
            self.config,
        );
        watcher.protobuf = self.protobuf;
        watcher
    }
}

/// `Pod` of `k8s_openapi::api::core::v1::Pod`: a bounded, static label.
fn short_type_name<K>() -> &'static str {
    let full = std::any::type_name::<K>();
    let path = full.split('<').next().unwrap_or(full);
    path.rsplit("::").next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::short_type_name;

    #[test]
    fn the_default_label_is_the_bare_type_name() {
        assert_eq!(short_type_name::<k8s_openapi::api::core::v1::Pod>(), "Pod");
        assert_eq!(
            short_type_name::<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::Pod>>(),
            "PartialObjectMeta"
        );
    }
}
