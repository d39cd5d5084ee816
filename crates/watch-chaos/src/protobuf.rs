//! kube-apiserver's protobuf wire (`application/vnd.kubernetes.protobuf`),
//! read into the same JSON views the faults work on and written back.
//!
//! The proxy never needs a whole object decoded: the faults read an event's
//! type and its object's name, namespace, UID, resourceVersion and
//! deletionTimestamp, and change at most the resourceVersion. So an object
//! is read here as a view of those fields plus its own message (hex, under
//! [`BODY_KEY`]), and written back as that message with the view's metadata
//! put in place of the old; every other field goes through byte for byte.
//! Messages are read field by field with the field numbers of
//! k8s.io/apimachinery's `generated.proto`, no schema needed:
//!
//! - an object or list body: the magic `k8s\0`, then `runtime.Unknown`
//!   (`TypeMeta typeMeta = 1` {apiVersion = 1, kind = 2}, `bytes raw = 2`,
//!   `contentEncoding = 3`, `contentType = 4`);
//! - an object: `ObjectMeta metadata = 1` (name = 1, namespace = 3, uid = 5,
//!   resourceVersion = 6, deletionTimestamp = 9 as `Time` {seconds = 1});
//! - a list: `ListMeta metadata = 1` (resourceVersion = 2), `items = 2`, each
//!   an object's message without magic or envelope;
//! - a watch stream (`;stream=watch`): frames of a 4-byte big-endian length
//!   and a `WatchEvent` (type = 1, `RawExtension object = 2` {raw = 1}),
//!   whose raw is an object body as above (a `Status` for an ERROR: status
//!   = 2, message = 3, reason = 4, code = 6).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The Content-Type of a protobuf watch stream.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The key under which a view carries its object's message, hex-encoded.
pub const BODY_KEY: &str = "watch-chaos/protobuf";

const MAGIC: &[u8; 4] = b"k8s\0";

/// A frame longer than this is no frame: the stream is not protobuf.
const MAX_FRAME: usize = 64 << 20;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The ObjectMeta fields a view holds, by field number.
const META_STRINGS: [(u64, &str); 4] = [
    (1, "name"),
    (3, "namespace"),
    (5, "uid"),
    (6, "resourceVersion"),
];
const META_DELETION_TIMESTAMP: u64 = 9;

/// Whether a Content-Type names the protobuf media type (with parameters
/// such as `;stream=watch` or `;as=PartialObjectMetadataList` or not).
pub fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(MEDIA_TYPE))
}

/// One field of a message: its number, wire type, and its payload (the
/// bytes after the length for LEN, the value's own bytes otherwise).
struct Field<'a> {
    number: u64,
    wire: u8,
    data: &'a [u8],
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint longer than ten bytes".to_owned())
}

fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        let wire = u8::try_from(key & 7).unwrap_or(u8::MAX);
        let start = match wire {
            LEN => {
                let len = usize::try_from(read_varint(buf, &mut pos)?)
                    .map_err(|_| "length out of range".to_owned())?;
                let start = pos;
                pos = pos.checked_add(len).ok_or("length out of range")?;
                start
            }
            VARINT => {
                let start = pos;
                read_varint(buf, &mut pos)?;
                start
            }
            FIXED64 | FIXED32 => {
                let start = pos;
                pos += if wire == FIXED64 { 8 } else { 4 };
                start
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        let data = buf.get(start..pos).ok_or("field runs past the message")?;
        out.push(Field {
            number: key >> 3,
            wire,
            data,
        });
    }
    Ok(out)
}

/// The last occurrence of a LEN field (protobuf: the last one wins).
fn last_len<'a>(fields: &[Field<'a>], number: u64) -> Option<&'a [u8]> {
    fields
        .iter()
        .rev()
        .find(|f| f.number == number && f.wire == LEN)
        .map(|f| f.data)
}

fn last_string(fields: &[Field<'_>], number: u64) -> String {
    last_len(fields, number)
        .map(|data| String::from_utf8_lossy(data).into_owned())
        .unwrap_or_default()
}

fn last_varint(fields: &[Field<'_>], number: u64) -> Option<u64> {
    let field = fields
        .iter()
        .rev()
        .find(|f| f.number == number && f.wire == VARINT)?;
    read_varint(field.data, &mut 0).ok()
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(u8::try_from(value & 0x7f).unwrap_or(0) | 0x80);
        value >>= 7;
    }
    out.push(u8::try_from(value).unwrap_or(0));
}

fn put_len(out: &mut Vec<u8>, number: u64, data: &[u8]) {
    put_varint(out, (number << 3) | u64::from(LEN));
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn put_field(out: &mut Vec<u8>, field: &Field<'_>) {
    put_varint(out, (field.number << 3) | u64::from(field.wire));
    if field.wire == LEN {
        put_varint(out, field.data.len() as u64);
    }
    out.extend_from_slice(field.data);
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [high, low] => Some((digit(*high)? << 4) | digit(*low)?),
            _ => None,
        })
        .collect()
}

/// An enveloped body: `k8s\0` + runtime.Unknown.
struct Envelope {
    api_version: String,
    kind: String,
    raw: Vec<u8>,
}

fn open_envelope(body: &[u8]) -> Result<Envelope, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("protobuf body without the k8s magic prefix")?;
    let unknown = fields(rest)?;
    let type_meta = fields(last_len(&unknown, 1).unwrap_or_default())?;
    Ok(Envelope {
        api_version: last_string(&type_meta, 1),
        kind: last_string(&type_meta, 2),
        raw: last_len(&unknown, 2).unwrap_or_default().to_vec(),
    })
}

fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_len(&mut type_meta, 1, api_version.as_bytes());
    put_len(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    put_len(&mut out, 1, &type_meta);
    put_len(&mut out, 2, raw);
    // contentEncoding and contentType, written empty as kube-apiserver does.
    put_len(&mut out, 3, b"");
    put_len(&mut out, 4, b"");
    out
}

/// The view's `metadata` of an object's message.
fn meta_view(object: &[u8]) -> Map<String, Value> {
    let mut view = Map::new();
    let Ok(object) = fields(object) else {
        return view;
    };
    let Ok(meta) = fields(last_len(&object, 1).unwrap_or_default()) else {
        return view;
    };
    for (number, name) in META_STRINGS {
        let value = last_string(&meta, number);
        if !value.is_empty() {
            view.insert(name.to_owned(), Value::String(value));
        }
    }
    if let Some(time) = last_len(&meta, META_DELETION_TIMESTAMP) {
        let seconds = fields(time)
            .ok()
            .and_then(|t| last_varint(&t, 1))
            .unwrap_or(0);
        // int64 on the wire as its two's complement.
        let seconds = i64::from_ne_bytes(seconds.to_ne_bytes());
        let text = Timestamp::from_second(seconds)
            .map(|t| t.to_string())
            .unwrap_or_default();
        view.insert("deletionTimestamp".to_owned(), Value::String(text));
    }
    view
}

/// An object's view: its kind, metadata and message.
fn object_view(api_version: &str, kind: &str, object: &[u8]) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": meta_view(object),
        BODY_KEY: hex(object),
    })
}

fn status_view(raw: &[u8]) -> Value {
    let status = fields(raw).unwrap_or_default();
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": last_string(&status, 2),
        "message": last_string(&status, 3),
        "reason": last_string(&status, 4),
        "code": last_varint(&status, 6).unwrap_or(0),
    })
}

/// The ObjectMeta message `meta` with the view's fields in place: each
/// where it was, those it lacked after the rest.
fn meta_with(meta: &[u8], view: &Value) -> Vec<u8> {
    let wanted = |name: &str| view.get(name).and_then(Value::as_str).unwrap_or_default();
    let mut out = Vec::with_capacity(meta.len() + 16);
    let mut written = [false; META_STRINGS.len()];
    for field in fields(meta).unwrap_or_default() {
        match META_STRINGS.iter().position(|(n, _)| *n == field.number) {
            Some(i) if written[i] => {}
            Some(i) => {
                put_len(&mut out, field.number, wanted(META_STRINGS[i].1).as_bytes());
                written[i] = true;
            }
            None => put_field(&mut out, &field),
        }
    }
    for (i, (number, name)) in META_STRINGS.iter().enumerate() {
        if !written[i] && !wanted(name).is_empty() {
            put_len(&mut out, *number, wanted(name).as_bytes());
        }
    }
    out
}

/// An object's message from its view: the message it carries (none for a
/// view read from JSON) with the view's metadata put in.
fn object_message(view: &Value) -> Vec<u8> {
    let body = view
        .get(BODY_KEY)
        .and_then(Value::as_str)
        .and_then(unhex)
        .unwrap_or_default();
    let meta_view = view.get("metadata").cloned().unwrap_or(Value::Null);
    let object = fields(&body).unwrap_or_default();
    let meta = meta_with(last_len(&object, 1).unwrap_or_default(), &meta_view);
    let mut out = Vec::with_capacity(body.len() + 16);
    put_len(&mut out, 1, &meta);
    for field in object.iter().filter(|f| f.number != 1) {
        put_field(&mut out, field);
    }
    out
}

fn status_message(view: &Value) -> Vec<u8> {
    let text = |name: &str| view.get(name).and_then(Value::as_str).unwrap_or_default();
    let mut out = Vec::new();
    put_len(&mut out, 1, b"");
    put_len(&mut out, 2, text("status").as_bytes());
    put_len(&mut out, 3, text("message").as_bytes());
    put_len(&mut out, 4, text("reason").as_bytes());
    put_varint(&mut out, (6 << 3) | u64::from(VARINT));
    put_varint(
        &mut out,
        view.get("code").and_then(Value::as_u64).unwrap_or(0),
    );
    out
}

/// An object body (magic, envelope, message) from a view.
fn object_body(view: &Value) -> Vec<u8> {
    let text = |name: &str| view.get(name).and_then(Value::as_str).unwrap_or_default();
    let kind = text("kind");
    let message = if kind == "Status" {
        status_message(view)
    } else {
        object_message(view)
    };
    let api_version = match text("apiVersion") {
        "" => "v1",
        given => given,
    };
    envelope(api_version, kind, &message)
}

/// Splits whole frames (with their length) off the front of `buf`, leaving
/// a trailing partial frame in it.
pub fn split_frames(buf: &mut Vec<u8>) -> Result<Vec<Vec<u8>>, String> {
    let mut frames = Vec::new();
    while let Some(prefix) = buf.first_chunk::<4>() {
        let len = usize::try_from(u32::from_be_bytes(*prefix)).unwrap_or(usize::MAX);
        if len > MAX_FRAME {
            return Err(format!(
                "a watch frame of {len} bytes: not a protobuf stream"
            ));
        }
        if buf.len() < 4 + len {
            break;
        }
        let rest = buf.split_off(4 + len);
        frames.push(std::mem::replace(buf, rest));
    }
    Ok(frames)
}

/// The view of one watch frame (length included), as a JSON watch line
/// reads: `{"type", "object"}`; `None` when it is no watch event.
pub fn decode_event(frame: &[u8]) -> Option<Value> {
    let event = fields(frame.get(4..)?).ok()?;
    let kind = last_string(&event, 1);
    let raw = fields(last_len(&event, 2)?).ok()?;
    let envelope = open_envelope(last_len(&raw, 1)?).ok()?;
    let object = if envelope.kind == "Status" {
        status_view(&envelope.raw)
    } else {
        object_view(&envelope.api_version, &envelope.kind, &envelope.raw)
    };
    Some(json!({"type": kind, "object": object}))
}

/// One watch frame (length included) from an event's view.
pub fn encode_event(event: &Value) -> Vec<u8> {
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let object = object_body(event.get("object").unwrap_or(&Value::Null));
    let mut raw = Vec::with_capacity(object.len() + 8);
    put_len(&mut raw, 1, &object);
    let mut message = Vec::with_capacity(raw.len() + 16);
    put_len(&mut message, 1, kind.as_bytes());
    put_len(&mut message, 2, &raw);
    let mut out = u32::try_from(message.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    out.extend(message);
    out
}

/// The start of a frame that promises more bytes than follow: what a
/// client reads from a stream cut in the middle of an event.
pub fn cut_fragment() -> Vec<u8> {
    let mut out = 64u32.to_be_bytes().to_vec();
    put_len(&mut out, 1, b"MODIFIED");
    out
}

/// The view of a LIST body: `{"metadata": {"resourceVersion"}, "items"}`,
/// as a JSON list reads.
pub fn decode_list(body: &[u8]) -> Result<Value, String> {
    let envelope = open_envelope(body)?;
    let item_kind = envelope
        .kind
        .strip_suffix("List")
        .ok_or_else(|| format!("a LIST answered {:?}, not a list", envelope.kind))?;
    let list = fields(&envelope.raw)?;
    let meta = fields(last_len(&list, 1).unwrap_or_default())?;
    let items: Vec<Value> = list
        .iter()
        .filter(|f| f.number == 2 && f.wire == LEN)
        .map(|item| object_view(&envelope.api_version, item_kind, item.data))
        .collect();
    Ok(json!({
        "metadata": {"resourceVersion": last_string(&meta, 2)},
        "items": items,
    }))
}

/// A LIST body with only the items in `namespace`.
pub fn filter_list_namespace(body: &[u8], namespace: &str) -> Result<Vec<u8>, String> {
    let opened = open_envelope(body)?;
    let list = fields(&opened.raw)?;
    let mut out = Vec::with_capacity(opened.raw.len());
    for field in &list {
        let keep = field.number != 2
            || meta_view(field.data)
                .get("namespace")
                .and_then(Value::as_str)
                == Some(namespace);
        if keep {
            put_field(&mut out, field);
        }
    }
    Ok(envelope(&opened.api_version, &opened.kind, &out))
}

#[cfg(test)]
#[path = "protobuf_tests.rs"]
mod tests;
