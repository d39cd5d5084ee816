//! A Kubernetes watcher whose cache survives what the API server and etcd do
//! to a watch: replayed history, compaction, lost events in the API server's
//! watch cache, and an etcd restored from a backup.
//!
//! It keeps a cache of `T`, a projection of the watched `K` (often a few
//! fields of it), and hands every change to a [`Sink`]. What it guarantees,
//! and how that differs from `kube::runtime::watcher`, is in this crate's
//! README; the failures themselves are in the repository's
//! `docs/watch-failures.md`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hardened_watcher::{Cached, Change, ObjectKey, Store, Watcher};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::ResourceExt;
//!
//! #[derive(Clone, Debug)]
//! struct Name { key: ObjectKey, uid: String, rv: String }
//!
//! impl Cached for Name {
//!     fn key(&self) -> ObjectKey { self.key.clone() }
//!     fn uid(&self) -> &str { &self.uid }
//!     fn resource_version(&self) -> &str { &self.rv }
//! }
//!
//! # async fn demo(client: kube::Client) -> Result<(), hardened_watcher::WatchError> {
//! let store = Store::<Name>::new("configmaps");
//! let sink: hardened_watcher::Sink<Name> = Arc::new(|change: &Change<Name>, _arrived| {
//!     // Deletion candidates are only candidates: read the object before acting.
//!     println!("{change:?}");
//! });
//! let project = |cm: ConfigMap| {
//!     Some(Name {
//!         key: ObjectKey::new(cm.namespace().unwrap_or_default(), cm.name_any()),
//!         uid: cm.uid()?,
//!         rv: cm.resource_version()?,
//!     })
//! };
//! let (_stop, shutdown) = tokio::sync::watch::channel(false);
//! Watcher::new(kube::Api::<ConfigMap>::all(client), (), project, store.clone(), sink)
//!     .run(shutdown)
//!     .await
//! # }
//! ```
//!
//! The parts:
//! - [`rv`]: resourceVersion ordering (KEP-5504) and the resume point.
//! - [`cache`]: the cache with its per-object guard for watch events,
//!   tombstones and live-read repairs; `cache_list`: how a consistent list is
//!   applied (rewinds, disputes, drift).
//! - [`machine`]: the synchronous list/watch state machine.
//! - [`core`]: every decision of one watcher, without I/O.
//! - [`driver`]: runs the core against `kube::Api`.
//! - [`list`]: the one list path, page by page.
//! - [`store`]: the one handle on a cache, shared with the rest of a program.
//! - [`live`]: reads that reach etcd, and what "gone" means.
//! - [`object`]: the shared types ([`Cached`], [`ObjectKey`], [`Change`], ...).
//! - [`decode`]: object-by-object decoding, so one bad object is skipped.
//! - [`observer`]: what the watcher reports, as a trait.
//! - [`testing`] (feature `testing`): a scripted API peer for tests.

#![warn(missing_docs)]

mod builder;
mod cache;
mod cache_list;
mod cache_repair;
mod core;
mod core_events;
mod decode;
mod driver;
mod error;
mod events;
mod index;
mod list;
pub mod live;
mod machine;
mod object;
mod observer;
mod reason;
mod rv;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use builder::WatcherBuilder;
pub use cache::{Cache, ReadStamp, Restored};
pub use core::Sink;
pub use driver::Watcher;
pub use error::WatchError;
pub use object::{
    Cached, Change, Confirmation, DeletionSource, DriftKind, Identity, LiveRead, ObjectKey,
    Outcome, StaleReason, Tombstone, WatchEventKind, Whole,
};
pub use observer::{CountingObserver, WatchObserver};
pub use reason::RestartReason;
pub use rv::compare_rv;
pub use store::{ResyncReport, Store, StoreHandle, share_rewinds};

#[cfg(test)]
mod cache_list_tests;
#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod driver_tests;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod scenarios_tests;
#[cfg(test)]
mod testkit;
