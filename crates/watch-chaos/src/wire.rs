//! The two wires a LIST or WATCH answer comes on, JSON and protobuf: how a
//! stream splits into events, and how an event is read into the JSON view
//! the faults work on ([`events`](super::events)) and written back. Every
//! answer goes to the client on the wire the API server chose for it, so a
//! client that asked for protobuf (client-go by default, endpoints-guard's
//! pods) runs its protobuf decoder under every fault.

use http::HeaderMap;
use http::header;
use serde_json::Value;

use super::events;
use super::protobuf;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wire {
    /// One JSON object per line.
    #[default]
    Json,
    /// Length-prefixed protobuf frames.
    Protobuf,
}

impl Wire {
    /// The wire of an answer, by its Content-Type; `None` for anything the
    /// proxy does not read (passed through untouched).
    pub fn of_answer(headers: &HeaderMap) -> Option<Wire> {
        let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        if protobuf::is_protobuf(content_type) {
            Some(Wire::Protobuf)
        } else if content_type.starts_with("application/json") {
            Some(Wire::Json)
        } else {
            None
        }
    }

    /// The wire for an answer the proxy writes itself: protobuf when the
    /// request accepts the objects themselves in protobuf (not as another
    /// type, `;as=PartialObjectMetadataList` and the like).
    pub fn accepted_by(headers: &HeaderMap) -> Wire {
        let protobuf = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|media| protobuf::is_protobuf(media) && !media.contains(";as="));
        if protobuf { Wire::Protobuf } else { Wire::Json }
    }

    /// The Content-Type of a watch stream on this wire.
    pub fn watch_content_type(self) -> &'static str {
        match self {
            Wire::Json => "application/json",
            Wire::Protobuf => protobuf::WATCH_CONTENT_TYPE,
        }
    }

    /// Splits whole events off the front of `buf`, leaving a trailing
    /// partial one in it. An error: the stream is not on this wire.
    pub fn split(self, buf: &mut Vec<u8>) -> Result<Vec<Vec<u8>>, String> {
        match self {
            Wire::Json => Ok(events::split_lines(buf)),
            Wire::Protobuf => protobuf::split_frames(buf),
        }
    }

    /// The view of one event; `None` when it is not one.
    pub fn decode(self, event: &[u8]) -> Option<Value> {
        match self {
            Wire::Json => events::parse(event),
            Wire::Protobuf => protobuf::decode_event(event),
        }
    }

    /// One event written from its view. A view read from the other wire
    /// is written from the fields it holds.
    pub fn encode(self, event: &Value) -> Vec<u8> {
        match self {
            Wire::Json => {
                let protobuf_body = event
                    .get("object")
                    .is_some_and(|o| o.get(protobuf::BODY_KEY).is_some());
                if protobuf_body {
                    let mut event = event.clone();
                    if let Some(object) = event.get_mut("object").and_then(Value::as_object_mut) {
                        object.remove(protobuf::BODY_KEY);
                    }
                    events::line(&event)
                } else {
                    events::line(event)
                }
            }
            Wire::Protobuf => protobuf::encode_event(event),
        }
    }

    /// An event passed on as the API server sent it.
    pub fn verbatim(self, event: &[u8]) -> Vec<u8> {
        match self {
            Wire::Json => events::with_newline(event),
            Wire::Protobuf => event.to_vec(),
        }
    }

    /// The first bytes of an event, sent before a stream is cut.
    pub fn cut_fragment(self) -> Vec<u8> {
        match self {
            Wire::Json => b"{\"type\":\"MODIFIED\",\"object\":{\"kind".to_vec(),
            Wire::Protobuf => protobuf::cut_fragment(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn accepting(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn the_wire_a_request_accepts() {
        let client_go = accepting("application/vnd.kubernetes.protobuf, */*");
        assert_eq!(Wire::accepted_by(&client_go), Wire::Protobuf);
        let metadata = accepting(
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        );
        assert_eq!(Wire::accepted_by(&metadata), Wire::Json);
        assert_eq!(
            Wire::accepted_by(&accepting("application/json")),
            Wire::Json
        );
        assert_eq!(Wire::accepted_by(&HeaderMap::new()), Wire::Json);
    }

    #[test]
    fn the_wire_of_an_answer() {
        let answer = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            Wire::of_answer(&headers)
        };
        assert_eq!(answer(protobuf::WATCH_CONTENT_TYPE), Some(Wire::Protobuf));
        assert_eq!(answer("application/json;stream=watch"), Some(Wire::Json));
        assert_eq!(answer("application/cbor"), None);
        assert_eq!(Wire::of_answer(&HeaderMap::new()), None);
    }

    #[test]
    fn a_cut_fragment_is_no_whole_event() {
        for wire in [Wire::Json, Wire::Protobuf] {
            let mut buf = wire.cut_fragment();
            assert_eq!(wire.split(&mut buf), Ok(vec![]), "{wire:?}");
        }
    }
}
