//! The types the cache and its users share: what a cached object must
//! provide, keys, tombstones, changes and outcomes.

use std::sync::Arc;

use super::rv::max_rv;

/// What the cache needs to know about a stored object.
pub trait Cached: Clone + Send + Sync + 'static {
    fn key(&self) -> ObjectKey;
    fn uid(&self) -> &str;
    fn resource_version(&self) -> &str;
    /// Whether the cache keeps a label index of this kind (see [`Cached::labels`]).
    const LABEL_INDEXED: bool = false;
    /// Labels to index the cache by, for kinds looked up by selector (read
    /// only when [`Cached::LABEL_INDEXED`]).
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::empty()
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The type of a watch event carrying an object (bookmarks and errors are the
/// state machine's business, not the cache's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEventKind {
    Added,
    Modified,
    Deleted,
}

/// How we learned that an object may be gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletionSource {
    /// A DELETED watch event.
    WatchDelete,
    /// Absent from a consistent list (a lost DELETE, or one turned into a
    /// watch ERROR by compaction).
    MissingFromList,
}

impl DeletionSource {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::WatchDelete => "watch_delete",
            Self::MissingFromList => "missing_from_list",
        }
    }
}

/// The last known state of an object that may have been deleted, kept until a
/// live read confirms (or refutes) the deletion.
#[derive(Clone, Debug)]
pub struct Tombstone<T> {
    pub last_known: Arc<T>,
    /// The RV at which the deletion was observed: the DELETE event's RV, or
    /// the RV of the list the object was missing from.
    pub observed_rv: Option<String>,
    pub source: DeletionSource,
}

impl<T: Cached> Tombstone<T> {
    /// The RV up to which the object is known to be gone: nothing at or below
    /// it may bring the object back.
    pub(super) fn horizon(&self) -> &str {
        let known = self.last_known.resource_version();
        match self.observed_rv.as_deref() {
            Some(observed) => max_rv(known, observed),
            None => known,
        }
    }
}

/// A change the reconciler must act on.
#[derive(Clone, Debug)]
pub enum Change<T> {
    Added(Arc<T>),
    /// `old.uid() != new.uid()` means the object was replaced by a new
    /// incarnation under the same name.
    Updated {
        old: Arc<T>,
        new: Arc<T>,
    },
    /// The object may be gone; carries its last known state. Never act on it
    /// without a live read: see [`Cache::confirm_deleted`](super::cache::Cache::confirm_deleted).
    DeletionCandidate(Arc<T>),
}

impl<T: Cached> Change<T> {
    /// The key the change is about.
    pub fn key(&self) -> ObjectKey {
        match self {
            Self::Added(obj) | Self::DeletionCandidate(obj) => obj.key(),
            Self::Updated { new, .. } => new.key(),
        }
    }
}

/// Why an event was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StaleReason {
    /// Its RV is lower than the cached copy's.
    OlderRv,
    /// It belongs to an older incarnation (UID) of the name.
    OlderUid,
    /// The object is already deleted (tombstoned, or proven absent by a
    /// consistent list or a confirmed deletion at a later RV).
    AlreadyDeleted,
}

impl StaleReason {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::OlderRv => "older_rv",
            Self::OlderUid => "older_uid",
            Self::AlreadyDeleted => "already_deleted",
        }
    }
}

/// Result of applying one event.
#[derive(Clone, Debug)]
pub enum Outcome<T> {
    Applied(Change<T>),
    Stale(StaleReason),
    Unchanged,
}

/// Result of applying a consistent list as a diff.
#[derive(Clone, Debug)]
pub struct ListDiff<T> {
    /// Every change, in application order.
    pub changes: Vec<Change<T>>,
    pub added: usize,
    pub updated: usize,
    pub deletion_candidates: usize,
    pub unchanged: usize,
    /// Listed items older than the cache (the watch got further meanwhile).
    pub stale: Vec<StaleReason>,
    /// Cached objects missing from the list but newer than it: created after
    /// the snapshot, so kept.
    pub kept_newer: usize,
}

impl<T> ListDiff<T> {
    /// Counts one item's outcome and keeps its change.
    pub fn record(&mut self, outcome: Outcome<T>) {
        match outcome {
            Outcome::Applied(change) => {
                match &change {
                    Change::Added(_) => self.added += 1,
                    Change::Updated { .. } => self.updated += 1,
                    Change::DeletionCandidate(_) => self.deletion_candidates += 1,
                }
                self.changes.push(change);
            }
            Outcome::Stale(reason) => self.stale.push(reason),
            Outcome::Unchanged => self.unchanged += 1,
        }
    }
}

impl<T> Default for ListDiff<T> {
    fn default() -> Self {
        Self {
            changes: Vec::new(),
            added: 0,
            updated: 0,
            deletion_candidates: 0,
            unchanged: 0,
            stale: Vec::new(),
            kept_newer: 0,
        }
    }
}
