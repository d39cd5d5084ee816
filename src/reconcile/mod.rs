//! Reconciling Endpoints: the keyed work queue, the reconcile of one Service
//! (observe → desire → guard → apply), the deletion guard and the resync diff.

pub mod guard;
pub mod handlers;
pub mod objects;
pub mod queue;
pub mod resync;
pub mod sync;
pub mod trigger;

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Service;
use kube::runtime::events::Recorder;

use crate::config::Mode;
use crate::desired::PodInfo;
use crate::metrics::Metrics;
use crate::reconcile::objects::CachedEndpoints;
use crate::watch::{Cache, Cached, ObjectKey};

pub use queue::WorkQueue;

/// A cache shared between its watcher (writer) and the workers (readers).
pub struct Shared<T: Cached>(Arc<RwLock<Cache<T>>>);

impl<T: Cached> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T: Cached> Shared<T> {
    pub fn new(cache: Cache<T>) -> Self {
        Self(Arc::new(RwLock::new(cache)))
    }

    pub fn inner(&self) -> &Arc<RwLock<Cache<T>>> {
        &self.0
    }

    /// Every cache operation is a few map updates that cannot leave the maps
    /// half-changed, so a lock poisoned by a panicking thread is still consistent.
    pub fn read(&self) -> RwLockReadGuard<'_, Cache<T>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Cache<T>> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The three caches the controller works from.
#[derive(Clone)]
pub struct Stores {
    pub services: Shared<Service>,
    pub pods: Shared<PodInfo>,
    pub endpoints: Shared<CachedEndpoints>,
}

impl Stores {
    pub fn new() -> Self {
        Self {
            services: Shared::new(Cache::new()),
            pods: Shared::new(Cache::new()),
            endpoints: Shared::new(Cache::new()),
        }
    }
}

impl Default for Stores {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything a reconcile needs, shared by the workers.
pub struct Context {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub mode: Mode,
    pub stores: Stores,
    pub queue: Arc<WorkQueue<ObjectKey>>,
    pub trigger_times: trigger::TriggerTimes,
    /// True while this instance may write: always without `--leader-elect`, else
    /// while it holds the leader Lease (see [`crate::leader`]).
    pub leader: tokio::sync::watch::Receiver<bool>,
}

impl Context {
    pub fn writes_allowed(&self) -> bool {
        self.mode == Mode::Enforce && *self.leader.borrow()
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
