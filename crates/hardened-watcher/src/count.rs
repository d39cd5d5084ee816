//! The count check: how many objects the store holds now, against how many
//! the cache holds. Two one-item LISTs: a consistent one for the store's
//! current resourceVersion (the probe a full resync also starts with), then
//! one at exactly that resourceVersion, whose `remainingItemCount` is the
//! count.
//!
//! kube-apiserver answers the exact list from its watch cache while that
//! cache keeps snapshots, and from etcd once its own consistency check has
//! found the cache wrong (it then drops the snapshots and takes no more) or
//! when no snapshot covers the resourceVersion: the same routing as the full
//! resync's exact list. From etcd the count is etcd's: a DELETE the watch
//! cache lost (a ghost) makes our cache hold one object more, an ADD it lost
//! one fewer. From the watch cache the count is that cache's, so a DELETE or
//! ADD our own watch missed shows too. Either way a difference means only a
//! full list can say what differs; an equal count proves nothing about
//! objects changed in place, which the full resync still covers at its own,
//! longer, period.
//!
//! Objects created or deleted in the store that the watch has not delivered
//! yet differ too: under such churn a check costs a full list, never a
//! missed difference.

use super::decode::RawList;

/// What a count check found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CountCheck {
    /// The store held as many objects at its current resourceVersion as the
    /// cache does.
    Matches,
    /// It did not: a full list is due.
    Differs {
        /// The store's resourceVersion the count was taken at.
        rv: String,
        /// Objects in the cache.
        cached: usize,
        /// Objects the store held at `rv`.
        listed: u64,
    },
    /// No answer: the watcher is not watching (listing, backing off), has
    /// no resourceVersion yet, or the list failed or gave no count. Only a
    /// full list can tell.
    Unknown(String),
}

impl CountCheck {
    /// A bounded metric label: `matches`, `differs` or `unknown`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CountCheck::Matches => "matches",
            CountCheck::Differs { .. } => "differs",
            CountCheck::Unknown(_) => "unknown",
        }
    }
}

/// How many objects a one-item LIST body says the store held: its items and
/// `remainingItemCount`. `None` when more items remain but the server did
/// not count them (it does not with a label or field selector).
pub(crate) fn listed_count(body: &str) -> Result<Option<u64>, serde_json::Error> {
    let list = RawList::parse(body)?;
    let more = list
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|token| !token.is_empty());
    Ok(page_count(
        list.items().len(),
        more,
        list.metadata.remaining_item_count,
    ))
}

/// The store's count from a first page: its `items`, whether `more` pages
/// follow, and the `remaining` items the server counted in them.
pub(crate) fn page_count(items: usize, more: bool, remaining: Option<i64>) -> Option<u64> {
    let items = items as u64;
    match remaining {
        Some(remaining) => Some(items + u64::try_from(remaining).unwrap_or(0)),
        None if more => None,
        None => Some(items),
    }
}

/// Compares `cached` objects with the answer of the list at `rv`.
pub(crate) fn compare(rv: &str, cached: usize, listed: Result<Option<u64>, String>) -> CountCheck {
    match listed {
        Ok(Some(listed)) if listed == cached as u64 => CountCheck::Matches,
        Ok(Some(listed)) => CountCheck::Differs {
            rv: rv.to_owned(),
            cached,
            listed,
        },
        Ok(None) => CountCheck::Unknown("the exact list gave no count".into()),
        Err(err) => CountCheck::Unknown(format!(
            "the list at exactly the store's resourceVersion {rv} failed: {err}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_the_items_and_what_remains() {
        let body = r#"{"metadata":{"resourceVersion":"10","continue":"abc","remainingItemCount":41},"items":[{"metadata":{"name":"a"}}]}"#;
        assert_eq!(listed_count(body).ok(), Some(Some(42)));
        let last = r#"{"metadata":{"resourceVersion":"10"},"items":[{"metadata":{"name":"a"}}]}"#;
        assert_eq!(listed_count(last).ok(), Some(Some(1)));
        let empty = r#"{"metadata":{"resourceVersion":"10"},"items":null}"#;
        assert_eq!(listed_count(empty).ok(), Some(Some(0)));
        let uncounted = r#"{"metadata":{"resourceVersion":"10","continue":"abc"},"items":[{}]}"#;
        assert_eq!(listed_count(uncounted).ok(), Some(None));
        assert!(listed_count("not json").is_err());
    }

    #[test]
    fn only_an_equal_count_spares_the_full_list() {
        assert_eq!(compare("7", 3, Ok(Some(3))), CountCheck::Matches);
        // A ghost: the cache holds one object the store no longer has.
        assert_eq!(
            compare("7", 4, Ok(Some(3))),
            CountCheck::Differs {
                rv: "7".into(),
                cached: 4,
                listed: 3
            }
        );
        assert_eq!(compare("7", 3, Ok(None)).metric_label(), "unknown");
        assert_eq!(
            compare("7", 3, Err("410 Expired".into())).metric_label(),
            "unknown"
        );
    }
}
