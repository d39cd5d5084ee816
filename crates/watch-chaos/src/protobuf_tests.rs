//! The protobuf views against messages built and read by prost, as Go's
//! generated code writes and reads them (field numbers of k8s.io/api and
//! k8s.io/apimachinery `generated.proto`).

use std::collections::BTreeMap;

use prost::Message;
use serde_json::json;

use super::*;
use crate::events::{self, StreamFaults, Transformer};
use crate::wire::Wire;

#[derive(Clone, PartialEq, Message)]
struct TypeMetaPb {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct UnknownPb {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMetaPb>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    content_type: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TimePb {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMetaPb {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    generation: Option<i64>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<TimePb>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
}

/// A pod: metadata, and spec/status as opaque messages.
#[derive(Clone, PartialEq, Message)]
struct PodPb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMetaPb>,
    #[prost(bytes = "vec", optional, tag = "2")]
    spec: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "3")]
    status: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct ListMetaPb {
    #[prost(string, optional, tag = "2")]
    resource_version: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PodListPb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMetaPb>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<PodPb>,
}

#[derive(Clone, PartialEq, Message)]
struct StatusPb {
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(string, optional, tag = "3")]
    message: Option<String>,
    #[prost(string, optional, tag = "4")]
    reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    code: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct RawExtensionPb {
    #[prost(bytes = "vec", optional, tag = "1")]
    raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct WatchEventPb {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtensionPb>,
}

fn pod(namespace: &str, name: &str, rv: &str) -> PodPb {
    PodPb {
        metadata: Some(ObjectMetaPb {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.into()),
            generation: Some(0),
            deletion_timestamp: None,
            labels: BTreeMap::from([("app".into(), "web".into())]),
        }),
        spec: Some(b"\x52\x05node1".to_vec()),
        status: Some(b"\x0a\x07Running".to_vec()),
    }
}

fn enveloped(kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = b"k8s\0".to_vec();
    UnknownPb {
        type_meta: Some(TypeMetaPb {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .expect("encodes");
    out
}

fn frame(kind: &str, object: Vec<u8>) -> Vec<u8> {
    let event = WatchEventPb {
        kind: Some(kind.into()),
        object: Some(RawExtensionPb { raw: Some(object) }),
    }
    .encode_to_vec();
    let mut out = u32::try_from(event.len())
        .expect("small")
        .to_be_bytes()
        .to_vec();
    out.extend(event);
    out
}

fn pod_frame(kind: &str, pod: &PodPb) -> Vec<u8> {
    frame(kind, enveloped("Pod", pod.encode_to_vec()))
}

/// Reads a frame back: its type and its object's envelope kind and message.
fn read_frame(bytes: &[u8]) -> (String, String, Vec<u8>) {
    let len = usize::try_from(u32::from_be_bytes(
        *bytes.first_chunk::<4>().expect("prefix"),
    ))
    .expect("fits");
    assert_eq!(bytes.len(), 4 + len, "one whole frame");
    let event = WatchEventPb::decode(&bytes[4..]).expect("a WatchEvent");
    let object = event.object.and_then(|o| o.raw).expect("an object");
    let unknown =
        UnknownPb::decode(object.strip_prefix(b"k8s\0").expect("magic")).expect("envelope");
    (
        event.kind.unwrap_or_default(),
        unknown.type_meta.and_then(|t| t.kind).unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    )
}

#[test]
fn reads_an_event_and_writes_it_back_byte_for_byte() {
    let original = pod_frame("MODIFIED", &pod("a", "web-1", "41"));
    let view = decode_event(&original).expect("an event");
    assert_eq!(events::event_type(&view), "MODIFIED");
    assert_eq!(events::event_key(&view).as_deref(), Some("a/web-1"));
    assert_eq!(events::object_rv(&view), Some("41"));
    assert_eq!(events::object_uid(&view), Some("uid-web-1"));
    assert_eq!(view["object"]["kind"], "Pod");
    assert_eq!(encode_event(&view), original);
}

#[test]
fn a_new_rv_changes_only_the_rv() {
    let mut view = decode_event(&pod_frame("DELETED", &pod("a", "web-1", "41"))).expect("event");
    events::set_object_rv(&mut view, "7");
    let (kind, envelope_kind, raw) = read_frame(&encode_event(&view));
    assert_eq!((kind.as_str(), envelope_kind.as_str()), ("DELETED", "Pod"));
    let mut expected = pod("a", "web-1", "7");
    assert_eq!(PodPb::decode(raw.as_slice()).expect("a pod"), expected);
    // The same fields in the same order as Go writes them.
    expected.metadata.as_mut().expect("meta").resource_version = Some("7".into());
    assert_eq!(raw, expected.encode_to_vec());
}

#[test]
fn a_deletion_timestamp_shows_in_the_view() {
    let mut terminating = pod("a", "web-1", "41");
    terminating
        .metadata
        .as_mut()
        .expect("meta")
        .deletion_timestamp = Some(TimePb {
        seconds: Some(1_767_225_600),
    });
    let view = decode_event(&pod_frame("MODIFIED", &terminating)).expect("event");
    assert_eq!(
        view["object"]["metadata"]["deletionTimestamp"],
        "2026-01-01T00:00:00Z"
    );
    let mut transformer = Transformer::new(Wire::Protobuf);
    let faults = StreamFaults {
        drop_deletes: true,
        ..StreamFaults::default()
    };
    let step = transformer.on_event("pods", &pod_frame("MODIFIED", &terminating), faults, None);
    assert!(step.out.is_empty(), "the start of a deletion is dropped");
    assert_eq!(step.notes, vec!["deletes_dropped"]);
}

#[test]
fn statuses_are_written_as_go_reads_them() {
    for event in [
        events::expired_event("12"),
        events::prevkv_nil_event("pods", "a/b", "9"),
    ] {
        let (kind, envelope_kind, raw) = read_frame(&encode_event(&event));
        assert_eq!((kind.as_str(), envelope_kind.as_str()), ("ERROR", "Status"));
        let status = StatusPb::decode(raw.as_slice()).expect("a Status");
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(
            status.code,
            event["object"]["code"]
                .as_i64()
                .and_then(|c| i32::try_from(c).ok())
        );
        assert_eq!(status.reason.as_deref(), event["object"]["reason"].as_str());
        assert_eq!(
            status.message.as_deref(),
            event["object"]["message"].as_str()
        );
        // And read back into the same view.
        let view = decode_event(&encode_event(&event)).expect("event");
        assert_eq!(view["object"]["code"], event["object"]["code"]);
        assert_eq!(view["object"]["message"], event["object"]["message"]);
    }
}

#[test]
fn a_view_read_from_json_is_written_from_its_metadata() {
    let event = json!({"type": "DELETED", "object": {"kind": "Service", "apiVersion": "v1",
        "metadata": {"namespace": "a", "name": "s", "uid": "u1", "resourceVersion": "5"},
        "spec": {"clusterIP": "10.0.0.1"}}});
    let (kind, envelope_kind, raw) = read_frame(&encode_event(&event));
    assert_eq!(
        (kind.as_str(), envelope_kind.as_str()),
        ("DELETED", "Service")
    );
    let meta = PodPb::decode(raw.as_slice())
        .expect("an object")
        .metadata
        .expect("meta");
    assert_eq!(meta.name.as_deref(), Some("s"));
    assert_eq!(meta.namespace.as_deref(), Some("a"));
    assert_eq!(meta.uid.as_deref(), Some("u1"));
    assert_eq!(meta.resource_version.as_deref(), Some("5"));
    // And a protobuf view on the JSON wire leaves its message out.
    let view = decode_event(&pod_frame("ADDED", &pod("a", "p", "3"))).expect("event");
    let line: Value = serde_json::from_slice(&Wire::Json.encode(&view)).expect("JSON");
    assert_eq!(line["object"]["metadata"]["name"], "p");
    assert!(line["object"].get(BODY_KEY).is_none());
}

#[test]
fn frames_split_whole_and_refuse_what_is_no_frame() {
    let one = pod_frame("ADDED", &pod("a", "p", "3"));
    let two = pod_frame("MODIFIED", &pod("a", "p", "4"));
    let mut buf = [one.clone(), two[..5].to_vec()].concat();
    assert_eq!(split_frames(&mut buf).expect("frames"), vec![one]);
    assert_eq!(buf, two[..5].to_vec(), "the partial frame waits");
    buf.extend_from_slice(&two[5..]);
    assert_eq!(split_frames(&mut buf).expect("frames"), vec![two]);
    assert!(buf.is_empty());
    let mut json = b"{\"type\":\"ADDED\"}\n".to_vec();
    assert!(
        split_frames(&mut json).is_err(),
        "JSON is no protobuf stream"
    );
    assert!(decode_event(b"\0\0\0\x02\xff\xff").is_none());
}

#[test]
fn the_old_delete_fault_on_protobuf() {
    let mut transformer = Transformer::new(Wire::Protobuf);
    let faults = StreamFaults {
        old_delete_rv: true,
        ..StreamFaults::default()
    };
    let step = transformer.on_event(
        "pods",
        &pod_frame("DELETED", &pod("a", "p", "50")),
        faults,
        Some("40"),
    );
    assert_eq!(step.fake_rv.as_deref(), Some("40"));
    let [events::Out::Line(sent), events::Out::Close] = step.out.as_slice() else {
        panic!("one event and the end: {:?}", step.out);
    };
    let (kind, _, raw) = read_frame(sent);
    assert_eq!(kind, "DELETED");
    let meta = PodPb::decode(raw.as_slice())
        .expect("pod")
        .metadata
        .expect("meta");
    assert_eq!(meta.resource_version.as_deref(), Some("40"));

    let faults = StreamFaults {
        prevkv_nil: true,
        ..StreamFaults::default()
    };
    let step = transformer.on_event(
        "pods",
        &pod_frame("DELETED", &pod("a", "p", "50")),
        faults,
        None,
    );
    let [events::Out::Line(sent), events::Out::Close] = step.out.as_slice() else {
        panic!("an error and the end: {:?}", step.out);
    };
    let (kind, envelope_kind, raw) = read_frame(sent);
    assert_eq!((kind.as_str(), envelope_kind.as_str()), ("ERROR", "Status"));
    assert_eq!(
        StatusPb::decode(raw.as_slice()).expect("status").code,
        Some(500)
    );
}

#[test]
fn lists_are_read_and_filtered_by_namespace() {
    let list = PodListPb {
        metadata: Some(ListMetaPb {
            resource_version: Some("77".into()),
        }),
        items: vec![
            pod("a", "p1", "70"),
            pod("b", "p2", "71"),
            pod("a", "p3", "72"),
        ],
    };
    let body = enveloped("PodList", list.encode_to_vec());
    let view = decode_list(&body).expect("a list");
    assert_eq!(view["metadata"]["resourceVersion"], "77");
    let keys: Vec<_> = view["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(events::key_of)
        .collect();
    assert_eq!(keys, vec!["a/p1", "b/p2", "a/p3"]);
    assert_eq!(view["items"][0]["kind"], "Pod");

    let filtered = filter_list_namespace(&body, "a").expect("filtered");
    let unknown =
        UnknownPb::decode(filtered.strip_prefix(b"k8s\0").expect("magic")).expect("envelope");
    let filtered = PodListPb::decode(unknown.raw.expect("raw").as_slice()).expect("a list");
    assert_eq!(filtered.metadata, list.metadata);
    assert_eq!(
        filtered.items,
        vec![list.items[0].clone(), list.items[2].clone()]
    );
    assert!(decode_list(&enveloped("Pod", pod("a", "p", "1").encode_to_vec())).is_err());
}

#[test]
fn content_types() {
    assert!(is_protobuf("application/vnd.kubernetes.protobuf"));
    assert!(is_protobuf(
        "application/vnd.kubernetes.protobuf;stream=watch"
    ));
    assert!(is_protobuf(
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    ));
    assert!(!is_protobuf("application/json"));
}
