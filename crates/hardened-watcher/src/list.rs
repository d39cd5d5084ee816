//! The one list path: a consistent, paginated LIST (resourceVersion unset,
//! never "0") decoded object by object and applied to the cache page by
//! page. The watcher's first list, its relists after watch errors, the
//! periodic resync and the relist after a store rewind all go through
//! [`ListDiffBuilder`]; no list is ever held whole in memory.

use std::collections::{HashMap, HashSet};

use kube::api::{ListParams, VersionMatch};
use serde::de::DeserializeOwned;

use super::cache::Cache;
pub use super::cache_list::ListMode;
use super::decode::{Listed, RawList, decode_items};
use super::object::{Cached, DriftKind, ListDiff, ListedOutcome, ObjectKey};
use super::protobuf::{self, ProtobufDecode};
use super::rv::compare_rv;
use super::selectors::Selectors;

/// A consistent list applied to a [`Cache`] page by page:
///
/// - [`ListDiffBuilder::apply_page`] applies each decoded item right away
///   (an upsert: a page never removes anything), sets aside the items that
///   contradict the cache ([`Dispute`](crate::object::Dispute)s), and remembers every listed key,
///   undecodable ones included;
/// - a first page whose RV is below the highest RV the store was known to
///   have reached (taken when the builder was made, before the request) means
///   the store was rewound: the list switches to [`ListMode::Rewind`] before
///   applying anything;
/// - [`ListDiffBuilder::finish`], after the last page of a consistent list
///   (one RV across its pages), turns the cached objects not listed into
///   deletion candidates and releases what the list proves gone;
/// - [`ListDiffBuilder::abort`] (a list that failed midway) turns nothing
///   into a deletion candidate: the upserts stay.
///
/// The cache lock is only needed during each call, not across pages.
#[derive(Debug)]
pub struct ListDiffBuilder<T> {
    diff: ListDiff<T>,
    mode: ListMode,
    /// The store's known high-water mark when the list began.
    floor: Option<String>,
    /// Set when the first page showed the store rewound.
    rewound: bool,
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
    /// Keys a watch event at or below the list's RV arrived for while the
    /// list ran beside the watch: what the list changed about them the
    /// watch explains (it was only behind), so it is no drift.
    explained: HashSet<ObjectKey>,
}

/// A list that ended.
#[derive(Debug)]
pub struct ListOutcome<T> {
    /// What the list did to the cache.
    pub diff: ListDiff<T>,
    /// The list's RV; `None` when it was not consistent (nothing was deleted).
    pub list_rv: Option<String>,
    /// The mode it ended in.
    pub mode: ListMode,
    /// Whether this list found the store rewound (by its RV).
    #[cfg(test)]
    pub rewound: bool,
    /// Differences of the previous resync that the watch never explained:
    /// drift to count now (resync lists only).
    pub leftover_drift: Vec<DriftKind>,
}

impl<T: Cached> ListDiffBuilder<T> {
    /// A list about to be requested from `cache`'s resource. Call it before
    /// the first page is requested: the floor must predate the snapshot.
    pub fn new(cache: &Cache<T>, mode: ListMode) -> Self {
        Self {
            diff: ListDiff::default(),
            mode,
            floor: cache.list_floor(),
            rewound: false,
            listed: HashSet::new(),
            list_rv: None,
            consistent: true,
            unkeyed: false,
            undecodable: 0,
            explained: HashSet::new(),
        }
    }

    /// A watch event for `key` at `rv` arrived while this list runs beside
    /// the watch.
    pub fn note_event(&mut self, key: &ObjectKey, rv: &str) {
        let at_or_below = self.list_rv.as_deref().is_some_and(|list_rv| {
            matches!(
                compare_rv(rv, list_rv),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        });
        if at_or_below {
            self.explained.insert(key.clone());
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
                } else if self.mode != ListMode::Rewind
                    && Cache::<T>::is_rewound(self.floor.as_deref(), page_rv)
                {
                    cache.begin_rewind(page_rv);
                    self.mode = ListMode::Rewind;
                    self.rewound = true;
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
                    match cache.apply_listed(obj, &list_rv, self.mode) {
                        ListedOutcome::Outcome(outcome) => self.diff.record(outcome),
                        ListedOutcome::Disputed(dispute) => self.diff.disputes.push(dispute),
                    }
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
    #[cfg(test)]
    pub fn is_consistent(&self) -> bool {
        self.consistent && self.list_rv.is_some()
    }

    /// The mode the list is in now.
    pub fn mode(&self) -> ListMode {
        self.mode
    }

    /// Whether the first page showed the store rewound.
    pub fn rewound(&self) -> bool {
        self.rewound
    }

    /// The highest RV the store was known to have reached when the list
    /// began: what a rewound store went back from.
    pub fn floor(&self) -> Option<&str> {
        self.floor.as_deref()
    }

    /// Undecodable items listed so far.
    #[cfg(test)]
    pub fn undecodable(&self) -> usize {
        self.undecodable
    }

    /// The list starts over from its first page (a new snapshot): the keys
    /// listed so far prove nothing about it. Changes already applied stay.
    #[cfg(test)]
    pub fn restart(&mut self) {
        self.listed.clear();
        self.list_rv = None;
        self.consistent = true;
        self.unkeyed = false;
        self.undecodable = 0;
    }

    /// Ends a complete list (see [`Cache::finish_list`]); a resync list also
    /// holds its changes as pending drift. A list that was not consistent (or
    /// had no page) ends as [`ListDiffBuilder::abort`] does.
    pub fn finish(mut self, cache: &mut Cache<T>) -> ListOutcome<T> {
        let list_rv = match self.list_rv.take() {
            Some(list_rv) if self.consistent => list_rv,
            _ => {
                return ListOutcome {
                    diff: self.diff,
                    list_rv: None,
                    mode: self.mode,
                    #[cfg(test)]
                    rewound: self.rewound,
                    leftover_drift: Vec::new(),
                };
            }
        };
        if self.unkeyed {
            self.listed.extend(cache.iter().map(|obj| obj.key()));
        }
        cache.finish_list(&list_rv, &self.listed, self.mode, &mut self.diff);
        let leftover_drift = if self.mode == ListMode::Resync {
            let held: HashMap<ObjectKey, DriftKind> = self
                .diff
                .changes
                .iter()
                .map(|change| (change.key(), DriftKind::of(change)))
                .filter(|(key, _)| !self.explained.contains(key))
                .collect();
            cache.hold_drift(&list_rv, held)
        } else {
            Vec::new()
        };
        ListOutcome {
            diff: self.diff,
            list_rv: Some(list_rv),
            mode: self.mode,
            #[cfg(test)]
            rewound: self.rewound,
            leftover_drift,
        }
    }

    /// Ends a list that failed midway: the changes applied so far, and no
    /// deletion candidate.
    pub fn abort(self) -> ListDiff<T> {
        self.diff
    }
}

/// One LIST page, decoded object by object.
pub struct Page<T> {
    /// Its items, decoded one by one.
    pub items: Vec<Listed<T>>,
    /// Empty if the response had none.
    pub resource_version: String,
    /// The continue token; `None` on the last page.
    pub continue_token: Option<String>,
    /// How many items the pages after this one hold, when the server
    /// counted them (it does not with a selector).
    pub remaining_item_count: Option<i64>,
}

/// The request for one LIST page, whichever format it asks for.
pub(crate) fn page_request(
    request: &kube::core::Request,
    page: &PageAt<'_>,
) -> Result<http::Request<Vec<u8>>, kube::Error> {
    // resourceVersion stays unset: a consistent read, never the possibly
    // stale watch-cache answer that RV "0" would get; or, for a resync's
    // first page, exactly the store's current revision (see
    // `WatchCore::next_step`). A continue token carries the snapshot.
    let mut params = ListParams::default().limit(page.limit);
    if let Some(selectors) = page.selectors {
        params = selectors.on_list(params);
    }
    if let Some(token) = page.continue_token {
        params = params.continue_token(token);
    } else if let Some(rv) = page.exact_rv {
        params = params.at(rv).matching(VersionMatch::Exact);
    }
    let mut req = request.list(&params).map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("list");
    Ok(req)
}

/// Which page of a LIST to ask for.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageAt<'a> {
    /// Page size.
    pub limit: u32,
    /// `None` for the first page.
    pub continue_token: Option<&'a str>,
    /// For a first page: this RV exactly (`resourceVersionMatch=Exact`).
    pub exact_rv: Option<&'a str>,
    /// Which objects are listed (`None`: all).
    pub selectors: Option<&'a Selectors>,
}

/// Fetches one LIST page and returns its body, undecoded.
pub async fn fetch_page(
    client: &kube::Client,
    request: &kube::core::Request,
    page: &PageAt<'_>,
) -> Result<String, kube::Error> {
    client.request_text(page_request(request, page)?).await
}

/// A LIST body, undecoded, in the format the server chose.
pub enum ListBody {
    /// JSON text.
    Json(String),
    /// An enveloped protobuf list.
    Protobuf(bytes::Bytes),
}

impl ListBody {
    /// Decodes the page: protobuf with `decode` (see
    /// [`protobuf::decode_list`]), JSON as [`decode_page`] does.
    pub fn decode<K, T>(
        &self,
        decode: ProtobufDecode<K>,
        project: &impl Fn(K) -> Option<T>,
    ) -> Result<Page<T>, kube::Error>
    where
        K: DeserializeOwned,
    {
        match self {
            ListBody::Json(body) => decode_page(body, project),
            ListBody::Protobuf(body) => {
                protobuf::decode_list(body, decode, project).map_err(decode_error)
            }
        }
    }
}

/// Fetches one LIST page asking for protobuf, JSON second (a server that
/// cannot serve protobuf answers JSON); the answer's Content-Type says
/// which it is.
pub async fn fetch_page_either(
    client: &kube::Client,
    request: &kube::core::Request,
    page: &PageAt<'_>,
) -> Result<ListBody, kube::Error> {
    let mut req = page_request(request, page)?;
    req.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(protobuf::ACCEPT),
    );
    let (content_type, body) = send(client, req).await?;
    if protobuf::is_protobuf(content_type.as_deref()) {
        Ok(ListBody::Protobuf(body))
    } else {
        let body = String::from_utf8(body.to_vec()).map_err(kube::Error::FromUtf8)?;
        Ok(ListBody::Json(body))
    }
}

/// A body that is no list, as the JSON path reports one: a decode error.
pub(crate) fn decode_error(message: String) -> kube::Error {
    kube::Error::SerdeError(<serde_json::Error as serde::de::Error>::custom(message))
}

/// Sends `req` and returns the Content-Type and the whole body of a
/// successful answer; an error answer becomes `kube::Error::Api` with its
/// `Status`, read from JSON or protobuf (kube's own check reads JSON only).
pub(crate) async fn send(
    client: &kube::Client,
    req: http::Request<Vec<u8>>,
) -> Result<(Option<String>, bytes::Bytes), kube::Error> {
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let res = check_status(res).await?;
    let content_type = content_type(&res);
    let body = res.into_body().collect_bytes().await?;
    Ok((content_type, body))
}

/// The Content-Type of an answer.
pub(crate) fn content_type<B>(res: &http::Response<B>) -> Option<String> {
    res.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|ct| ct.to_str().ok())
        .map(str::to_owned)
}

/// An answer with an error code becomes `kube::Error::Api`: its `Status`
/// when the body is one (JSON or protobuf), else a Status with the code and
/// the body's text, as kube makes it.
pub(crate) async fn check_status(
    res: http::Response<kube::client::Body>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let code = res.status();
    if !(code.is_client_error() || code.is_server_error()) {
        return Ok(res);
    }
    let content_type = content_type(&res);
    let body = res.into_body().collect_bytes().await?;
    let status = if protobuf::is_protobuf(content_type.as_deref()) {
        protobuf::error_status(&body)
    } else {
        serde_json::from_slice::<kube::core::Status>(&body).ok()
    };
    let status = status.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&body);
        kube::core::Status::failure(text.trim(), "Failed to parse error data")
            .with_code(code.as_u16())
    });
    Err(kube::Error::Api(status.boxed()))
}

/// The resourceVersion of a LIST body, its items left undecoded (the probe
/// before a resume only needs the store's revision).
pub fn page_rv(body: &str) -> Result<String, kube::Error> {
    let list = RawList::parse(body).map_err(kube::Error::SerdeError)?;
    Ok(list.metadata.resource_version.unwrap_or_default())
}

/// Decodes a LIST body: its items straight from their JSON text into `K`
/// (see [`decode_items`]). A body that is no list at all is a
/// `kube::Error::SerdeError`, as with kube's typed request.
pub fn decode_page<K, T>(
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
        remaining_item_count: list.metadata.remaining_item_count,
    })
}

#[cfg(test)]
mod tests {
    //! [`ListDiffBuilder`] page by page against the same list in one page,
    //! and what only pages can do (abort, restart, disagreeing RVs, a rewind
    //! seen on the first page).

    use super::*;
    use crate::cache::{Change, Confirmation, DeletionSource, WatchEventKind::*};
    use crate::testkit::{Obj, cache_with, key, list_in, obj};

    fn page(items: &[Obj]) -> Vec<Listed<Obj>> {
        items.iter().cloned().map(Listed::Item).collect()
    }

    /// Applies `pages` (all at `rv`) and finishes the list.
    fn list_in_pages(
        cache: &mut Cache<Obj>,
        pages: Vec<Vec<Listed<Obj>>>,
        rv: &str,
    ) -> ListDiff<Obj> {
        let mut builder = ListDiffBuilder::new(cache, ListMode::Recover);
        for items in pages {
            builder.apply_page(cache, items, rv);
        }
        builder.finish(cache).diff
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
    /// objects, all learned before RV 250.
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
        cache.apply_event(Modified, obj("a", "ua", "200"));
        cache.apply_event(Deleted, obj("b", "ub", "210"));
        cache.apply_event(Deleted, obj("d", "ud", "150"));
        assert!(cache.confirm_deleted(&key("d"), "ud", Confirmation::Released));
        cache.apply_event(Added, obj("late", "ul", "230"));
        cache
    }

    #[test]
    fn page_by_page_ends_exactly_like_one_page() {
        let listed = vec![
            obj("a", "ua", "200"),   // unchanged
            obj("c", "uc", "220"),   // updated
            obj("new", "un", "240"), // added
            obj("late", "ul", "230"),
            obj("e", "ue", "205"),
        ];
        let mut whole = busy_cache();
        let mut entries = page(&listed);
        entries.push(Listed::Unknown(Some(key("ghost"))));
        let want = list_in(&mut whole, entries, "250", ListMode::Recover).diff;

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
        assert_eq!(got.released, want.released);
        assert_eq!(state(&paged), state(&whole));
        assert_eq!(paged.tombstone_count(), whole.tombstone_count());
        assert_eq!(paged.list_rv(), whole.list_rv());
        assert_eq!(paged.highest_rv(), whole.highest_rv());
        // "gone" was missing: the one deletion candidate, from the list; "b"
        // (deleted by the watch) and "d" (confirmed) are proven gone: released.
        assert_eq!(got.deletion_candidates, 1);
        assert_eq!(got.released, 2);
        assert_eq!(
            paged.tombstone(&key("gone")).map(|t| t.source),
            Some(DeletionSource::MissingFromList)
        );
    }

    #[test]
    fn a_missing_object_becomes_a_candidate_only_when_the_list_ends() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "200");
        builder.apply_page(&mut cache, Vec::new(), "200");
        assert!(
            cache.get(&key("b")).is_some(),
            "a page never removes anything"
        );
        let diff = builder.finish(&mut cache).diff;
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
        let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
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
        let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "200");
        builder.apply_page(&mut cache, Vec::new(), "300");
        assert!(!builder.is_consistent());
        let out = builder.finish(&mut cache);
        assert_eq!(out.diff.deletion_candidates, 0);
        assert_eq!(out.list_rv, None);
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

        let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
        builder.apply_page(&mut cache, vec![Listed::Unknown(None)], "300");
        assert_eq!(builder.undecodable(), 1);
        let diff = builder.finish(&mut cache).diff;
        assert_eq!(diff.deletion_candidates, 0);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.list_rv(), Some("300"));
    }

    #[test]
    fn a_restarted_list_forgets_the_keys_of_the_abandoned_snapshot() {
        let mut cache = cache_with(vec![obj("a", "ua", "100"), obj("b", "ub", "100")], "100");
        let mut builder = ListDiffBuilder::new(&cache, ListMode::Recover);
        builder.apply_page(&mut cache, page(&[obj("b", "ub", "100")]), "200");
        builder.restart();
        // The new snapshot no longer has "b".
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "300");
        let diff = builder.finish(&mut cache).diff;
        assert_eq!(change_keys(&diff), ["candidate:ns/b"]);
    }

    #[test]
    fn the_first_page_below_the_floor_switches_to_a_rewind_before_applying() {
        let mut cache = cache_with(vec![obj("a", "ua", "100")], "100");
        cache.apply_event(Modified, obj("a", "ua", "500"));
        let mut builder = ListDiffBuilder::new(&cache, ListMode::Resync);
        builder.apply_page(&mut cache, page(&[obj("a", "ua", "100")]), "120");
        assert!(builder.rewound());
        assert_eq!(builder.mode(), ListMode::Rewind);
        assert_eq!(
            cache.get(&key("a")).map(|o| o.rv.clone()).as_deref(),
            Some("100")
        );
        let out = builder.finish(&mut cache);
        assert!(out.leftover_drift.is_empty(), "a rewind holds no drift");
        assert_eq!(cache.pending_drift(), 0);
    }
}
