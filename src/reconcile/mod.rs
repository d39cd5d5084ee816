//! Reconciling Endpoints and EndpointSlices: the keyed work queues, the
//! reconcile of one Service for each controller (observe → desire → guard →
//! apply), the deletion guard and the resync diff.

mod apply;
pub(crate) mod decide;
pub(crate) mod effects;
pub(crate) mod events;
pub(crate) mod ghost_scan;
pub(crate) mod guard;
pub(crate) mod kinds;
pub(crate) mod latency;
pub(crate) mod opt_in;
pub(crate) mod orphans;
pub(crate) mod publish;
pub(crate) mod queue;
pub(crate) mod resync;
mod slice_sync;
mod sync;
pub(crate) mod trigger;

#[cfg(any(test, feature = "profiling"))]
pub(crate) mod testkit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::desired::scope::Scope;
use crate::desired::{ManagedBy, PodInfo, Rules};
use crate::metrics::Metrics;
use crate::reconcile::kinds::{CachedEndpoints, CachedNode, CachedService, CachedSlice};
use crate::reconcile::kinds::{
    EndpointSliceKind, EndpointsKind, Kind, KindVisitor, NodeKind, PodKind, ServiceKind,
    for_each_kind,
};
use crate::settings::{Controller, Controllers, Mode};
use hardened_watcher::{Cached, ObjectKey, Store, StoreHandle};
use tokio::sync::watch;

pub use queue::WorkQueue;

/// The handles of the stores the running controllers need.
struct Watched<'a> {
    stores: &'a Stores,
    handles: Vec<Arc<dyn StoreHandle>>,
}

impl KindVisitor for Watched<'_> {
    fn visit<K: Kind>(&mut self) {
        if K::needed(self.stores.controllers) {
            self.handles.push(Arc::new(K::store(self.stores).clone()));
        }
    }
}

/// The caches the controllers work from. Only those the running controllers
/// need are watched ([`Kind::needed`]); the others stay empty and are not
/// waited for.
#[derive(Clone)]
pub struct Stores {
    pub services: Store<CachedService>,
    pub pods: Store<PodInfo>,
    pub endpoints: Store<CachedEndpoints>,
    pub slices: Store<CachedSlice>,
    pub nodes: Store<CachedNode>,
    pub controllers: Controllers,
    /// The stores above that the running controllers watch, made once: the
    /// readiness checks run before every reconcile.
    watched: Arc<[Arc<dyn StoreHandle>]>,
}

impl Stores {
    /// The caches of both controllers.
    pub fn new() -> Self {
        Self::for_controllers(Controllers::ALL)
    }

    pub fn for_controllers(controllers: Controllers) -> Self {
        let services = Store::new(ServiceKind::RESOURCE);
        let pods = Store::new(PodKind::RESOURCE);
        let endpoints = Store::new(EndpointsKind::RESOURCE);
        let slices = Store::new(EndpointSliceKind::RESOURCE);
        let nodes = Store::new(NodeKind::RESOURCE);
        let mut stores = Self {
            services,
            pods,
            endpoints,
            slices,
            nodes,
            controllers,
            watched: Arc::new([]),
        };
        let mut watched = Watched {
            stores: &stores,
            handles: Vec::new(),
        };
        for_each_kind(&mut watched);
        stores.watched = watched.handles.into();
        stores
    }

    /// Every cache that is watched, whatever its object type.
    pub fn watched(&self) -> Vec<Arc<dyn StoreHandle>> {
        self.watched.to_vec()
    }

    /// The `synced` signal of every cache that is watched.
    pub fn synced_signals(&self) -> Vec<watch::Receiver<bool>> {
        self.watched.iter().map(|store| store.synced()).collect()
    }

    /// Whether every watched cache holds a complete consistent list.
    pub fn synced(&self) -> bool {
        self.watched.iter().all(|store| store.is_synced())
    }

    /// Resolves once every watched cache holds a complete consistent list (at
    /// once if they do; pends while one is being listed again after a store
    /// rewind).
    pub async fn wait_synced(&self) {
        for store in self.watched.iter().filter(|store| !store.is_synced()) {
            if store.synced().wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Default for Stores {
    fn default() -> Self {
        Self::new()
    }
}

/// What each controller keeps of its own: its work queue, its trigger-time
/// bookkeeping, the unmanaged orphans its reconcile found and the deletions
/// by others it restores (the Endpoints controller's; the slice controller
/// has none), and the opt-outs waiting for upstream.
pub struct Work {
    pub queue: Arc<WorkQueue<ObjectKey>>,
    pub trigger_times: trigger::TriggerTimes,
    pub unmanaged_orphans: orphans::UnmanagedOrphans,
    pub restores: opt_in::Restores,
    pub opt_outs: opt_in::OptOutClock,
}

impl Work {
    pub fn new(max_retries: u32) -> Self {
        Self {
            queue: WorkQueue::new(max_retries),
            trigger_times: Default::default(),
            unmanaged_orphans: Default::default(),
            restores: Default::default(),
            opt_outs: Default::default(),
        }
    }
}

/// What the flags decide about what is published and how: the same for every
/// reconcile of a run.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub mode: Mode,
    /// Which Services are handled (`--scope`).
    pub scope: Scope,
    /// The release whose kube-controller-manager is followed (the server's,
    /// or `--kube-rules`), with its feature gates.
    pub rules: Rules,
    /// The managed-by values written (`--managed-by`, or the scope's).
    pub managed_by: ManagedBy,
    pub max_endpoints_per_slice: usize,
    /// How long the objects of an opted-out Service wait for upstream's to
    /// cover them before the wait is reported as stalled (`--opt-out-grace`);
    /// they stay until upstream's do.
    pub opt_out_grace: Duration,
}

/// Everything a reconcile needs, shared by the workers: the API and what is
/// reported ([`Context::client`], metrics, Events), what is known (the caches,
/// leadership), what is decided ([`Policy`]), and each controller's [`Work`].
pub struct Context {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// Where Events go: published off the reconcile path.
    pub events: events::EventSink,
    pub stores: Stores,
    /// True while this instance may write: always without `--leader-elect`, else
    /// while it holds the leader Lease (see `crate::leader`).
    pub leader: tokio::sync::watch::Receiver<bool>,
    pub policy: Policy,
    /// The Endpoints controller's queue and trigger times.
    pub endpoints: Work,
    /// The EndpointSlice controller's queue and trigger times.
    pub slices: Work,
    /// Where each opted-in Service stands, the worse of both controllers' views.
    pub opt_in_states: opt_in::OptInStates,
}

impl Context {
    /// The controllers that run.
    pub fn controllers(&self) -> Controllers {
        self.stores.controllers
    }

    /// The work of one controller.
    pub fn work(&self, controller: Controller) -> &Work {
        match controller {
            Controller::Endpoints => &self.endpoints,
            Controller::Endpointslices => &self.slices,
        }
    }

    /// Queues a Service key for every running controller; `received`: when
    /// the watch event calling for it arrived (`None` for a resync or sweep).
    pub fn enqueue(&self, key: ObjectKey, received: Option<Instant>) {
        for controller in self.controllers().iter() {
            self.work(controller).queue.add(key.clone(), received);
        }
    }

    /// Queues a Service key for one controller, if it runs.
    pub fn enqueue_for(&self, controller: Controller, key: ObjectKey, received: Option<Instant>) {
        if self.controllers().contains(controller) {
            self.work(controller).queue.add(key, received);
        }
    }

    /// The gauges of the opt-in states.
    pub fn opt_in_gauges(&self) -> opt_in::OptInGauges<'_> {
        opt_in::OptInGauges {
            states: &self.metrics.opted_in_services,
            frozen: &self.metrics.opt_in_frozen,
        }
    }

    pub fn writes_allowed(&self) -> bool {
        self.policy.mode == Mode::Enforce && self.leading()
    }

    /// Whether this instance leads now (always without `--leader-elect`).
    pub fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    /// Resolves at once on the leader (or without leader election); on other
    /// replicas, once this one becomes leader. Pends forever if the elector is gone.
    pub async fn wait_until_leading(&self) {
        let mut leader = self.leader.clone();
        if leader.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Queues every cached Service for every controller, and objects of ours
/// whose Service is gone: at every resync, and when this instance becomes
/// leader. A reconcile with nothing to change writes nothing, so this is what
/// brings back a key that ran out of retries.
pub fn enqueue_all(ctx: &Context) -> usize {
    let keys: Vec<_> = ctx
        .stores
        .services
        .with_cache(|services| services.iter().map(|s| s.key()).collect());
    let count = keys.len();
    for key in keys {
        ctx.enqueue(key, None);
    }
    resync::sweep(ctx);
    count
}
