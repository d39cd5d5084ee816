//! Object-by-object decoding of LIST and WATCH payloads.
//!
//! Why not kube's typed `Api::watch`: when one event's object does not decode
//! as `K`, kube retries the line as a `Status`, and since every `Status` field
//! has a default, the line *succeeds* as an empty Status and comes out as
//! `Err(kube::Error::Api(Status { code: 0, .. }))`, indistinguishable from an
//! API error (test `kube_typed_watch_turns_a_bad_object_into_an_api_error`).
//! And a typed LIST fails as a whole on one bad item. So we fetch events and
//! items as `serde_json::Value` and decode each object ourselves: a bad object
//! is skipped and counted, its key and RV still read from raw metadata.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::cache::{ObjectKey, WatchEventKind};

/// Metadata read straight from the JSON of an object that did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMeta {
    pub key: ObjectKey,
    pub uid: String,
    pub resource_version: String,
}

impl RawMeta {
    /// Reads name/namespace/uid/resourceVersion; `None` without a name.
    pub fn read(obj: &Value) -> Option<Self> {
        let text = |path: &str| obj.pointer(path).and_then(Value::as_str).map(str::to_owned);
        let name = text("/metadata/name")?;
        Some(Self {
            key: ObjectKey {
                namespace: text("/metadata/namespace").unwrap_or_default(),
                name,
            },
            uid: text("/metadata/uid").unwrap_or_default(),
            resource_version: text("/metadata/resourceVersion").unwrap_or_default(),
        })
    }
}

/// An object that could not be decoded or projected.
#[derive(Debug)]
pub struct Undecodable {
    /// What could be read of it; `None` if not even the name.
    pub meta: Option<RawMeta>,
    pub error: String,
}

/// Decodes one raw object as `K`, then projects it to the cached type.
/// A projection returning `None` counts as undecodable: the object exists but
/// cannot be represented, so it must not look deleted either.
pub fn decode_object<K, T>(raw: Value, project: &impl Fn(K) -> Option<T>) -> Result<T, Undecodable>
where
    K: DeserializeOwned,
{
    let meta = RawMeta::read(&raw);
    match serde_json::from_value::<K>(raw) {
        Ok(obj) => project(obj).ok_or(Undecodable {
            meta,
            error: "projection rejected the object".to_owned(),
        }),
        Err(err) => Err(Undecodable {
            meta,
            error: err.to_string(),
        }),
    }
}

/// One decoded LIST item, buffered across pages by the state machine.
#[derive(Debug)]
pub enum Listed<T> {
    Item(T),
    /// Present in the list but undecodable: never a deletion candidate.
    Unknown(Option<ObjectKey>),
}

/// Decodes the items of one LIST page.
pub fn decode_items<K, T>(items: Vec<Value>, project: &impl Fn(K) -> Option<T>) -> Vec<Listed<T>>
where
    K: DeserializeOwned,
{
    items
        .into_iter()
        .map(|raw| match decode_object::<K, T>(raw, project) {
            Ok(obj) => Listed::Item(obj),
            Err(bad) => Listed::Unknown(bad.meta.map(|meta| meta.key)),
        })
        .collect()
}

/// The object-carrying event types.
pub fn event_kind(ev: &kube::core::WatchEvent<Value>) -> Option<WatchEventKind> {
    match ev {
        kube::core::WatchEvent::Added(_) => Some(WatchEventKind::Added),
        kube::core::WatchEvent::Modified(_) => Some(WatchEventKind::Modified),
        kube::core::WatchEvent::Deleted(_) => Some(WatchEventKind::Deleted),
        kube::core::WatchEvent::Bookmark(_) | kube::core::WatchEvent::Error(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::core::WatchEvent;
    use serde_json::json;

    fn bad_service() -> Value {
        // spec.ports must be a list
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42"},
               "spec": {"ports": "eighty"}})
    }

    fn good_service() -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "db", "namespace": "shop", "uid": "u2", "resourceVersion": "43"},
               "spec": {"ports": [{"port": 5432}]}})
    }

    fn name_of(svc: Service) -> Option<String> {
        svc.metadata.name
    }

    #[test]
    fn kube_typed_watch_turns_a_bad_object_into_an_api_error() {
        // What kube's request_events does with a line: WatchEvent<K>, else Status.
        let line = json!({"type": "ADDED", "object": bad_service()}).to_string();
        assert!(serde_json::from_str::<WatchEvent<Service>>(&line).is_err());
        let status = serde_json::from_str::<kube::core::Status>(&line);
        assert!(
            matches!(status, Ok(ref s) if s.code == 0),
            "a bad object masquerades as an empty Status"
        );
        // Our raw decoding keeps the event and isolates the bad object.
        let raw: WatchEvent<Value> = match serde_json::from_str(&line) {
            Ok(ev) => ev,
            Err(err) => panic!("raw event must decode: {err}"),
        };
        assert_eq!(event_kind(&raw), Some(WatchEventKind::Added));
    }

    #[test]
    fn undecodable_object_is_skipped_with_its_key_and_rv() {
        let bad = decode_object::<Service, String>(bad_service(), &name_of);
        let Err(bad) = bad else {
            panic!("must not decode")
        };
        let meta = bad
            .meta
            .as_ref()
            .map(|m| (m.key.to_string(), m.resource_version.as_str()));
        assert_eq!(meta, Some(("shop/web".to_owned(), "42")));
        let good = decode_object::<Service, String>(good_service(), &name_of);
        assert_eq!(good.ok().as_deref(), Some("db"));
    }

    #[test]
    fn list_page_with_a_bad_item_keeps_the_rest_and_marks_the_key_unknown() {
        let items = decode_items::<Service, String>(
            vec![good_service(), bad_service(), json!(17)],
            &name_of,
        );
        assert!(matches!(&items[0], Listed::Item(name) if name == "db"));
        assert!(matches!(&items[1], Listed::Unknown(Some(key)) if key.name == "web"));
        assert!(matches!(&items[2], Listed::Unknown(None)));
    }

    #[test]
    fn projection_none_counts_as_undecodable() {
        let reject = |_: Service| -> Option<String> { None };
        let out = decode_object::<Service, String>(good_service(), &reject);
        assert!(matches!(out, Err(Undecodable { meta: Some(_), .. })));
    }
}
