//! The protobuf wire without a server: the envelope, lists, watch frames,
//! and that the state machine takes a frame exactly as the JSON line that
//! says the same (undecodable objects, ERROR 410, BOOKMARK).

use futures::executor::block_on;

use super::encode::{envelope, frame, list, meta, status};
use super::*;
use crate::decode::parse_watch_line;
use crate::machine::RestartReason;
use crate::testkit::{Harness, Obj, key, obj};

/// The test "kind": an object message whose ObjectMeta is all there is;
/// one named "bad" does not decode.
fn decode_obj(raw: &[u8]) -> Result<Obj, String> {
    let meta = read_meta(raw).ok_or("no metadata")?;
    if meta.key.name == "bad" {
        return Err("bad object".to_owned());
    }
    Ok(Obj {
        data: format!("{}@{}", meta.key.name, meta.resource_version),
        key: meta.key,
        uid: meta.uid,
        rv: meta.resource_version,
    })
}

fn keep(o: Obj) -> Option<Obj> {
    Some(o)
}

fn item(name: &str, rv: &str) -> Vec<u8> {
    meta(name, "ns", &format!("u-{name}"), rv)
}

/// The frame's event as the state machine gets it.
fn input(frame_bytes: &[u8]) -> WatchInput<Obj> {
    // The length prefix, as the driver's reader removes it.
    let (prefix, event) = frame_bytes.split_at(4);
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    assert_eq!(usize::try_from(len).ok(), Some(event.len()));
    parse_watch_frame(event, |raw| decode_object(raw, decode_obj, &keep))
}

#[test]
fn media_types_are_told_apart_by_their_type_only() {
    assert!(is_protobuf(Some("application/vnd.kubernetes.protobuf")));
    assert!(is_protobuf(Some(
        "application/vnd.kubernetes.protobuf;stream=watch"
    )));
    assert!(is_protobuf(Some(
        "Application/VND.kubernetes.protobuf ; stream=watch"
    )));
    assert!(!is_protobuf(Some("application/json")));
    assert!(!is_protobuf(Some("application/json;stream=watch")));
    assert!(!is_protobuf(None));
}

#[test]
fn the_envelope_needs_the_magic_and_no_content_encoding() {
    let body = envelope("Pod", item("a", "5"));
    let Ok(open) = open_envelope(&body) else {
        panic!("must unwrap")
    };
    assert_eq!(open.kind, "Pod");
    assert_eq!(read_meta(&open.raw).map(|m| m.key), Some(key("a")));

    let mut bad_magic = body.clone();
    bad_magic[0] = b'K';
    assert!(open_envelope(&bad_magic).is_err_and(|e| e.contains("magic")));
    assert!(open_envelope(b"{\"kind\":\"Pod\"}").is_err());
    assert!(
        open_envelope(&body[..body.len() - 3]).is_err(),
        "truncated envelope"
    );
}

#[test]
fn a_list_keeps_its_good_items_and_marks_bad_ones_unknown() {
    let items = vec![
        item("a", "5"),
        item("bad", "6"),
        vec![0xff, 0xff, 0xff],
        item("b", "7"),
    ];
    let body = list("PodList", items, "10", "next");
    let Ok(page) = decode_list(&body, decode_obj, &keep) else {
        panic!("must decode")
    };
    assert_eq!(page.resource_version, "10");
    assert_eq!(page.continue_token.as_deref(), Some("next"));
    let shapes: Vec<String> = page
        .items
        .iter()
        .map(|i| match i {
            Listed::Item(o) => o.data.clone(),
            Listed::Unknown(Some(k)) => format!("unknown {k}"),
            Listed::Unknown(None) => "unknown".to_owned(),
        })
        .collect();
    assert_eq!(shapes, ["a@5", "unknown ns/bad", "unknown", "b@7"]);

    // The last page says "" where JSON says nothing: no continue token.
    let last = decode_list(&list("PodList", Vec::new(), "10", ""), decode_obj, &keep);
    assert!(last.is_ok_and(|p| p.continue_token.is_none() && p.items.is_empty()));
    // A Status (or any object) where a list was asked for is no list.
    assert!(decode_list(&status(410, "Expired", "too old"), decode_obj, &keep).is_err());
}

#[test]
fn an_error_body_reads_as_its_status() {
    let body = status(410, "Expired", "The provided continue parameter is too old");
    let Some(s) = error_status(&body) else {
        panic!("a Status")
    };
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
    assert!(s.message.contains("too old"));
    assert!(s.is_failure());
    assert!(error_status(&envelope("Pod", item("a", "1"))).is_none());
    assert!(error_status(b"not protobuf").is_none());
}

#[test]
fn watch_frames_split_like_json_lines() {
    let added = input(&frame("ADDED", envelope("Pod", item("a", "5"))));
    assert!(
        matches!(&added, WatchInput::Object(WatchEventKind::Added, Ok(o)) if o.data == "a@5"),
        "{added:?}"
    );
    let deleted = input(&frame("DELETED", envelope("Pod", item("a", "6"))));
    assert!(matches!(
        deleted,
        WatchInput::Object(WatchEventKind::Deleted, Ok(_))
    ));

    // A bookmark: an object of the kind with only its resourceVersion.
    let bookmark = input(&frame("BOOKMARK", envelope("Pod", meta("", "", "", "12"))));
    assert!(matches!(bookmark, WatchInput::Bookmark(ref rv) if rv == "12"));
    let no_rv = input(&frame("BOOKMARK", envelope("Pod", meta("", "", "", ""))));
    assert!(matches!(no_rv, WatchInput::Unrecognised(_)));

    let error = input(&frame(
        "ERROR",
        status(410, "Expired", "too old resource version"),
    ));
    assert!(
        matches!(&error, WatchInput::Error(s) if s.code == 410 && s.reason == "Expired"),
        "{error:?}"
    );

    // An object that does not decode keeps its key and RV.
    let bad = input(&frame("MODIFIED", envelope("Pod", item("bad", "7"))));
    let WatchInput::Object(WatchEventKind::Modified, Err(bad)) = bad else {
        panic!("an undecodable MODIFIED event")
    };
    let meta = bad.meta.map(|m| (m.key, m.resource_version));
    assert_eq!(meta, Some((key("bad"), "7".to_owned())));

    // An object without the envelope: undecodable, nothing known of it.
    let bare = input(&frame("ADDED", item("a", "5")));
    assert!(matches!(
        bare,
        WatchInput::Object(WatchEventKind::Added, Err(Undecodable { meta: None, .. }))
    ));
    assert!(matches!(
        input(&frame("FOO", envelope("Pod", item("a", "5")))),
        WatchInput::Unrecognised(_)
    ));
    assert!(matches!(
        parse_watch_frame(&[0xff, 0xff], |_| -> Result<Obj, Undecodable> {
            panic!("no object")
        }),
        WatchInput::Unrecognised(_)
    ));
}

/// The same events, once as JSON lines and once as protobuf frames, leave
/// two state machines in the same state with the same counts.
#[test]
fn the_state_machine_takes_a_frame_as_the_json_line_that_says_the_same() {
    let json_obj = |name: &str, rv: &str| {
        format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","uid":"u-{name}","resourceVersion":"{rv}"}}}}"#
        )
    };
    let events: Vec<(&str, String, Vec<u8>)> = vec![
        ("MODIFIED", json_obj("a", "210"), envelope("Pod", item("a", "210"))),
        ("ADDED", json_obj("bad", "220"), envelope("Pod", item("bad", "220"))),
        ("ADDED", json_obj("c", "230"), envelope("Pod", item("c", "230"))),
        (
            "BOOKMARK",
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"240"}}"#.to_owned(),
            envelope("Pod", meta("", "", "", "240")),
        ),
        (
            "ERROR",
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired"}"#
                .to_owned(),
            status(410, "Expired", ""),
        ),
    ];
    let decode_json = |raw: &serde_json::value::RawValue| -> Result<Obj, Undecodable> {
        let meta = RawMeta::read(raw);
        match meta {
            Some(m) if m.key.name != "bad" => Ok(Obj {
                data: format!("{}@{}", m.key.name, m.resource_version),
                key: m.key,
                uid: m.uid,
                rv: m.resource_version,
            }),
            meta => Err(Undecodable {
                meta,
                error: "bad object".to_owned(),
            }),
        }
    };
    let start = || Harness::synced_with(vec![obj("a", "u-a", "100")], "200");
    let mut by_json = start();
    let mut by_proto = start();
    for (kind, json, proto) in &events {
        let line = format!(r#"{{"type":"{kind}","object":{json}}}"#);
        let json_ends = by_json.core.on_line(&line, decode_json);
        let proto_ends = by_proto.core.on_input(input(&frame(kind, proto.clone())));
        assert_eq!(json_ends, proto_ends, "{kind}");
        assert_eq!(json_ends, *kind == "ERROR");
    }
    for h in [&by_json, &by_proto] {
        assert_eq!(h.count("undecodable"), 1);
        assert_eq!(h.restarts(RestartReason::Expired), 1);
        assert_eq!(h.data("a").as_deref(), Some("a@210"));
        assert_eq!(h.data("c").as_deref(), Some("c@230"));
        assert!(h.data("bad").is_none());
    }
    let state = |h: &Harness| {
        (
            h.core.machine().phase().clone(),
            h.store.read().highest_rv().map(str::to_owned),
            format!("{:?}", h.changes()),
        )
    };
    assert_eq!(state(&by_json), state(&by_proto));
    // Both relist from scratch after the 410.
    by_json.expect_list(None);
    by_proto.expect_list(None);
    // The JSON side of the comparison reads its lines as the driver does.
    assert!(matches!(
        parse_watch_line(r#"{"type":"ADDED","object":{"metadata""#),
        crate::decode::WatchLine::Truncated
    ));
}

#[test]
fn frames_are_read_whole_and_a_cut_one_ends_the_stream() {
    let one = frame("ADDED", envelope("Pod", item("a", "5")));
    let two = frame("ADDED", envelope("Pod", item("b", "6")));
    let mut stream = one.clone();
    stream.extend(&two);
    let read_all = |bytes: Vec<u8>| {
        block_on(async move {
            let mut reader = futures::io::Cursor::new(bytes);
            let mut frames = Vec::new();
            loop {
                match crate::driver::next_frame(&mut reader).await {
                    Ok(Some(frame)) => frames.push(frame.len()),
                    Ok(None) => return Ok(frames),
                    Err(err) => return Err((frames, err.kind())),
                }
            }
        })
    };
    assert_eq!(
        read_all(stream.clone()),
        Ok(vec![one.len() - 4, two.len() - 4])
    );
    // Cut inside the second frame's body, then inside its length prefix.
    let cut = stream[..stream.len() - 3].to_vec();
    assert_eq!(
        read_all(cut),
        Err((vec![one.len() - 4], std::io::ErrorKind::UnexpectedEof))
    );
    let cut = stream[..one.len() + 2].to_vec();
    assert_eq!(
        read_all(cut),
        Err((vec![one.len() - 4], std::io::ErrorKind::UnexpectedEof))
    );
    // A length no frame can have: the stream is not protobuf frames.
    let huge = [0x7f, 0xff, 0xff, 0xff, 1, 2, 3].to_vec();
    assert_eq!(
        read_all(huge),
        Err((vec![], std::io::ErrorKind::InvalidData))
    );
}
