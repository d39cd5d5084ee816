//! endpoints-guard: a Kubernetes endpoints controller on a hardened watcher.
//!
//! - [`desired`]: pure computation of the Endpoints a Service should have.
//! - [`watch`]: the hardened watcher and its caches.
//! - [`reconcile`]: work queue, reconcile (observe → desire → guard → apply),
//!   deletion guard, resync diff.
//! - [`controller`]: wires caches, watchers, workers and the metrics server.
//! - [`metrics`], [`server`]: Prometheus metrics and the health endpoints.

pub mod chaos;
pub mod config;
pub mod controller;
pub mod desired;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod server;
pub mod startup;
pub mod watch;
