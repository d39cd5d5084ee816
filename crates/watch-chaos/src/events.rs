//! Watch events as the proxy sees them (JSON views, one per event, whichever
//! wire they came on: [`wire`](super::wire)) and the pure transforms applied
//! to them. No I/O here: every fault is a unit test.

use serde_json::{Value, json};

use super::wire::Wire;

/// The message kube-apiserver sends when etcd delivers a non-create event
/// without its previous value (kubernetes PR 76675).
pub const PREVKV_NIL_MESSAGE: &str =
    "etcd event received with PrevKv=nil (key=\"/registry/%s\", modRevision=%s, type=DELETE)";

/// Parses one watch line; `None` when it is not a JSON object.
pub fn parse(line: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(line)
        .ok()
        .filter(Value::is_object)
}

pub fn event_type(event: &Value) -> &str {
    event.get("type").and_then(Value::as_str).unwrap_or("")
}

fn metadata(event: &Value) -> Option<&Value> {
    event.get("object")?.get("metadata")
}

/// `object.metadata.resourceVersion`.
pub fn object_rv(event: &Value) -> Option<&str> {
    metadata(event)?.get("resourceVersion")?.as_str()
}

/// `object.metadata.uid`.
pub fn object_uid(event: &Value) -> Option<&str> {
    metadata(event)?.get("uid")?.as_str()
}

/// `namespace/name` (just `name` for cluster-scoped objects).
pub fn key_of(object: &Value) -> Option<String> {
    let meta = object.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    Some(match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

pub fn event_key(event: &Value) -> Option<String> {
    key_of(event.get("object")?)
}

/// Sets `object.metadata.resourceVersion`.
pub fn set_object_rv(event: &mut Value, rv: &str) {
    if let Some(meta) = event
        .get_mut("object")
        .and_then(|o| o.get_mut("metadata"))
        .and_then(Value::as_object_mut)
    {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// A numeric resourceVersion (KEP-5504); `None` for opaque ones.
pub fn rv_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

/// One serialized watch line, newline-terminated.
pub fn line(event: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A watch ERROR event carrying a `Status`.
pub fn error_event(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    })
}

/// ERROR 410 Expired, as after a compaction.
pub fn expired_event(rv: &str) -> Value {
    error_event(
        410,
        "Expired",
        &format!("too old resource version: {rv} (injected by watch-chaos)"),
    )
}

/// ERROR 500 with kube-apiserver's PrevKv=nil text, for the object `key` of
/// `resource` deleted at `rv`.
pub fn prevkv_nil_event(resource: &str, key: &str, rv: &str) -> Value {
    let message = PREVKV_NIL_MESSAGE
        .replacen("%s", &format!("{resource}/{key}"), 1)
        .replacen("%s", rv, 1);
    error_event(500, "InternalError", &message)
}

/// A DELETED event for `object` as last seen, carrying `rv`.
pub fn deleted_event(object: &Value, rv: &str) -> Value {
    let mut event = json!({ "type": "DELETED", "object": object.clone() });
    set_object_rv(&mut event, rv);
    event
}

/// What a stream should write next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// A whole line.
    Line(Vec<u8>),
    /// Part of a line, then the stream is cut.
    Partial(Vec<u8>),
    /// End the stream cleanly.
    Close,
}

/// The faults in force for one stream, read at each event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamFaults {
    pub old_delete_rv: bool,
    pub drop_deletes: bool,
    pub duplicate: bool,
    pub reorder: bool,
    pub prevkv_nil: bool,
    /// `cut-mid-event`: cut after this many whole events.
    pub cut_after: Option<u64>,
}

/// What happened to one event, for the counters and the old-RV registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    pub out: Vec<Out>,
    /// Counter names to increment.
    pub notes: Vec<&'static str>,
    /// An old RV sent in a DELETED event: a watch resuming there is a replay.
    pub fake_rv: Option<String>,
}

/// Per-stream state: the wire, events sent so far and the event held back
/// by `reorder`.
#[derive(Debug, Default)]
pub struct Transformer {
    wire: Wire,
    sent: u64,
    held: Option<Vec<u8>>,
}

impl Transformer {
    pub fn new(wire: Wire) -> Self {
        Self {
            wire,
            ..Self::default()
        }
    }

    /// Transforms one event of `resource` (a line or a frame, as `wire`
    /// splits them). `previous_rv` is the RV the object had before this
    /// event (from earlier lists and events). The pump, which has read the
    /// event already, calls [`on_view`](Self::on_view).
    #[cfg(test)]
    pub fn on_event(
        &mut self,
        resource: &str,
        raw: &[u8],
        faults: StreamFaults,
        previous_rv: Option<&str>,
    ) -> Step {
        let view = self.wire.decode(raw);
        self.on_view(resource, raw, view, faults, previous_rv)
    }

    /// [`on_event`](Self::on_event) for a caller that has read `raw` into
    /// its view already (`None`: not an event).
    pub fn on_view(
        &mut self,
        resource: &str,
        raw: &[u8],
        view: Option<Value>,
        faults: StreamFaults,
        previous_rv: Option<&str>,
    ) -> Step {
        let mut step = Step::default();
        let wire = self.wire;
        let Some(mut event) = view else {
            step.out.push(Out::Line(wire.verbatim(raw)));
            return step;
        };
        let kind = event_type(&event).to_string();
        if kind == "DELETED" {
            let rv = object_rv(&event).unwrap_or_default().to_string();
            let key = event_key(&event).unwrap_or_default();
            if faults.prevkv_nil {
                step.notes.push("prevkv_nil_injected");
                step.out.extend(self.take_held().map(Out::Line));
                step.out.push(Out::Line(
                    wire.encode(&prevkv_nil_event(resource, &key, &rv)),
                ));
                step.out.push(Out::Close);
                return step;
            }
            if faults.drop_deletes {
                step.notes.push("deletes_dropped");
                return step;
            }
            if faults.old_delete_rv
                && let Some(old) = previous_rv.filter(|old| is_older(old, &rv))
            {
                set_object_rv(&mut event, old);
                step.notes.push("deletes_sent_with_old_rv");
                step.fake_rv = Some(old.to_string());
                step.out.extend(self.take_held().map(Out::Line));
                step.out.push(Out::Line(wire.encode(&event)));
                step.out.push(Out::Close);
                return step;
            }
        }
        if faults.drop_deletes && kind == "MODIFIED" && is_being_deleted(&event) {
            // The start of a graceful deletion is part of the lost delete.
            step.notes.push("deletes_dropped");
            return step;
        }
        let bytes = wire.verbatim(raw);
        let passes_through = matches!(kind.as_str(), "BOOKMARK" | "ERROR");
        if passes_through {
            step.out.push(Out::Line(bytes));
            return step;
        }
        if let Some(after) = faults.cut_after
            && self.sent >= after
        {
            step.notes.push("streams_cut");
            step.out.extend(self.take_held().map(Out::Line));
            let half = bytes.len() / 2;
            step.out.push(Out::Partial(bytes[..half.max(1)].to_vec()));
            return step;
        }
        self.sent += 1;
        let copies = if faults.duplicate {
            step.notes.push("events_duplicated");
            2
        } else {
            1
        };
        for _ in 0..copies {
            if faults.reorder {
                if let Some(previous) = self.held.replace(bytes.clone()) {
                    step.notes.push("events_reordered");
                    // The newer event first, then the one held back.
                    step.out.push(Out::Line(bytes.clone()));
                    step.out.push(Out::Line(previous));
                    self.held = None;
                }
            } else {
                step.out.push(Out::Line(bytes.clone()));
            }
        }
        step
    }

    /// The event held back by `reorder`, if any (sent when no next one came).
    pub fn take_held(&mut self) -> Option<Vec<u8>> {
        self.held.take()
    }

    pub fn holding(&self) -> bool {
        self.held.is_some()
    }
}

/// The object carries a deletionTimestamp (a graceful deletion has begun).
fn is_being_deleted(event: &Value) -> bool {
    metadata(event).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|t| !t.is_null()))
}

/// `old` is strictly older than `new` (numeric RVs only).
fn is_older(old: &str, new: &str) -> bool {
    matches!((rv_number(old), rv_number(new)), (Some(a), Some(b)) if a < b)
}

/// A JSON line as sent: newline-terminated.
pub fn with_newline(raw: &[u8]) -> Vec<u8> {
    let mut bytes = raw.to_vec();
    if bytes.last() != Some(&b'\n') {
        bytes.push(b'\n');
    }
    bytes
}

/// Splits complete lines off the front of `buf`, leaving a trailing partial
/// line in it.
pub fn split_lines(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
        let rest = buf.split_off(pos + 1);
        let line = std::mem::replace(buf, rest);
        if line.iter().any(|b| !b.is_ascii_whitespace()) {
            lines.push(line);
        }
    }
    lines
}

/// Keeps the items of a LIST body (JSON) that are in `namespace`.
pub fn filter_list_namespace(list: &Value, namespace: Option<&str>) -> Value {
    let Some(ns) = namespace else {
        return list.clone();
    };
    let mut out = list.clone();
    if let Some(items) = out.get_mut("items").and_then(Value::as_array_mut) {
        items.retain(|item| {
            item.get("metadata")
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                == Some(ns)
        });
    }
    out
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
