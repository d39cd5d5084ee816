//! endpoints-guard: a Kubernetes endpoints controller on a hardened watcher.
//!
//! Layers, bottom first; a module uses only its own layer and those below
//! (tests/e2e/layers.rs keeps it so):
//!
//! - [`settings`], [`error`], `shutdown`, `ratelimit`: what every layer
//!   shares (which controllers run, in which mode; the error enum).
//! - [`desired`]: pure computation of the Endpoints and EndpointSlices a
//!   Service should have, and which Services are handled.
//! - [`wire`]: slim decode targets for the hot watch paths; [`metrics`]: the
//!   Prometheus registry.
//! - `leader`: Lease election; `server`: `/metrics` and the probes, with
//!   the HTTPS metrics' certificate and authorizer.
//! - `reconcile`: work queues, the reconcile of one Service (observe →
//!   decide → desire → guard → apply), resync and the ghost scan. The
//!   watcher itself is the `hardened_watcher` crate
//!   (`crates/hardened-watcher`), knowing nothing of Endpoints.
//! - [`config`]: every flag.
//! - [`startup`]: the client and the preflight checks.
//! - [`controller`]: the wiring of a run; [`commands`]: the chart's
//!   `helm test` and pre-delete check.
//! - `profiling` (feature `profiling`): the Endpoints controller's stages
//!   one at a time, for the CPU profiler (docs/cpu-profile.md).

pub mod commands;
pub mod config;
pub mod controller;
pub mod desired;
pub mod error;
pub(crate) mod leader;
mod locks;
pub mod metrics;
#[cfg(feature = "profiling")]
pub mod profiling;
pub(crate) mod ratelimit;
pub(crate) mod reconcile;
pub(crate) mod server;
pub mod settings;
pub(crate) mod shutdown;
pub mod startup;
pub mod wire;
