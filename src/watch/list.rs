//! Consistent, paginated LIST with object-by-object decoding: used by the
//! watcher's (re)lists and by the periodic resync diff.

use std::collections::HashSet;
use std::fmt::Debug;

use kube::api::{Api, ListParams};
use kube::core::ObjectList;
use kube::runtime::watcher::DefaultBackoff;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::cache::ObjectKey;
use super::decode::{Listed, decode_items};
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

/// Tolerant consistent list with projection (see [`ListSnapshot`]).
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
        match fetch_page(&client, &request, page, continue_token.as_deref()).await {
            Ok(list) => {
                let rv = list.metadata.resource_version.unwrap_or_default();
                let next = list.metadata.continue_;
                match machine.on_list_page(decode_items(list.items, &project), next, &rv) {
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

pub(super) async fn fetch_page(
    client: &kube::Client,
    request: &kube::core::Request,
    limit: u32,
    continue_token: Option<&str>,
) -> Result<ObjectList<Value>, kube::Error> {
    // resourceVersion stays unset: a consistent read, never the possibly
    // stale watch-cache answer that RV "0" would get.
    let mut params = ListParams::default().limit(limit);
    if let Some(token) = continue_token {
        params = params.continue_token(token);
    }
    let mut req = request.list(&params).map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("list");
    client.request::<ObjectList<Value>>(req).await
}
