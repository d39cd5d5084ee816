//! The protobuf wire of kube-apiserver (`application/vnd.kubernetes.protobuf`),
//! read as far as a watcher needs it: the envelope around every object, the
//! list around LIST items, the frames of a WATCH stream, and the few
//! metadata and Status fields the state machine reads. The watched object
//! itself is decoded by the caller's function ([`WatcherBuilder::protobuf`](crate::WatcherBuilder::protobuf)).
//!
//! The messages below are written by hand with the field numbers of
//! k8s.io/apimachinery's `generated.proto` (runtime.Unknown, TypeMeta,
//! RawExtension; meta/v1 WatchEvent, ListMeta, ObjectMeta, Status); prost
//! skips every field a message does not name.
//!
//! The layout, as kube-apiserver writes it:
//! - an object or a list body: the magic `k8s\0`, then a `runtime.Unknown`
//!   whose `raw` is the object's (or list's) own message;
//! - a list message: `ListMeta metadata = 1`, `repeated <Kind> items = 2`;
//! - a WATCH body (`application/vnd.kubernetes.protobuf;stream=watch`): frames
//!   of a 4-byte big-endian length and a `WatchEvent` without magic or
//!   envelope, whose `object.raw` is an object body as above (a `Status` for
//!   an ERROR event).

use prost::Message;

use super::cache::{ObjectKey, WatchEventKind};
use super::decode::{Listed, RawMeta, Undecodable, WatchInput};
use super::list::Page;

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// What a watcher with the protobuf option accepts: protobuf first, and JSON
/// from a server (a custom API server, a proxy) that cannot serve it.
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// The four bytes before every enveloped object.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// A watch frame longer than this is no frame: the stream is not what it
/// claims to be (etcd's own limit on an object is 1.5 MiB by default).
pub const MAX_FRAME: usize = 64 << 20;

/// Decodes one object's protobuf message (the envelope removed) into `K`.
pub type ProtobufDecode<K> = fn(&[u8]) -> Result<K, String>;

/// Whether a Content-Type names the protobuf media type (with or without
/// `;stream=watch`).
pub fn is_protobuf(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|media| media.trim().eq_ignore_ascii_case(MEDIA_TYPE))
    })
}

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// runtime.Unknown: the envelope.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
}

/// Any list: its metadata and each item's message, undecoded.
#[derive(Clone, PartialEq, Message)]
struct List {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    items: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct ListMeta {
    #[prost(string, optional, tag = "2")]
    resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    continue_: Option<String>,
    #[prost(int64, optional, tag = "4")]
    remaining_item_count: Option<i64>,
}

/// Any object, reduced to the metadata [`RawMeta`] reads: every kind has
/// its ObjectMeta as field 1.
#[derive(Clone, PartialEq, Message)]
struct MetaOnly {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, Message)]
struct RawExtension {
    #[prost(bytes = "vec", optional, tag = "1")]
    raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(string, optional, tag = "3")]
    message: Option<String>,
    #[prost(string, optional, tag = "4")]
    reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    code: Option<i32>,
}

/// An enveloped object: its kind and its own message.
pub struct Enveloped {
    /// `kind` of the envelope's TypeMeta ("" when absent).
    pub kind: String,
    /// The object's message.
    pub raw: Vec<u8>,
}

/// Removes the magic and the envelope.
pub fn open_envelope(body: &[u8]) -> Result<Enveloped, String> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err("protobuf body without the k8s magic prefix".to_owned());
    };
    let unknown = Unknown::decode(rest).map_err(|err| format!("protobuf envelope: {err}"))?;
    if let Some(encoding) = unknown.content_encoding.filter(|e| !e.is_empty()) {
        return Err(format!(
            "protobuf envelope with content encoding {encoding:?}"
        ));
    }
    Ok(Enveloped {
        kind: unknown.type_meta.and_then(|t| t.kind).unwrap_or_default(),
        raw: unknown.raw.unwrap_or_default(),
    })
}

/// The name, namespace, UID and RV of an object's message; `None` without
/// a name (as [`RawMeta::read`] for JSON).
pub fn read_meta(raw: &[u8]) -> Option<RawMeta> {
    let meta = MetaOnly::decode(raw).ok()?.metadata?;
    Some(RawMeta {
        key: ObjectKey {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.filter(|n| !n.is_empty())?,
        },
        uid: meta.uid.unwrap_or_default(),
        resource_version: meta.resource_version.unwrap_or_default(),
    })
}

/// Decodes one object's message as `K` and projects it, as
/// [`decode_object`](super::decode::decode_object) does for JSON: a failure
/// or a rejected projection is [`Undecodable`], with the metadata read from
/// the message.
pub fn decode_object<K, T>(
    raw: &[u8],
    decode: ProtobufDecode<K>,
    project: &impl Fn(K) -> Option<T>,
) -> Result<T, Undecodable> {
    match decode(raw) {
        Ok(obj) => project(obj).ok_or_else(|| Undecodable {
            meta: read_meta(raw),
            error: "projection rejected the object".to_owned(),
        }),
        Err(error) => Err(Undecodable {
            meta: read_meta(raw),
            error,
        }),
    }
}

/// Decodes a protobuf LIST body. A body that is no list at all is an error
/// (the caller's `kube::Error`), one bad item is not.
pub fn decode_list<K, T>(
    body: &[u8],
    decode: ProtobufDecode<K>,
    project: &impl Fn(K) -> Option<T>,
) -> Result<Page<T>, String> {
    let envelope = open_envelope(body)?;
    if !envelope.kind.ends_with("List") {
        return Err(format!("a LIST answered {:?}, not a list", envelope.kind));
    }
    let list =
        List::decode(envelope.raw.as_slice()).map_err(|err| format!("protobuf list: {err}"))?;
    let items = list
        .items
        .iter()
        .map(|raw| match decode_object(raw, decode, project) {
            Ok(obj) => Listed::Item(obj),
            Err(bad) => Listed::Unknown(bad.meta.map(|meta| meta.key)),
        })
        .collect();
    let metadata = list.metadata.unwrap_or_default();
    Ok(Page {
        items,
        resource_version: metadata.resource_version.unwrap_or_default(),
        // Always on the wire, "" on the last page, which JSON omits.
        continue_token: metadata.continue_.filter(|c| !c.is_empty()),
        remaining_item_count: metadata.remaining_item_count,
    })
}

/// A `Status` message as kube's `Status` (no details or metadata: nothing
/// here reads them).
fn status_of(raw: &[u8]) -> Result<kube::core::Status, String> {
    let status = Status::decode(raw).map_err(|err| format!("protobuf Status: {err}"))?;
    let code = status
        .code
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or_default();
    let message = status.message.unwrap_or_default();
    let reason = status.reason.unwrap_or_default();
    let mut out = if status.status.as_deref() == Some("Success") {
        kube::core::Status::success()
    } else {
        kube::core::Status::failure(&message, &reason)
    };
    out.message = message;
    out.reason = reason;
    Ok(out.with_code(code))
}

/// An error response's body in protobuf, as kube's `Status`; `None` when
/// it is not an enveloped Status.
pub fn error_status(body: &[u8]) -> Option<kube::core::Status> {
    let envelope = open_envelope(body).ok()?;
    (envelope.kind == "Status")
        .then(|| status_of(&envelope.raw).ok())
        .flatten()
}

/// One frame of a protobuf WATCH stream, its object decoded by `decode`:
/// the same outcomes as a JSON line ([`parse_watch_line`](super::decode::parse_watch_line)).
pub fn parse_watch_frame<T>(
    frame: &[u8],
    decode: impl FnOnce(&[u8]) -> Result<T, Undecodable>,
) -> WatchInput<T> {
    let event = match WatchEvent::decode(frame) {
        Ok(event) => event,
        Err(err) => return WatchInput::Unrecognised(format!("protobuf watch event: {err}")),
    };
    let object = event.object.and_then(|o| o.raw).unwrap_or_default();
    let kind = match event.kind.as_deref().unwrap_or_default() {
        "ADDED" => WatchEventKind::Added,
        "MODIFIED" => WatchEventKind::Modified,
        "DELETED" => WatchEventKind::Deleted,
        "BOOKMARK" => {
            // An object of the watched kind with only its resourceVersion
            // (and annotations) set.
            let rv = open_envelope(&object)
                .ok()
                .and_then(|envelope| MetaOnly::decode(envelope.raw.as_slice()).ok())
                .and_then(|only| only.metadata?.resource_version)
                .filter(|rv| !rv.is_empty());
            return match rv {
                Some(rv) => WatchInput::Bookmark(rv),
                None => WatchInput::Unrecognised("bookmark without a resourceVersion".to_owned()),
            };
        }
        "ERROR" => {
            return match open_envelope(&object).and_then(|envelope| status_of(&envelope.raw)) {
                Ok(status) => WatchInput::Error(Box::new(status)),
                Err(err) => WatchInput::Unrecognised(err),
            };
        }
        other => {
            return WatchInput::Unrecognised(format!("unknown watch event type {other:?}"));
        }
    };
    let decoded = match open_envelope(&object) {
        Ok(envelope) => decode(&envelope.raw),
        Err(error) => Err(Undecodable { meta: None, error }),
    };
    WatchInput::Object(kind, decoded)
}

/// Test helpers: the bodies and frames kube-apiserver writes, built from
/// the same messages.
#[cfg(test)]
pub(crate) mod encode {
    use prost::Message;

    use super::*;

    /// `k8s\0` + Unknown{kind, raw}.
    pub fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".to_owned()),
                kind: Some(kind.to_owned()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
        }
        .encode(&mut out)
        .unwrap_or_default();
        out
    }

    /// An object message with only this metadata.
    pub fn meta(name: &str, namespace: &str, uid: &str, rv: &str) -> Vec<u8> {
        MetaOnly {
            metadata: Some(ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: Some(uid.to_owned()),
                resource_version: Some(rv.to_owned()),
            }),
        }
        .encode_to_vec()
    }

    /// An enveloped list of `items` (object messages).
    pub fn list(kind: &str, items: Vec<Vec<u8>>, rv: &str, continue_token: &str) -> Vec<u8> {
        counted_list(kind, items, rv, continue_token, None)
    }

    /// [`list`] that says how many items the pages after it hold.
    pub fn counted_list(
        kind: &str,
        items: Vec<Vec<u8>>,
        rv: &str,
        continue_token: &str,
        remaining_item_count: Option<i64>,
    ) -> Vec<u8> {
        let list = List {
            metadata: Some(ListMeta {
                resource_version: Some(rv.to_owned()),
                continue_: Some(continue_token.to_owned()),
                remaining_item_count,
            }),
            items,
        };
        envelope(kind, list.encode_to_vec())
    }

    /// An enveloped Status.
    pub fn status(code: i32, reason: &str, message: &str) -> Vec<u8> {
        let status = Status {
            status: Some("Failure".to_owned()),
            message: Some(message.to_owned()),
            reason: Some(reason.to_owned()),
            code: Some(code),
        };
        envelope("Status", status.encode_to_vec())
    }

    /// One length-prefixed watch frame of `kind` around an enveloped object.
    pub fn frame(kind: &str, object: Vec<u8>) -> Vec<u8> {
        let event = WatchEvent {
            kind: Some(kind.to_owned()),
            object: Some(RawExtension { raw: Some(object) }),
        }
        .encode_to_vec();
        let mut out = u32::try_from(event.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes()
            .to_vec();
        out.extend(event);
        out
    }
}

#[cfg(test)]
#[path = "protobuf_tests.rs"]
mod tests;
