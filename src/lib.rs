//! endpoints-guard: a Kubernetes endpoints controller on a hardened watcher.
//!
//! - [`desired`]: pure computation of the Endpoints a Service should have.
//! - `hardened_watcher` (crate `crates/hardened-watcher`): the hardened
//!   watcher and its caches, knowing nothing of Endpoints.
//! - [`reconcile`]: work queue, reconcile (observe → desire → guard → apply),
//!   deletion guard, resync diff.
//! - [`kinds`]: every watched kind, described once.
//! - [`controller`]: wires caches, watchers, workers and the metrics server.
//! - [`metrics`], [`server`]: Prometheus metrics and the health endpoints;
//!   [`metrics_auth`], [`tls`]: /metrics over HTTPS for authorized callers.
//! - [`wire`]: slim decode targets for the hot watch paths.

pub mod check_uninstall;
pub mod config;
pub mod controller;
pub mod desired;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod ratelimit;
pub mod reconcile;
pub mod server;
pub mod shutdown;
pub mod startup;
pub mod tls;
pub mod verify_endpoints;
pub mod wire;
