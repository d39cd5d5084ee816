//! The hardened watcher and caches.
//!
//! Why our own watcher and not kube-runtime's: it resumes from the last
//! event's RV (a DELETE carrying an old RV sends it back in history), keeps no
//! tombstones and never relists on its own. See `shared/watch-failures.md`.
//!
//! - [`rv`]: resourceVersion ordering (KEP-5504) and the resume point.
//! - [`cache`]: the cache with its per-object guard, tombstones and list diff.
//! - [`machine`]: the synchronous list/watch state machine.
//! - [`driver`]: runs the machine against `kube::Api`.
//! - [`list`]: consistent paginated LIST (`list_consistent`, `list_snapshot`).
//! - [`object`]: the shared types (`Cached`, `ObjectKey`, `Change`, ...).
//! - [`decode`]: object-by-object decoding, so one bad object is skipped.
//! - [`observer`]: counters, as a trait.

pub mod cache;
pub mod decode;
pub mod driver;
pub mod error;
pub mod index;
pub mod list;
pub mod machine;
pub mod object;
pub mod observer;
pub mod rv;

pub use cache::{
    Cache, Cached, Change, DeletionSource, ListDiff, ObjectKey, Outcome, StaleReason, Tombstone,
    WatchEventKind,
};
pub use driver::{SharedCache, WatchConfig, WatchContext, run};
pub use error::{ApiErrorKind, WatchError};
pub use list::{ListSnapshot, list_consistent, list_snapshot};
pub use machine::{Action, Machine, Phase, RestartReason};
pub use observer::{CountingObserver, NoopObserver, WatchObserver};

#[cfg(test)]
mod tests_cache;
#[cfg(test)]
mod tests_driver;
#[cfg(test)]
mod tests_machine;
#[cfg(test)]
mod tests_scenarios;
#[cfg(test)]
mod testutil;
