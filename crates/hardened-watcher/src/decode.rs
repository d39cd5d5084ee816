//! Object-by-object decoding of LIST and WATCH payloads.
//!
//! Why not kube's typed `Api::watch`: when one event's object does not decode
//! as `K`, kube retries the line as a `Status`, and since every `Status` field
//! has a default, the line *succeeds* as an empty Status and comes out as
//! `Err(kube::Error::Api(Status { code: 0, .. }))`, indistinguishable from an
//! API error (test `kube_typed_watch_turns_a_bad_object_into_an_api_error`).
//! And a typed LIST fails as a whole on one bad item. So we read events and
//! items as raw JSON ([`RawValue`], borrowed from the response text) and
//! decode each object ourselves, straight from its text into `K` (no
//! `serde_json::Value` in between): a bad object is skipped and counted, its
//! key and RV still read from its raw metadata.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::cache::{ObjectKey, WatchEventKind};

/// Metadata read straight from the JSON of an object that did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMeta {
    /// Namespace and name.
    pub key: ObjectKey,
    /// The UID (empty when unreadable).
    pub uid: String,
    /// The resourceVersion (empty when unreadable).
    pub resource_version: String,
}

impl RawMeta {
    /// Reads name/namespace/uid/resourceVersion; `None` without a name.
    /// Only `metadata` is looked at, and a field that is not a string counts
    /// as absent (the object is malformed already; its name may still be fine).
    pub fn read(obj: &RawValue) -> Option<Self> {
        // A derived struct would also accept an array: only objects have metadata.
        if !obj.get().trim_start().starts_with('{') {
            return None;
        }
        let only: MetaOnly = serde_json::from_str(obj.get()).ok()?;
        let meta = only.metadata?;
        Some(Self {
            key: ObjectKey {
                namespace: meta.namespace.0.unwrap_or_default(),
                name: meta.name.0?,
            },
            uid: meta.uid.0.unwrap_or_default(),
            resource_version: meta.resource_version.0.unwrap_or_default(),
        })
    }
}

/// An object reduced to the metadata fields [`RawMeta`] needs; everything
/// else is skipped without being built.
#[derive(Deserialize)]
struct MetaOnly {
    #[serde(default, deserialize_with = "object_or_none")]
    metadata: Option<MetaFields>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    #[serde(default)]
    name: LenientStr,
    #[serde(default)]
    namespace: LenientStr,
    #[serde(default)]
    uid: LenientStr,
    #[serde(default)]
    resource_version: LenientStr,
}

/// `metadata` that is not an object (null, a number...) reads as absent.
fn object_or_none<'de, D: Deserializer<'de>>(de: D) -> Result<Option<MetaFields>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<MetaFields>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            MetaFields::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    de.deserialize_any(V)
}

/// A string field, or `None` for any other JSON value.
#[derive(Default)]
struct LenientStr(Option<String>);

impl<'de> Deserialize<'de> for LenientStr {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, s: &str) -> Result<LenientStr, E> {
                Ok(LenientStr(Some(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<LenientStr, E> {
                Ok(LenientStr(Some(s)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LenientStr, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(LenientStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LenientStr, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LenientStr(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientStr, E> {
                Ok(LenientStr(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<LenientStr, E> {
                Ok(LenientStr(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<LenientStr, E> {
                Ok(LenientStr(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<LenientStr, E> {
                Ok(LenientStr(None))
            }
            fn visit_unit<E>(self) -> Result<LenientStr, E> {
                Ok(LenientStr(None))
            }
        }
        de.deserialize_any(V)
    }
}

/// An object that could not be decoded or projected.
#[derive(Debug)]
pub struct Undecodable {
    /// What could be read of it; `None` if not even the name.
    pub meta: Option<RawMeta>,
    /// Why it did not decode.
    pub error: String,
}

/// Decodes one raw object as `K` straight from its JSON text, then projects
/// it to the cached type. A projection returning `None` counts as
/// undecodable: the object exists but cannot be represented, so it must not
/// look deleted either. The metadata is read from the text only on failure.
pub fn decode_object<K, T>(
    raw: &RawValue,
    project: &impl Fn(K) -> Option<T>,
) -> Result<T, Undecodable>
where
    K: DeserializeOwned,
{
    match serde_json::from_str::<K>(raw.get()) {
        Ok(obj) => project(obj).ok_or_else(|| Undecodable {
            meta: RawMeta::read(raw),
            error: "projection rejected the object".to_owned(),
        }),
        Err(err) => Err(Undecodable {
            meta: RawMeta::read(raw),
            error: err.to_string(),
        }),
    }
}

/// One decoded LIST item, buffered across pages by the state machine.
#[derive(Debug)]
pub enum Listed<T> {
    /// A decoded and projected item.
    Item(T),
    /// Present in the list but undecodable: never a deletion candidate.
    Unknown(Option<ObjectKey>),
}

/// Decodes the items of one LIST page.
pub fn decode_items<'a, K, T>(
    items: impl IntoIterator<Item = &'a RawValue>,
    project: &impl Fn(K) -> Option<T>,
) -> Vec<Listed<T>>
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

/// One LIST response with its items left as raw JSON borrowed from the body.
#[derive(Deserialize)]
pub struct RawList<'a> {
    #[serde(default)]
    /// The list's metadata: resourceVersion and continue token.
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta,
    /// `null` reads as empty, as in kube's `ObjectList`.
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

impl<'a> RawList<'a> {
    /// Parses a LIST response body (the items are only delimited, not decoded).
    pub fn parse(body: &'a str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(body)
    }

    /// The raw items, borrowed from the body.
    pub fn items(&self) -> &[&'a RawValue] {
        self.items.as_deref().unwrap_or_default()
    }
}

/// One line of a WATCH stream, with its object left as raw JSON.
#[derive(Debug)]
pub enum WatchLine<'a> {
    /// ADDED / MODIFIED / DELETED.
    Object(WatchEventKind, &'a RawValue),
    /// A BOOKMARK and its resourceVersion.
    Bookmark(String),
    /// An ERROR event and its Status.
    Error(Box<kube::core::Status>),
    /// Not an event but a bare Status with a code (some proxies send one).
    Status(Box<kube::core::Status>),
    /// Neither an event nor a real Status: skipped and counted.
    Unrecognised(String),
    /// A truncated last line (the stream ended mid-line): ignored.
    Truncated,
}

impl<'a> WatchLine<'a> {
    /// The line with its object decoded by `decode`: what the state machine
    /// takes, whichever wire the event came on.
    pub fn decode<T>(
        self,
        decode: impl FnOnce(&'a RawValue) -> Result<T, Undecodable>,
    ) -> WatchInput<T> {
        match self {
            WatchLine::Object(kind, raw) => WatchInput::Object(kind, decode(raw)),
            WatchLine::Bookmark(rv) => WatchInput::Bookmark(rv),
            WatchLine::Error(status) => WatchInput::Error(status),
            WatchLine::Status(status) => WatchInput::Status(status),
            WatchLine::Unrecognised(error) => WatchInput::Unrecognised(error),
            WatchLine::Truncated => WatchInput::Truncated,
        }
    }
}

/// One watch event with its object decoded: a JSON line
/// ([`WatchLine::decode`]) or a protobuf frame
/// ([`parse_watch_frame`](super::protobuf::parse_watch_frame)) alike.
#[derive(Debug)]
pub enum WatchInput<T> {
    /// ADDED / MODIFIED / DELETED, and the object or why it did not decode.
    Object(WatchEventKind, Result<T, Undecodable>),
    /// A BOOKMARK and its resourceVersion.
    Bookmark(String),
    /// An ERROR event and its Status.
    Error(Box<kube::core::Status>),
    /// Not an event but a bare Status with a code (some proxies send one).
    Status(Box<kube::core::Status>),
    /// Neither an event nor a real Status: skipped and counted.
    Unrecognised(String),
    /// A truncated last line (the stream ended mid-line): ignored.
    Truncated,
}

/// An event with its object unparsed; a struct, so the key order does not
/// matter (`{"object":..,"type":..}` from a re-serializing proxy included).
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct RawBookmark {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    resource_version: String,
}

/// Splits one watch line into its event type and raw object, with the same
/// outcomes as kube's `request_events` (a line that is not an event is read
/// as a `Status`; a `Status` without a code is no API error).
pub fn parse_watch_line(line: &str) -> WatchLine<'_> {
    let event = match serde_json::from_str::<RawEvent>(line) {
        Ok(event) => event,
        Err(err) if err.is_eof() => return WatchLine::Truncated,
        Err(err) => return not_an_event(line, err.to_string()),
    };
    let kind = match event.kind.as_ref() {
        "ADDED" => WatchEventKind::Added,
        "MODIFIED" => WatchEventKind::Modified,
        "DELETED" => WatchEventKind::Deleted,
        "BOOKMARK" => {
            return match serde_json::from_str::<RawBookmark>(event.object.get()) {
                Ok(bookmark) => WatchLine::Bookmark(bookmark.metadata.resource_version),
                Err(err) => not_an_event(line, err.to_string()),
            };
        }
        "ERROR" => {
            return match serde_json::from_str::<Box<kube::core::Status>>(event.object.get()) {
                Ok(status) => WatchLine::Error(status),
                Err(err) => not_an_event(line, err.to_string()),
            };
        }
        other => return not_an_event(line, format!("unknown watch event type {other:?}")),
    };
    WatchLine::Object(kind, event.object)
}

/// The metadata of an ADDED or MODIFIED event's object, read from the start
/// of its JSON watch line and no further than the object's resourceVersion:
/// kube-apiserver writes `type` before `object`, `metadata` before the
/// object's other fields, and name, namespace, uid and resourceVersion before
/// the rest of the metadata (labels, managedFields...). `None` for any other
/// event, and for a line not so ordered (or not well formed up to there):
/// those are read whole. The watcher uses it to pass over an event that
/// brings the state its cache already holds (our own write coming back)
/// without decoding it; on any other event it has read a few fields.
pub fn peek_watch_line(line: &str) -> Option<(WatchEventKind, RawMeta)> {
    let mut peek = Peek::default();
    // Every path ends in an error that stops the parser where it is; what
    // was read before is in `peek`.
    let _ = de::DeserializeSeed::deserialize(
        PeekAt {
            peek: &mut peek,
            level: Level::Event,
        },
        &mut serde_json::Deserializer::from_str(line),
    );
    Some((
        peek.kind?,
        RawMeta {
            key: ObjectKey {
                namespace: peek.namespace.unwrap_or_default(),
                name: peek.name?,
            },
            uid: peek.uid.unwrap_or_default(),
            resource_version: peek.resource_version.unwrap_or_default(),
        },
    ))
}

/// What a peek has read; the metadata fields only from the object's
/// `metadata`.
#[derive(Default)]
struct Peek {
    kind: Option<WatchEventKind>,
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

/// Which JSON object of the line a [`PeekAt`] reads.
#[derive(Clone, Copy)]
enum Level {
    Event,
    Object,
    Metadata,
}

struct PeekAt<'p> {
    peek: &'p mut Peek,
    level: Level,
}

/// The error that ends a peek.
fn enough<E: de::Error>() -> E {
    E::custom("peek: read as far as needed")
}

impl<'de> de::DeserializeSeed<'de> for PeekAt<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PeekAt<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let peek = self.peek;
        while let Some(key) = map.next_key::<&str>()? {
            match (self.level, key) {
                (Level::Event, "type") => {
                    peek.kind = match map.next_value::<&str>()? {
                        "ADDED" => Some(WatchEventKind::Added),
                        "MODIFIED" => Some(WatchEventKind::Modified),
                        _ => return Err(enough()),
                    };
                }
                (Level::Event, "object") if peek.kind.is_some() => {
                    return map.next_value_seed(PeekAt {
                        peek,
                        level: Level::Object,
                    });
                }
                (Level::Event, _) => return Err(enough()),
                (Level::Object, "metadata") => {
                    return map.next_value_seed(PeekAt {
                        peek,
                        level: Level::Metadata,
                    });
                }
                (Level::Metadata, "name" | "namespace" | "uid" | "resourceVersion") => {
                    let value = map.next_value::<LenientStr>()?.0;
                    match key {
                        "name" => peek.name = value,
                        "namespace" => peek.namespace = value,
                        "uid" => peek.uid = value,
                        _ => peek.resource_version = value,
                    }
                    // The namespace comes before the uid when there is one.
                    if peek.name.is_some() && peek.uid.is_some() && peek.resource_version.is_some()
                    {
                        return Err(enough());
                    }
                }
                (Level::Object | Level::Metadata, _) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Err(enough())
    }
}

fn not_an_event(line: &str, error: String) -> WatchLine<'_> {
    match serde_json::from_str::<Box<kube::core::Status>>(line) {
        Ok(status) if status.code != 0 => WatchLine::Status(status),
        Ok(_) => WatchLine::Unrecognised("unrecognised watch line".to_owned()),
        Err(_) => WatchLine::Unrecognised(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::core::WatchEvent;
    use serde_json::{Value, json};

    fn raw(value: Value) -> Box<RawValue> {
        match serde_json::value::to_raw_value(&value) {
            Ok(raw) => raw,
            Err(err) => panic!("{err}"),
        }
    }

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
        let WatchLine::Object(WatchEventKind::Added, object) = parse_watch_line(&line) else {
            panic!("the line must split into an ADDED event")
        };
        assert!(decode_object::<Service, String>(object, &name_of).is_err());
    }

    #[test]
    fn undecodable_object_is_skipped_with_its_key_and_rv() {
        let bad = decode_object::<Service, String>(&raw(bad_service()), &name_of);
        let Err(bad) = bad else {
            panic!("must not decode")
        };
        let meta = bad
            .meta
            .as_ref()
            .map(|m| (m.key.to_string(), m.resource_version.as_str()));
        assert_eq!(meta, Some(("shop/web".to_owned(), "42")));
        let good = decode_object::<Service, String>(&raw(good_service()), &name_of);
        assert_eq!(good.ok().as_deref(), Some("db"));
    }

    #[test]
    fn list_page_with_a_bad_item_keeps_the_rest_and_marks_the_key_unknown() {
        let items = [raw(good_service()), raw(bad_service()), raw(json!(17))];
        let items = decode_items::<Service, String>(items.iter().map(AsRef::as_ref), &name_of);
        assert!(matches!(&items[0], Listed::Item(name) if name == "db"));
        assert!(matches!(&items[1], Listed::Unknown(Some(key)) if key.name == "web"));
        assert!(matches!(&items[2], Listed::Unknown(None)));
    }

    #[test]
    fn projection_none_counts_as_undecodable() {
        let reject = |_: Service| -> Option<String> { None };
        let out = decode_object::<Service, String>(&raw(good_service()), &reject);
        assert!(matches!(out, Err(Undecodable { meta: Some(_), .. })));
    }

    #[test]
    fn peek_reads_type_and_metadata_from_the_start_of_the_line() {
        let meta = RawMeta {
            key: ObjectKey::new("ns", "a"),
            uid: "u1".to_owned(),
            resource_version: "12".to_owned(),
        };
        let line = r#"{"type":"MODIFIED","object":{"kind":"Endpoints","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"12","managedFields":[{"manager":"m","fieldsV1":{"f:subsets":{}}}]},"subsets":[{"addresses":[{"ip":"10.0.0.1"}]}]}}"#;
        assert_eq!(
            peek_watch_line(line),
            Some((WatchEventKind::Modified, meta.clone()))
        );
        let added = line.replace("MODIFIED", "ADDED");
        assert_eq!(
            peek_watch_line(&added),
            Some((WatchEventKind::Added, meta.clone()))
        );
        // Nothing after the resourceVersion is read: a broken tail does not
        // matter (the whole read that follows, if any, finds it).
        let cut = &line[..line.find(r#""subsets""#).expect("subsets")];
        assert_eq!(
            peek_watch_line(cut),
            Some((WatchEventKind::Modified, meta.clone()))
        );
        let cut = &line[..line.find(r#""managedFields""#).expect("managedFields")];
        assert_eq!(peek_watch_line(cut), Some((WatchEventKind::Modified, meta)));
    }

    #[test]
    fn peek_declines_other_events_and_other_orders() {
        let object = r#"{"metadata":{"name":"a","uid":"u1","resourceVersion":"12"}}"#;
        for line in [
            format!(r#"{{"type":"DELETED","object":{object}}}"#),
            format!(r#"{{"type":"BOOKMARK","object":{object}}}"#),
            // `object` before `type` (a re-serializing proxy): read whole.
            format!(r#"{{"object":{object},"type":"MODIFIED"}}"#),
            // No name: nothing to look up.
            r#"{"type":"MODIFIED","object":{"metadata":{"uid":"u1"}}}"#.to_owned(),
            r#"{"type":"MODIFIED","object":[1]}"#.to_owned(),
            r#"{"type":"MODIFIED","object":{"spec":{}}}"#.to_owned(),
            r#"{"kind":"Status","code":500}"#.to_owned(),
            "[1, 2]".to_owned(),
            String::new(),
        ] {
            assert_eq!(peek_watch_line(&line), None, "{line}");
        }
    }

    #[test]
    fn raw_meta_reads_strings_only_and_only_from_objects() {
        let read = |value: Value| RawMeta::read(&raw(value));
        let odd = read(
            json!({"metadata": {"name": "a", "namespace": 5, "uid": ["x"],
                                           "resourceVersion": {"n": 1}, "labels": {"k": "v"}},
                              "spec": {"anything": [1, 2]}}),
        );
        assert_eq!(
            odd,
            Some(RawMeta {
                key: ObjectKey::new("", "a"),
                uid: String::new(),
                resource_version: String::new(),
            })
        );
        assert_eq!(read(json!({"metadata": {"name": 7}})), None);
        assert_eq!(read(json!({"metadata": null})), None);
        assert_eq!(read(json!({"metadata": [1]})), None);
        assert_eq!(read(json!([{"metadata": {"name": "a"}}])), None);
        assert_eq!(read(json!("metadata")), None);
        let escaped = read(json!({"metadata": {"name": "a\"b", "resourceVersion": "9"}}));
        assert_eq!(escaped.map(|m| m.key.name), Some("a\"b".to_owned()));
    }

    #[test]
    fn raw_list_borrows_items_and_reads_null_as_empty() {
        let body = r#"{"kind":"ServiceList","metadata":{"resourceVersion":"7","continue":"c"},
                       "items":[{"metadata":{"name":"a"}}, 17]}"#;
        let Ok(list) = RawList::parse(body) else {
            panic!("must parse")
        };
        assert_eq!(list.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(list.metadata.continue_.as_deref(), Some("c"));
        let items: Vec<&str> = list.items().iter().map(|r| r.get()).collect();
        assert_eq!(items, [r#"{"metadata":{"name":"a"}}"#, "17"]);
        for body in [r#"{"metadata":{},"items":null}"#, r#"{"metadata":{}}"#] {
            assert!(RawList::parse(body).is_ok_and(|l| l.items().is_empty()));
        }
        assert!(RawList::parse(r#"{"items":{}}"#).is_err());
    }

    #[test]
    fn watch_lines_split_like_kube_in_any_key_order() {
        let object = json!({"metadata": {"name": "a"}});
        let text = object.to_string();
        // serde_json without preserve_order writes "object" before "type".
        for line in [
            format!(r#"{{"type":"MODIFIED","object":{object}}}"#),
            format!(r#"{{"object":{object},"type":"MODIFIED"}}"#),
        ] {
            let parsed = parse_watch_line(&line);
            assert!(
                matches!(parsed, WatchLine::Object(WatchEventKind::Modified, raw) if raw.get() == text),
                "{line}: {parsed:?}"
            );
        }
        let bookmark = json!({"object": {"kind": "Service", "metadata": {"resourceVersion": "12"}},
                              "type": "BOOKMARK"})
        .to_string();
        assert!(matches!(parse_watch_line(&bookmark), WatchLine::Bookmark(rv) if rv == "12"));
        let error = json!({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
            .to_string();
        assert!(
            matches!(parse_watch_line(&error), WatchLine::Error(s) if s.code == 410 && s.reason == "Expired")
        );
        let status = json!({"kind": "Status", "code": 500, "reason": "InternalError"}).to_string();
        assert!(matches!(parse_watch_line(&status), WatchLine::Status(s) if s.code == 500));
        for odd in [
            json!({"kind": "Status"}).to_string(),
            json!({"type": "FOO", "object": {}}).to_string(),
            json!({"type": "BOOKMARK", "object": {"metadata": {}}}).to_string(),
        ] {
            assert!(
                matches!(parse_watch_line(&odd), WatchLine::Unrecognised(ref e) if e == "unrecognised watch line"),
                "{odd}"
            );
        }
        assert!(matches!(
            parse_watch_line("[1, 2]"),
            WatchLine::Unrecognised(_)
        ));
        assert!(matches!(
            parse_watch_line(r#"{"type":"ADDED","object":{"metadata""#),
            WatchLine::Truncated
        ));
    }
}
