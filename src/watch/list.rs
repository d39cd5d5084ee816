//! Consistent, paginated LIST with object-by-object decoding: used by the
//! watcher's (re)lists and by the periodic resync diff.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{PoisonError, RwLock};

use kube::api::{Api, ListParams};
use kube::runtime::watcher::DefaultBackoff;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::cache::{Cache, Cached, ListDiff, ObjectKey};
use super::decode::{Listed, RawList, decode_items};
use super::error::{ApiErrorKind, WatchError};
use super::machine::{Action, CompletedList, Machine, PageOutcome, RestartReason};

/// A consistent list of all `K` (resourceVersion unset, paginated by `page`,
/// restarted from scratch when a continue token expires). Strict: if any item
/// cannot be decoded this fails rather than return a list with a hole that a
/// resync would mistake for a deletion. [`list_snapshot`] is the tolerant form.
pub async fn list_consistent<K>(api: &Api<K>, page: u32) -> Result<(Vec<K>, String), WatchError>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    let snapshot = list_snapshot(api, page, Some).await?;
    if snapshot.undecodable > 0 {
        return Err(WatchError::Undecodable {
            resource: std::any::type_name::<K>(),
            count: snapshot.undecodable,
        });
    }
    Ok((snapshot.items, snapshot.resource_version))
}

/// A consistent list where undecodable items are skipped but reported, so
/// the caller can pass `unknown` to [`Cache::apply_list_with_unknown`](super::cache::Cache::apply_list_with_unknown).
#[derive(Debug)]
pub struct ListSnapshot<T> {
    pub items: Vec<T>,
    pub resource_version: String,
    /// Keys of items that were listed but could not be decoded/projected.
    pub unknown: HashSet<ObjectKey>,
    /// Count of undecodable items, including those without a readable key.
    pub undecodable: usize,
    /// `false` if some undecodable item had no readable key: then any cached
    /// object might be it, and nothing missing from this list may be taken
    /// for deleted.
    pub complete: bool,
}

/// How many times a list is started over because its continue token expired.
const CONTINUE_RESTARTS: u32 = 3;

/// Tolerant consistent list with projection (see [`ListSnapshot`]). Holds
/// every page until the last one; [`list_into_cache`] diffs page by page.
pub async fn list_snapshot<K, T>(
    api: &Api<K>,
    page: u32,
    project: impl Fn(K) -> Option<T>,
) -> Result<ListSnapshot<T>, WatchError>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    let resource = std::any::type_name::<K>();
    let client = api.clone().into_client();
    let request = kube::core::Request::new(api.resource_url());
    let mut expired = 0;
    let mut machine: Machine<Listed<T>> = Machine::new(page, Box::new(DefaultBackoff::default()));
    loop {
        let continue_token = match machine.next_action() {
            Action::List { continue_token, .. } => continue_token,
            // One list only: the machine would go on to watch or back off.
            Action::Watch { .. } | Action::Backoff(_) => None,
        };
        let fetched = fetch_page(&client, &request, page, continue_token.as_deref()).await;
        match fetched.and_then(|body| decode_page(&body, &project)) {
            Ok(list) => {
                match machine.on_list_page(list.items, list.continue_token, &list.resource_version)
                {
                    PageOutcome::More => {}
                    PageOutcome::Complete(done) => return Ok(snapshot_of(done)),
                    PageOutcome::Invalid => {
                        return Err(WatchError::MissingListResourceVersion { resource });
                    }
                }
            }
            Err(source) => {
                let kind = ApiErrorKind::classify(&source);
                if machine.on_list_error(kind) != RestartReason::ContinueExpired {
                    return Err(WatchError::List {
                        resource,
                        kind,
                        source,
                    });
                }
                expired += 1;
                if expired > CONTINUE_RESTARTS {
                    return Err(WatchError::ContinueExpired {
                        resource,
                        attempts: expired,
                    });
                }
            }
        }
    }
}

/// A consistent list that stopped before its end: what it had applied
/// (upserts through the guard, never a deletion) and why it stopped.
#[derive(Debug)]
pub struct ListFailed<T> {
    pub error: WatchError,
    /// Changes already made to the cache: the caller must still act on them.
    pub applied: ListDiff<T>,
}

/// A consistent list of all `K`, diffed into `cache` page by page: each page
/// is decoded, projected and applied as soon as it arrives (see
/// [`ListDiffBuilder`]), so no more than one page of objects is held on top
/// of the cache. Once the last page is in, cached objects missing from the
/// list become deletion candidates exactly as with
/// [`Cache::apply_list_with_unknown`]. Items that cannot be decoded are
/// never taken for deleted (an item without even a readable name blocks
/// every deletion of this list). A continue token that expires starts the
/// list over, up to three times; then, or on any other failure, the error
/// comes back with the changes applied so far and nothing deleted.
pub async fn list_into_cache<K, T>(
    api: &Api<K>,
    page: u32,
    project: impl Fn(K) -> Option<T>,
    cache: &RwLock<Cache<T>>,
) -> Result<ListDiff<T>, Box<ListFailed<T>>>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
    T: Cached,
{
    let resource = std::any::type_name::<K>();
    let client = api.clone().into_client();
    let request = kube::core::Request::new(api.resource_url());
    let mut builder = ListDiffBuilder::new();
    let mut restarts = 0;
    let mut continue_token: Option<String> = None;
    let failed = |error, builder: ListDiffBuilder<T>| {
        Err(Box::new(ListFailed {
            error,
            applied: builder.abort(),
        }))
    };
    loop {
        let fetched = fetch_page(&client, &request, page, continue_token.as_deref()).await;
        let restart = match fetched.and_then(|body| decode_page(&body, &project)) {
            Ok(list) => {
                if list.resource_version.is_empty() {
                    return failed(WatchError::MissingListResourceVersion { resource }, builder);
                }
                {
                    let mut cache = cache.write().unwrap_or_else(PoisonError::into_inner);
                    builder.apply_page(&mut cache, list.items, &list.resource_version);
                }
                if builder.is_consistent() {
                    continue_token = list.continue_token.filter(|token| !token.is_empty());
                    if continue_token.is_none() {
                        let mut cache = cache.write().unwrap_or_else(PoisonError::into_inner);
                        return Ok(builder.finish(&mut cache));
                    }
                    false
                } else {
                    // Not one snapshot any more: as if the token had expired.
                    warn!(
                        resource,
                        "list pages disagree on the resourceVersion; starting over"
                    );
                    true
                }
            }
            Err(source) => {
                let kind = ApiErrorKind::classify(&source);
                if !(kind == ApiErrorKind::Expired && continue_token.is_some()) {
                    return failed(
                        WatchError::List {
                            resource,
                            kind,
                            source,
                        },
                        builder,
                    );
                }
                true
            }
        };
        if restart {
            restarts += 1;
            if restarts > CONTINUE_RESTARTS {
                let error = WatchError::ContinueExpired {
                    resource,
                    attempts: restarts,
                };
                return failed(error, builder);
            }
            builder.restart();
            continue_token = None;
        }
    }
}

/// A consistent list applied to a [`Cache`] page by page, instead of whole
/// with [`Cache::apply_list_with_unknown`], with the same result once the
/// list is complete:
///
/// - [`ListDiffBuilder::apply_page`] applies each decoded item through the
///   cache's per-object guard right away (an upsert: a page never removes
///   anything) and remembers every listed key, undecodable ones included;
/// - [`ListDiffBuilder::finish`], after the last page of a consistent list
///   (one RV across its pages), turns the cached objects not listed and not
///   newer than the list into deletion candidates;
/// - [`ListDiffBuilder::abort`] (a list that failed midway) turns nothing
///   into a deletion candidate: the upserts stay, they passed the guard.
///
/// The cache lock is only needed during each call, not across pages.
#[derive(Debug)]
pub struct ListDiffBuilder<T> {
    diff: ListDiff<T>,
    /// Every key listed so far, decoded or not: never a deletion candidate.
    listed: HashSet<ObjectKey>,
    /// The RV of the first page: the snapshot of the whole list.
    list_rv: Option<String>,
    /// Whether every page so far carried `list_rv`.
    consistent: bool,
    /// Some undecodable item had no readable key: any cached object may be
    /// it, so nothing missing from this list may be taken for deleted.
    unkeyed: bool,
    undecodable: usize,
}

impl<T: Cached> Default for ListDiffBuilder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Cached> ListDiffBuilder<T> {
    pub fn new() -> Self {
        Self {
            diff: ListDiff::default(),
            listed: HashSet::new(),
            list_rv: None,
            consistent: true,
            unkeyed: false,
            undecodable: 0,
        }
    }

    /// Applies one page whose `metadata.resourceVersion` is `page_rv`.
    pub fn apply_page(&mut self, cache: &mut Cache<T>, items: Vec<Listed<T>>, page_rv: &str) {
        let list_rv = match &self.list_rv {
            Some(list_rv) => {
                if list_rv != page_rv {
                    self.consistent = false;
                }
                list_rv.clone()
            }
            None => {
                if page_rv.is_empty() {
                    self.consistent = false;
                }
                self.list_rv = Some(page_rv.to_owned());
                page_rv.to_owned()
            }
        };
        self.listed.reserve(items.len());
        for entry in items {
            match entry {
                Listed::Item(obj) => {
                    self.listed.insert(obj.key());
                    self.diff.record(cache.apply_listed(obj, &list_rv));
                }
                Listed::Unknown(key) => {
                    self.undecodable += 1;
                    match key {
                        Some(key) => {
                            self.listed.insert(key);
                        }
                        None => self.unkeyed = true,
                    }
                }
            }
        }
    }

    /// Whether all pages so far belong to one snapshot.
    pub fn is_consistent(&self) -> bool {
        self.consistent && self.list_rv.is_some()
    }

    /// Undecodable items listed so far.
    pub fn undecodable(&self) -> usize {
        self.undecodable
    }

    /// The list starts over from its first page (a new snapshot): the keys
    /// listed so far prove nothing about it. Changes already applied stay.
    pub fn restart(&mut self) {
        self.listed.clear();
        self.list_rv = None;
        self.consistent = true;
        self.unkeyed = false;
        self.undecodable = 0;
    }

    /// Ends a complete list: cached objects that were not listed become
    /// deletion candidates, unless newer than the list (kept, counted in
    /// `kept_newer`); the list RV is recorded as with
    /// [`Cache::apply_list_with_unknown`]. A list that was not consistent
    /// (or had no page) ends as [`ListDiffBuilder::abort`] does.
    pub fn finish(mut self, cache: &mut Cache<T>) -> ListDiff<T> {
        let list_rv = match self.list_rv.take() {
            Some(list_rv) if self.consistent => list_rv,
            _ => return self.diff,
        };
        if self.unkeyed {
            self.listed.extend(cache.iter().map(|obj| obj.key()));
        }
        // No items: only the "missing from the list" half of the diff.
        let missing = cache.apply_list_with_unknown(Vec::new(), &list_rv, &self.listed);
        self.diff.deletion_candidates += missing.deletion_candidates;
        self.diff.kept_newer += missing.kept_newer;
        self.diff.changes.extend(missing.changes);
        self.diff
    }

    /// Ends a list that failed midway: the changes applied so far, and no
    /// deletion candidate.
    pub fn abort(self) -> ListDiff<T> {
        self.diff
    }
}

pub(super) fn snapshot_of<T>(done: CompletedList<Listed<T>>) -> ListSnapshot<T> {
    let mut snapshot = ListSnapshot {
        items: Vec::with_capacity(done.items.len()),
        resource_version: done.resource_version,
        unknown: HashSet::new(),
        undecodable: 0,
        complete: true,
    };
    for entry in done.items {
        match entry {
            Listed::Item(obj) => snapshot.items.push(obj),
            Listed::Unknown(key) => {
                snapshot.undecodable += 1;
                match key {
                    Some(key) => {
                        snapshot.unknown.insert(key);
                    }
                    None => snapshot.complete = false,
                }
            }
        }
    }
    snapshot
}

/// One LIST page, decoded object by object.
pub(super) struct Page<T> {
    pub items: Vec<Listed<T>>,
    /// Empty if the response had none.
    pub resource_version: String,
    pub continue_token: Option<String>,
}

/// Fetches one LIST page and returns its body, undecoded.
pub(super) async fn fetch_page(
    client: &kube::Client,
    request: &kube::core::Request,
    limit: u32,
    continue_token: Option<&str>,
) -> Result<String, kube::Error> {
    // resourceVersion stays unset: a consistent read, never the possibly
    // stale watch-cache answer that RV "0" would get.
    let mut params = ListParams::default().limit(limit);
    if let Some(token) = continue_token {
        params = params.continue_token(token);
    }
    let mut req = request.list(&params).map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("list");
    client.request_text(req).await
}

/// Decodes a LIST body: its items straight from their JSON text into `K`
/// (see [`decode_items`]). A body that is no list at all is a
/// `kube::Error::SerdeError`, as with kube's typed request.
pub(super) fn decode_page<K, T>(
    body: &str,
    project: &impl Fn(K) -> Option<T>,
) -> Result<Page<T>, kube::Error>
where
    K: DeserializeOwned,
{
    let list = RawList::parse(body).map_err(kube::Error::SerdeError)?;
    let items = decode_items(list.items().iter().copied(), project);
    Ok(Page {
        items,
        resource_version: list.metadata.resource_version.unwrap_or_default(),
        continue_token: list.metadata.continue_,
    })
}

#[cfg(test)]
mod tests {
    //! [`ListDiffBuilder`] against [`Cache::apply_list_with_unknown`]: the
    //! same guard cases as the whole-list tests in `tests_cache.rs`, page by
    //! page, plus what only pages can do (abort, restart, disagreeing RVs).

    use super::*;
    use crate::watch::cache::{Change, DeletionSource, StaleReason, WatchEventKind::*};
    use crate::watch::testutil::{Obj, key, obj};

    fn cache_with(items: Vec<Obj>, list_rv: &str) -> Cache<Obj> {
        let mut cache = Cache::new();
        let diff = cache.apply_list(items, list_rv);
        assert_eq!(diff.deletion_candidates, 0);
        cache
    }

    fn page(items: &[Obj]) -> Vec<Listed<Obj>> {
        items.iter().cloned().map(Listed::Item).collect()
    }

    /// Applies `pages` (all at `rv`) and finishes the list.
    fn list_in_pages(
        cache: &mut Cache<Obj>,
        pages: Vec<Vec<Listed<Obj>>>,
        rv: &str,
    ) -> ListDiff<Obj> {
        let mut builder = ListDiffBuilder::new();
        for items in pages {
            builder.apply_page(cache, items, rv);
        }
        builder.finish(cache)
    }

    fn state(cache: &Cache<Obj>) -> Vec<(String, String, String)> {
        cache
            .iter()
            .map(|o| (o.key.to_string(), o.uid.clone(), o.rv.clone()))
            .collect()
    }

    fn change_keys(diff: &ListDiff<Obj>) -> Vec<String> {
        diff.changes
            .iter()
            .map(|c| {
                let kind = match c {
                    Change::Added(_) => "added",
                    Change::Updated { .. } => "updated",
                    Change::DeletionCandidate(_) => "candidate",
                };
                format!("{kind}:{}", c.key())
            })
            .collect()
    }

    /// A cache with a bit of everything: live, tombstoned, confirmed-deleted
    /// and newer-than-the-list objects.
    fn busy_cache() -> Cache<Obj> {
        let mut cache = cache_with(
            vec![
                obj("a", "ua", "100"),
                obj("b", "ub", "100"),
                obj("c", "uc", "100"),
                obj("d", "ud", "100"),
                obj("gone", "ug", "90"),
                obj("ghost", "uh", "80"),
            ],
            "100",
        );
        cache.apply_event(Modified, obj("a", "ua", "300"));
        cache.apply_event(Deleted, obj("b", "ub", "310"));
        cache.apply_event(Deleted, obj("d", "ud", "150"));
        assert!(cache.confirm_deleted(&key("d"), "ud"));
        cache.apply_event(Added, obj("late", "ul", "260"));
        cache
    }

    #[test]
    fn page_by_page_ends_exactly_like_the_whole_list() {
        let listed = vec![
            obj("a", "ua", "200"),   // older than the watch: stale
            obj("b", "ub", "100"),   // deleted after the list: stays deleted
            obj("c", "uc", "220"),   // updated
            obj("d", "ud", "100"),   // confirmed deleted later: not back
            obj("new", "un", "210"), // added
            obj("e", "ue", "205"),
        ];
        let unknown: HashSet<ObjectKey> = [key("ghost")].into_iter().collect();
        let mut whole = busy_cache();
        let want = whole.apply_list_with_unknown(listed.clone(), "250", &unknown);

        let mut paged = busy_cache();
        let mut pages: Vec<_> = listed.chunks(2).map(page).collect();
        pages.push(vec![Listed::Unknown(Some(key("ghost")))]);
        let got = list_in_pages(&mut paged, pages, "250");

        assert_eq!(change_keys(&got), change_keys(&want));
        assert_eq!(
            (
                got.added,
                got.updated,
                got.deletion_candidates,
                got.unchanged
            ),
            (
                want.added,
                want.updated,
                want.deletion_candidates,
                want.unchanged
            )
        );
        assert_eq!((got.stale, got.kept_newer), (want.stale, want.kept_newer));
        assert_eq!(state(&paged), state(&whole));
        assert_eq!(paged.tombstone_count(), whole.tombstone_count());
        assert_eq!(paged.list_rv(), whole.list_rv());
        assert_eq!(paged.highest_rv(), whole.highest_rv());
        // "gone" was missing: the one deletion candidate, from the list.
        assert_eq!(got.deletion_candidates, 1);
        assert_eq!(
            paged.tombstone(&key("gone")).map(|t| t.source),
            Some(DeletionSource::MissingFromList)
        );
    }

    #[test]
    fn a_stale_item_in_a_page_does_not_roll_the_object_back() {
        let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
        cache.apply_event(Modified, obj("a", "ua", "300"));
        let diff = list_in_pages(&mut cache, vec![page(&[obj("a", "ua", "200")])], "250");
        assert_eq!(diff.stale, vec![StaleReason::OlderRv]);
        assert_eq!(
            cache.get(&key("a")).map(|o| o.rv.clone()).as_deref(),
            Some("300")
        );
    }

    #[test]
    fn an_object_newer_than_the_list_is_kept() {
        let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
        cache.apply_event(Added, obj("late", "ul", "250"));
        let diff = list_in_pages(&mut cache, vec![page(&[obj("a", "ua", "100")])], "200");
        assert_eq!(diff.kept_newer, 1);
        assert_eq!(diff.deletion_candidates, 0);
        assert!(cache.get(&key("late")).is_some());
    }

    #[test]
    fn a_missing_object_becomes_a_candidate_only_when_the_list_ends() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new();
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "200");
        builder.apply_page(&mut cache, Vec::new(), "200");
        assert!(
            cache.get(&key("b")).is_some(),
            "a page never removes anything"
        );
        let diff = builder.finish(&mut cache);
        assert_eq!(diff.deletion_candidates, 1);
        assert_eq!(change_keys(&diff), ["candidate:ns/b"]);
        assert!(cache.get(&key("b")).is_none());
        let tomb = cache
            .tombstone(&key("b"))
            .map(|t| (t.source, t.observed_rv.clone()));
        assert_eq!(
            tomb,
            Some((DeletionSource::MissingFromList, Some("200".to_owned())))
        );
        assert_eq!(cache.list_rv(), Some("200"));
    }

    #[test]
    fn an_aborted_list_deletes_nothing_but_keeps_its_upserts() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new();
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "180")]), "200");
        // The next page fails (e.g. its continue token expired).
        let diff = builder.abort();
        assert_eq!(change_keys(&diff), ["updated:ns/a"]);
        assert_eq!((diff.updated, diff.deletion_candidates), (1, 0));
        assert!(cache.get(&key("b")).is_some());
        assert_eq!(cache.tombstone_count(), 0);
        assert_eq!(cache.list_rv(), Some("100"), "the list proved nothing");
    }

    #[test]
    fn pages_that_disagree_on_the_rv_delete_nothing() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new();
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "200");
        builder.apply_page(&mut cache, Vec::new(), "300");
        assert!(!builder.is_consistent());
        let diff = builder.finish(&mut cache);
        assert_eq!(diff.deletion_candidates, 0);
        assert!(cache.get(&key("b")).is_some());
        assert_eq!(cache.list_rv(), Some("100"));
    }

    #[test]
    fn undecodable_items_are_never_candidates_and_an_unreadable_one_blocks_all() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("bad", "ub", "90")], "100");
        let pages = vec![
            page(&[obj("a", "ua", "100")]),
            vec![Listed::Unknown(Some(key("bad")))],
        ];
        let diff = list_in_pages(&mut cache, pages, "200");
        assert_eq!(diff.deletion_candidates, 0);
        assert!(cache.get(&key("bad")).is_some());

        let mut builder = ListDiffBuilder::new();
        builder.apply_page(&mut cache, vec![Listed::Unknown(None)], "300");
        assert_eq!(builder.undecodable(), 1);
        let diff = builder.finish(&mut cache);
        assert_eq!(diff.deletion_candidates, 0);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.list_rv(), Some("300"));
    }

    #[test]
    fn a_restarted_list_forgets_the_keys_of_the_abandoned_snapshot() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new();
        builder.apply_page(&mut cache, page(&[obj("b", "ub", "100")]), "200");
        builder.restart();
        // The new snapshot no longer has "b".
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "300");
        let diff = builder.finish(&mut cache);
        assert_eq!(change_keys(&diff), ["candidate:ns/b"]);
    }
}
