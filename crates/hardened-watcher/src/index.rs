//! A label index over one namespace-scoped cache: (namespace, label key, label
//! value) → object names. The reconcile of a Service visits only the pods that
//! carry one of its selector's pairs (the rarest one), not every pod of the
//! namespace. Kept inside the cache, so it changes together with it.

use std::collections::{BTreeMap, HashMap, HashSet};

type Names = HashSet<String>;

#[derive(Debug, Default)]
/// Live objects of one namespace by label pair, so a selector's candidates
/// are found without a scan.
pub struct LabelIndex {
    namespaces: HashMap<String, HashMap<String, HashMap<String, Names>>>,
}

impl LabelIndex {
    /// Adds `name` of `namespace` under each of its labels.
    pub fn insert<'a>(
        &mut self,
        namespace: &str,
        name: &str,
        labels: impl Iterator<Item = (&'a str, &'a str)>,
    ) {
        if !self.namespaces.contains_key(namespace) {
            self.namespaces
                .insert(namespace.to_string(), HashMap::new());
        }
        let Some(keys) = self.namespaces.get_mut(namespace) else {
            return;
        };
        // Owned keys are made only for pairs not indexed yet: most are.
        for (k, v) in labels {
            if !keys.contains_key(k) {
                keys.insert(k.to_string(), HashMap::new());
            }
            let Some(values) = keys.get_mut(k) else {
                continue;
            };
            if !values.contains_key(v) {
                values.insert(v.to_string(), Names::new());
            }
            if let Some(names) = values.get_mut(v) {
                names.insert(name.to_string());
            }
        }
    }

    /// Removes `name` of `namespace` from under each of its labels.
    pub fn remove<'a>(
        &mut self,
        namespace: &str,
        name: &str,
        labels: impl Iterator<Item = (&'a str, &'a str)>,
    ) {
        let Some(keys) = self.namespaces.get_mut(namespace) else {
            return;
        };
        for (k, v) in labels {
            let Some(values) = keys.get_mut(k) else {
                continue;
            };
            if let Some(names) = values.get_mut(v) {
                names.remove(name);
                if names.is_empty() {
                    values.remove(v);
                }
            }
            if values.is_empty() {
                keys.remove(k);
            }
        }
        if keys.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    /// Names in `namespace` carrying the rarest of the selector's pairs: a
    /// superset of the matching objects (the caller still checks the whole
    /// selector). `None` for an empty selector, which matches everything.
    pub fn candidates(
        &self,
        namespace: &str,
        selector: &BTreeMap<String, String>,
    ) -> Option<Vec<&str>> {
        if selector.is_empty() {
            return None;
        }
        let Some(keys) = self.namespaces.get(namespace) else {
            return Some(Vec::new());
        };
        let mut rarest: Option<&Names> = None;
        for (k, v) in selector {
            match keys.get(k).and_then(|values| values.get(v)) {
                // A pair nobody carries: nothing matches.
                None => return Some(Vec::new()),
                Some(names) => {
                    if rarest.is_none_or(|r| names.len() < r.len()) {
                        rarest = Some(names);
                    }
                }
            }
        }
        Some(rarest.map_or_else(Vec::new, |names| names.iter().map(String::as_str).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn candidates_come_from_the_rarest_pair_and_follow_removals() {
        let mut idx = LabelIndex::default();
        idx.insert("ns", "a", [("app", "web"), ("tier", "x")].into_iter());
        idx.insert("ns", "b", [("app", "web"), ("tier", "y")].into_iter());
        idx.insert("other", "c", [("app", "web"), ("tier", "x")].into_iter());
        let mut got = idx
            .candidates("ns", &labels(&[("app", "web"), ("tier", "x")]))
            .expect("selector");
        got.sort();
        assert_eq!(got, vec!["a"]);
        assert_eq!(
            idx.candidates("ns", &labels(&[("app", "db")])),
            Some(vec![])
        );
        assert_eq!(idx.candidates("ns", &BTreeMap::new()), None);
        idx.remove("ns", "a", [("app", "web"), ("tier", "x")].into_iter());
        assert_eq!(
            idx.candidates("ns", &labels(&[("app", "web"), ("tier", "x")])),
            Some(vec![])
        );
        idx.remove("ns", "b", [("app", "web"), ("tier", "y")].into_iter());
        assert!(!idx.namespaces.contains_key("ns"), "empty maps are dropped");
    }

    /// The index inside the cache follows every way an object enters or
    /// leaves the live set: add, relabel, delete, restore, relist.
    #[test]
    fn cache_index_follows_the_live_set() {
        use crate::{Cache, Cached, ObjectKey, WatchEventKind};

        #[derive(Clone, Debug)]
        struct Labelled {
            name: String,
            rv: String,
            labels: BTreeMap<String, String>,
        }
        impl Cached for Labelled {
            const LABEL_INDEXED: bool = true;
            fn key(&self) -> ObjectKey {
                ObjectKey::new("ns", self.name.clone())
            }
            fn uid(&self) -> &str {
                &self.name
            }
            fn resource_version(&self) -> &str {
                &self.rv
            }
            fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
                self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))
            }
        }
        let obj = |name: &str, rv: &str, app: &str| Labelled {
            name: name.into(),
            rv: rv.into(),
            labels: labels(&[("app", app)]),
        };
        let names = |cache: &Cache<Labelled>, app: &str| {
            let mut n: Vec<String> = cache
                .selector_candidates("ns", &labels(&[("app", app)]))
                .into_iter()
                .map(|o| o.name.clone())
                .collect();
            n.sort();
            n
        };
        let mut cache = Cache::new();
        cache.apply_event(WatchEventKind::Added, obj("a", "1", "web"));
        cache.apply_event(WatchEventKind::Added, obj("b", "2", "web"));
        assert_eq!(names(&cache, "web"), vec!["a", "b"]);
        cache.apply_event(WatchEventKind::Modified, obj("a", "3", "db"));
        assert_eq!(names(&cache, "web"), vec!["b"]);
        assert_eq!(names(&cache, "db"), vec!["a"]);
        cache.apply_event(WatchEventKind::Deleted, obj("b", "4", "web"));
        assert!(names(&cache, "web").is_empty());
        let stamp = cache.read_stamp();
        cache.restore(obj("b", "4", "web"), &stamp);
        let diff = crate::testkit::apply_list(&mut cache, vec![obj("b", "5", "web")], "5");
        assert_eq!(diff.deletion_candidates, 1, "a is gone from the list");
        assert!(names(&cache, "db").is_empty());
        assert_eq!(names(&cache, "web"), vec!["b"]);
    }
}
