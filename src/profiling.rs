//! The Endpoints controller's stages one at a time, for the CPU profiler
//! (`hack/flip_profile.rs`, docs/cpu-profile.md): a watch line through the
//! decoder, the cache and the handler; one queued key's reconcile; a ghost
//! scan's read. Each call runs the code the controller runs, on a context
//! whose client talks to whatever server the caller gives it. Built only with
//! the `profiling` feature, never into the product binary.

use std::sync::Arc;
use std::time::Instant;

use hardened_watcher::{LiveRead, ObjectKey, Outcome, WatchEventKind, live};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::desired;
use crate::error::{Error, Result};
use crate::reconcile::kinds::{self, EndpointsKind, Kind, PodKind, ServiceKind};
use crate::reconcile::{Context, Stores, testkit};
use crate::settings::{Controller, Controllers};

/// The Endpoints controller over caches the caller fills, leading, in
/// enforce mode.
pub struct Harness {
    ctx: Arc<Context>,
}

/// What a stage found that the profiler did not expect.
#[derive(Debug, thiserror::Error)]
pub enum Unexpected {
    #[error("not a {0} watch event")]
    NotAnEvent(&'static str),
    #[error("{0} has no projection")]
    NoProjection(&'static str),
    #[error("decoding a {kind}: {source}")]
    Decode {
        kind: &'static str,
        source: serde_json::Error,
    },
    #[error("no Service {0} in the cache")]
    NoService(ObjectKey),
    #[error("Service {0} has no selector")]
    NoSelector(ObjectKey),
    #[error("the Endpoints watch decoded our own write whole: {0}")]
    DecodedWhole(String),
    #[error("nothing queued")]
    NothingQueued,
    #[error("{0}")]
    Controller(#[from] Error),
    #[error("the live read found {0}")]
    LiveRead(String),
}

impl Harness {
    /// A harness whose requests go to `client`. Call it inside a runtime:
    /// the Event publisher runs on it.
    pub fn new(client: kube::Client) -> Self {
        let mut ctx = testkit::context_with(client);
        ctx.stores = Stores::for_controllers(Controllers::of(&[Controller::Endpoints]));
        Self { ctx: Arc::new(ctx) }
    }

    pub fn add_service(&self, object: Value) -> Result<(), Unexpected> {
        add::<ServiceKind>(&self.ctx, object)
    }

    pub fn add_pod(&self, object: Value) -> Result<(), Unexpected> {
        add::<PodKind>(&self.ctx, object)
    }

    pub fn add_endpoints(&self, object: Value) -> Result<(), Unexpected> {
        add::<EndpointsKind>(&self.ctx, object)
    }

    /// A pod's watch line: decoded, cached, handed to the pod handler.
    pub fn pod_event(&self, line: &str) -> Result<(), Unexpected> {
        let outcome = self
            .ctx
            .stores
            .pods
            .apply_watch_line(line, PodKind::project)
            .ok_or(Unexpected::NotAnEvent("pod"))?;
        if let Outcome::Applied(change) = outcome {
            PodKind::on_change(&self.ctx, &change, Instant::now());
        }
        Ok(())
    }

    /// An Endpoints watch line: decoded (as far as it must be), cached,
    /// handed to the Endpoints handler.
    pub fn endpoints_event(&self, line: &str) -> Result<(), Unexpected> {
        let outcome = self
            .ctx
            .stores
            .endpoints
            .apply_watch_line(line, EndpointsKind::project)
            .ok_or(Unexpected::NotAnEvent("endpoints"))?;
        if let Outcome::Applied(change) = outcome {
            kinds::on_endpoints(&self.ctx, &change, None);
        }
        Ok(())
    }

    /// An Endpoints watch line that must change nothing (our own write,
    /// already in the cache).
    pub fn endpoints_event_unchanged(&self, line: &str) -> Result<(), Unexpected> {
        match self
            .ctx
            .stores
            .endpoints
            .apply_watch_line(line, EndpointsKind::project)
        {
            Some(Outcome::Unchanged) => Ok(()),
            other => Err(Unexpected::DecodedWhole(format!("{other:?}"))),
        }
    }

    /// How many Services wait for the Endpoints controller.
    pub fn queued(&self) -> usize {
        self.ctx.endpoints.queue.len()
    }

    /// Takes the next queued Service, reconciles it and marks it done.
    pub async fn reconcile_next(&self) -> Result<ObjectKey, Unexpected> {
        let queue = &self.ctx.endpoints.queue;
        let key = queue.next().await.ok_or(Unexpected::NothingQueued)?.key;
        let result = testkit::settled(&self.ctx, Controller::Endpoints, &key).await;
        queue.done(&key);
        result?;
        Ok(key)
    }

    /// A ghost scan's read of one pod: its metadata, live.
    pub async fn ghost_read(&self, pod: &ObjectKey) -> Result<(), Unexpected> {
        match live::get_meta::<Pod>(&self.ctx.client, &(), pod).await {
            Ok(LiveRead::Found(_)) => Ok(()),
            other => Err(Unexpected::LiveRead(format!("{other:?}"))),
        }
    }

    /// What the reconcile of `key` will write (the pure functions the
    /// reconcile itself calls), as kube-apiserver answers the PUT: with
    /// resourceVersion `rv`, a uid, and our managedFields.
    pub fn expected_write(&self, key: &ObjectKey, rv: u64) -> Result<Value, Unexpected> {
        let ctx = &self.ctx;
        let service = ctx.stores.services.get(key);
        let service = service
            .as_deref()
            .ok_or_else(|| Unexpected::NoService(key.clone()))?;
        let selector = desired::scope::spec_selector(service)
            .ok_or_else(|| Unexpected::NoSelector(key.clone()))?;
        let pods = kinds::selected_pods(ctx, &key.namespace, selector);
        let refs: Vec<_> = pods.iter().map(AsRef::as_ref).collect();
        let current = match ctx.stores.endpoints.get(key) {
            Some(cached) => Some(cached.decode()?),
            None => None,
        };
        let computed = desired::compute_subsets(service, &refs, ctx.policy.rules);
        let wanted = desired::build_endpoints(
            service,
            computed,
            current.as_ref(),
            None,
            desired::EndpointsMarks::managed_by(desired::MANAGER),
        );
        let mut value = serde_json::to_value(&wanted).map_err(|err| Unexpected::Decode {
            kind: "Endpoints",
            source: err,
        })?;
        value["kind"] = json!("Endpoints");
        value["apiVersion"] = json!("v1");
        value["metadata"]["uid"] = json!(format!("7d0c2d3e-{}", key.name));
        value["metadata"]["resourceVersion"] = json!(rv.to_string());
        value["metadata"]["creationTimestamp"] = json!("2026-11-24T20:00:00Z");
        value["metadata"]["managedFields"] = json!([{"manager": desired::MANAGER, "operation": "Update",
            "apiVersion": "v1", "time": "2026-11-24T21:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:endpoints.kubernetes.io/managed-by": {}}},
                         "f:subsets": {}}}]);
        Ok(value)
    }

    /// Endpoints updates written so far.
    pub fn endpoints_updates(&self) -> u64 {
        self.ctx
            .metrics
            .endpoints_writes
            .with_label_values(&["update"])
            .get()
    }
}

/// Decodes, projects and caches one object of kind `K`.
fn add<K: Kind>(ctx: &Context, object: Value) -> Result<(), Unexpected> {
    let object: K::Object = serde_json::from_value(object).map_err(|err| Unexpected::Decode {
        kind: K::RESOURCE,
        source: err,
    })?;
    let cached = K::project(object).ok_or(Unexpected::NoProjection(K::RESOURCE))?;
    K::store(&ctx.stores).apply_watch_event(WatchEventKind::Added, cached);
    Ok(())
}
