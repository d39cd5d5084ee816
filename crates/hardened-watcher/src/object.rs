//! The types the cache and its users share: what a cached object must
//! provide, keys, tombstones, changes and outcomes.

use std::sync::Arc;

use super::rv::max_rv;

/// What the cache needs to know about a stored object.
pub trait Cached: Clone + Send + Sync + 'static {
    /// Namespace and name.
    fn key(&self) -> ObjectKey;
    /// The incarnation: a name deleted and created again gets a new UID.
    fn uid(&self) -> &str;
    /// The version, ordered as KEP-5504 says: by length, then lexically
    /// (a version that is no decimal integer is opaque, and counted).
    fn resource_version(&self) -> &str;
    /// Whether the cache keeps a label index of this kind (see [`Cached::labels`]).
    const LABEL_INDEXED: bool = false;
    /// Labels to index the cache by, for kinds looked up by selector (read
    /// only when [`Cached::LABEL_INDEXED`]).
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::empty()
    }
}

/// A Kubernetes object cached as it is (no projection), keyed by its
/// namespace and name; it dereferences to the object. (A blanket `Cached`
/// impl for every `kube::Resource` would clash with `kube::ResourceExt`'s
/// `uid()` and `resource_version()` wherever both traits are in scope.)
#[derive(Clone, Debug, PartialEq)]
pub struct Whole<K>(pub K);

impl<K> std::ops::Deref for Whole<K> {
    type Target = K;
    fn deref(&self) -> &K {
        &self.0
    }
}

impl<K> Cached for Whole<K>
where
    K: kube::Resource + Clone + Send + Sync + 'static,
{
    fn key(&self) -> ObjectKey {
        let meta = self.0.meta();
        ObjectKey::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
    fn uid(&self) -> &str {
        self.0.meta().uid.as_deref().unwrap_or("")
    }
    fn resource_version(&self) -> &str {
        self.0.meta().resource_version.as_deref().unwrap_or("")
    }
}

/// An object's identity and version, and nothing else: the projection for a
/// program that only needs to know what exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Namespace and name.
    pub key: ObjectKey,
    /// The incarnation.
    pub uid: String,
    /// The version.
    pub resource_version: String,
}

impl Identity {
    /// The identity of `object`; `None` without a name, UID or resourceVersion.
    pub fn of<K: kube::Resource>(object: &K) -> Option<Self> {
        let meta = object.meta();
        Some(Self {
            key: ObjectKey::new(
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone()?,
            ),
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
        })
    }
}

impl Cached for Identity {
    fn key(&self) -> ObjectKey {
        self.key.clone()
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.resource_version
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// A key for `name` in `namespace`.
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
    /// An ADDED event.
    Added,
    /// A MODIFIED event.
    Modified,
    /// A DELETED event.
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
    /// Every variant (add new ones here too): the metrics export each at 0 from start-up.
    pub const ALL: &[Self] = &[Self::WatchDelete, Self::MissingFromList];

    /// The bounded label value of a metric's `reason`.
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
    /// The object as last seen.
    pub last_known: Arc<T>,
    /// The RV at which the deletion was observed: the DELETE event's RV, or
    /// the RV of the list the object was missing from.
    pub observed_rv: Option<String>,
    /// How the deletion was learned.
    pub source: DeletionSource,
    /// The [`Store::tick`](crate::Store::tick) count when it was made: how
    /// old an unconfirmed candidate is, without a clock in here.
    pub born: u64,
    /// Made by the list that started the cache over after a store rewind:
    /// `last_known` carries an RV from history the store no longer has, so
    /// only `observed_rv` (that list's RV) bounds the deletion. An object
    /// made again after the restore gets RVs below the lost ones and must
    /// not be taken for a replay.
    pub before_rewind: bool,
}

impl<T: Cached> Tombstone<T> {
    /// The RV up to which the object is known to be gone: nothing at or below
    /// it may bring the object back.
    pub(super) fn horizon(&self) -> &str {
        let known = self.last_known.resource_version();
        match self.observed_rv.as_deref() {
            Some(observed) if self.before_rewind => observed,
            Some(observed) => max_rv(known, observed),
            None => known,
        }
    }
}

/// A change the reconciler must act on.
///
/// Not `#[non_exhaustive]`, unlike the crate's reasons and errors: a new kind
/// of change would need a decision in every handler, which a wildcard arm
/// cannot make, so adding one is a major version.
#[derive(Clone, Debug)]
pub enum Change<T> {
    /// A new object (or one brought back).
    Added(Arc<T>),
    /// `old.uid() != new.uid()` means the object was replaced by a new
    /// incarnation under the same name.
    Updated {
        /// The cached version before.
        old: Arc<T>,
        /// The version now cached.
        new: Arc<T>,
    },
    /// The object may be gone; carries its last known state. Never act on it
    /// without a live read: see [`Store::confirm_deleted`](crate::Store::confirm_deleted).
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
#[non_exhaustive]
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
    /// Every variant (add new ones here too): the metrics export each at 0 from start-up.
    pub const ALL: &[Self] = &[Self::OlderRv, Self::OlderUid, Self::AlreadyDeleted];

    /// The bounded label value of `stale_events_ignored_total{reason}`.
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
    /// The cache changed.
    Applied(Change<T>),
    /// The event was older than the cache: ignored.
    Stale(StaleReason),
    /// The cache already held exactly this.
    Unchanged,
}

/// Which difference a resync list found between the cache and the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DriftKind {
    /// An object the watch never delivered.
    MissedAdd,
    /// An update the watch never delivered.
    MissedUpdate,
    /// A deletion the watch never delivered.
    MissedDelete,
}

impl DriftKind {
    /// Every variant (add new ones here too): the metrics export each at 0 from start-up.
    pub const ALL: &[Self] = &[Self::MissedAdd, Self::MissedUpdate, Self::MissedDelete];

    /// The bounded label value of `resync_drift_total{kind}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::MissedAdd => "missed_add",
            Self::MissedUpdate => "missed_update",
            Self::MissedDelete => "missed_delete",
        }
    }

    /// The drift a change made by a resync list stands for.
    pub fn of<T>(change: &Change<T>) -> Self {
        match change {
            Change::Added(_) => Self::MissedAdd,
            Change::Updated { .. } => Self::MissedUpdate,
            Change::DeletionCandidate(_) => Self::MissedDelete,
        }
    }
}

/// How a deletion came to be confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmation {
    /// A read that reaches etcd (GET, resourceVersion unset) found the object
    /// gone: strong enough to dispute a list that still shows it.
    LiveRead,
    /// Released without a read because nothing was at stake (no Endpoints
    /// named it): only replay protection.
    Released,
}

/// A listed item that contradicts what the cache learned in a way a healthy
/// store cannot produce. It is not applied: a read that reaches etcd decides
/// ([`Cache::resolve_dispute`](super::cache::Cache::resolve_dispute)).
#[derive(Clone, Debug)]
pub struct Dispute<T> {
    /// The item as listed.
    pub listed: T,
    /// What it contradicts.
    pub kind: DisputeKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// What a disputed item contradicts.
pub enum DisputeKind {
    /// The same incarnation at a lower RV than the cached copy, which was
    /// known before the list's snapshot: the store went back in time, or the
    /// list came from a watch cache that lost an update.
    OlderThanCache {
        /// The cached copy's RV.
        cached_rv: String,
    },
    /// An incarnation a live read found gone: the store was restored from a
    /// backup, or the list came from a watch cache that lost the DELETE.
    DeletedByLiveRead,
}

/// A read that reaches etcd, as the cache needs it.
#[derive(Clone, Debug)]
pub enum LiveRead<T> {
    /// The object as etcd has it.
    Found(T),
    /// A NotFound Status naming the object asked for (see `live.rs`).
    Gone,
}

/// What a live read made of a [`Dispute`].
#[derive(Clone, Debug)]
pub enum Resolution<T> {
    /// The store really holds the older state: it was rewound. The caller
    /// relists authoritatively.
    Rewound,
    /// The list was wrong (a ghost or a lost update in the API server's watch
    /// cache); the cache keeps the truth, and `change` is what that took.
    Ghost(Option<Change<T>>),
    /// A ghost already known (confirmed gone by a live read) is still in the
    /// list: nothing new.
    StillGone,
}

/// Result of applying a consistent list as a diff.
#[derive(Clone, Debug)]
pub struct ListDiff<T> {
    /// Every change, in application order.
    pub changes: Vec<Change<T>>,
    /// Objects the list added.
    pub added: usize,
    /// Objects the list changed.
    pub updated: usize,
    /// Objects missing from the list, now candidates.
    pub deletion_candidates: usize,
    /// Items equal to the cache.
    pub unchanged: usize,
    /// Listed items older than the cache (the watch got further meanwhile).
    pub stale: Vec<StaleReason>,
    /// Cached objects missing from the list but newer than it: written after
    /// the snapshot (our own writes, live reads), so kept.
    pub kept_newer: usize,
    /// Items that contradict the cache; not applied (see [`Dispute`]).
    pub disputes: Vec<Dispute<T>>,
    /// Tombstones and confirmed deletions the list proved gone and released.
    pub released: usize,
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

/// What applying one listed item did.
#[derive(Clone, Debug)]
pub enum ListedOutcome<T> {
    /// What the item did.
    Outcome(Outcome<T>),
    /// The item contradicts the cache and was not applied.
    Disputed(Dispute<T>),
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
            disputes: Vec::new(),
            released: 0,
        }
    }
}
