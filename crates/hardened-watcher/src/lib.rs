#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod builder;
mod cache;
mod cache_list;
mod cache_repair;
mod core;
mod core_beside;
mod core_events;
mod count;
mod count_journal;
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
pub mod pace;
mod protobuf;
mod reason;
mod rv;
mod selectors;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
/// How the watcher reads a JSON watch line's metadata first, for tests on a
/// real API server (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub use decode::{RawMeta, peek_watch_line};

pub use builder::WatcherBuilder;
pub use cache::{Cache, ReadStamp, Restored};
pub use count::CountCheck;
pub use driver::Watcher;
pub use error::WatchError;
pub use object::{
    Cached, Change, Confirmation, DeletionSource, DriftKind, Identity, LiveRead, ObjectKey,
    Outcome, StaleReason, Tombstone, WatchEventKind, Whole,
};
pub use observer::{CountingObserver, WatchObserver};
pub use reason::RestartReason;
pub use rv::compare_rv;
pub use selectors::Selectors;
pub use store::{ResyncReport, Store, StoreHandle, share_rewinds};

#[cfg(test)]
mod scenarios_tests;
#[cfg(test)]
mod testkit;
