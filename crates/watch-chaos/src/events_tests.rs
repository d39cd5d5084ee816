use serde_json::json;

use super::*;

fn ev(kind: &str, name: &str, rv: &str) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(&json!({
        "type": kind,
        "object": {"kind": "Service", "metadata": {"namespace": "a", "name": name, "uid": "u1", "resourceVersion": rv}},
    }))
    .expect("serializes");
    bytes.push(b'\n');
    bytes
}

fn lines(step: &Step) -> Vec<(String, String, String)> {
    step.out
        .iter()
        .filter_map(|o| match o {
            Out::Line(l) => parse(l),
            _ => None,
        })
        .map(|e| {
            (
                event_type(&e).to_string(),
                event_key(&e).unwrap_or_default(),
                object_rv(&e).unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn t(kind: &str, key: &str, rv: &str) -> (String, String, String) {
    (kind.into(), key.into(), rv.into())
}

#[test]
fn untouched_without_faults() {
    let mut tr = Transformer::default();
    let step = tr.on_event(
        "services",
        &ev("ADDED", "web", "5"),
        StreamFaults::default(),
        None,
    );
    assert_eq!(step.out, vec![Out::Line(ev("ADDED", "web", "5"))]);
    assert!(step.notes.is_empty());
    // Not JSON: passed through as is.
    let step = tr.on_event("services", b"garbage", StreamFaults::default(), None);
    assert_eq!(step.out, vec![Out::Line(b"garbage\n".to_vec())]);
}

#[test]
fn old_delete_rv_rewrites_and_ends_the_stream() {
    let faults = StreamFaults {
        old_delete_rv: true,
        ..Default::default()
    };
    let mut tr = Transformer::default();
    let step = tr.on_event("services", &ev("DELETED", "old", "90"), faults, Some("7"));
    assert_eq!(lines(&step), vec![t("DELETED", "a/old", "7")]);
    assert_eq!(step.out.last(), Some(&Out::Close));
    assert_eq!(step.fake_rv.as_deref(), Some("7"));
    // Unknown previous RV, or one not older: left alone.
    let step = tr.on_event("services", &ev("DELETED", "x", "90"), faults, None);
    assert_eq!(lines(&step), vec![t("DELETED", "a/x", "90")]);
    assert_eq!(step.fake_rv, None);
    let step = tr.on_event("services", &ev("DELETED", "x", "90"), faults, Some("95"));
    assert_eq!(step.fake_rv, None);
    // Other events untouched.
    let step = tr.on_event("services", &ev("MODIFIED", "x", "91"), faults, Some("3"));
    assert_eq!(lines(&step), vec![t("MODIFIED", "a/x", "91")]);
}

#[test]
fn dropped_deletes_and_prevkv_nil() {
    let mut tr = Transformer::default();
    let drop = StreamFaults {
        drop_deletes: true,
        ..Default::default()
    };
    let step = tr.on_event("pods", &ev("DELETED", "p", "9"), drop, Some("3"));
    assert!(step.out.is_empty());
    assert_eq!(step.notes, vec!["deletes_dropped"]);
    let step = tr.on_event("pods", &ev("ADDED", "q", "10"), drop, None);
    assert_eq!(lines(&step).len(), 1);
    let mut terminating = parse(&ev("MODIFIED", "q", "11")).expect("json");
    terminating["object"]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let step = tr.on_event("pods", &line(&terminating), drop, None);
    assert!(
        step.out.is_empty(),
        "the start of a deletion is dropped too"
    );

    let nil = StreamFaults {
        prevkv_nil: true,
        ..Default::default()
    };
    let step = tr.on_event("services", &ev("DELETED", "web", "12"), nil, Some("3"));
    let Some(Out::Line(error)) = step.out.first() else {
        panic!("an error line first: {step:?}");
    };
    let error = parse(error).expect("json");
    assert_eq!(event_type(&error), "ERROR");
    assert_eq!(error["object"]["code"], 500);
    let message = error["object"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("PrevKv=nil"), "{message}");
    assert!(message.contains("services/a/web"), "{message}");
    assert!(message.contains("modRevision=12"), "{message}");
    assert_eq!(step.out.last(), Some(&Out::Close));
}

#[test]
fn duplicate_and_reorder() {
    let mut tr = Transformer::default();
    let dup = StreamFaults {
        duplicate: true,
        ..Default::default()
    };
    let step = tr.on_event("pods", &ev("MODIFIED", "p", "4"), dup, None);
    assert_eq!(
        lines(&step),
        vec![t("MODIFIED", "a/p", "4"), t("MODIFIED", "a/p", "4")]
    );

    let re = StreamFaults {
        reorder: true,
        ..Default::default()
    };
    let mut tr = Transformer::default();
    let first = tr.on_event("pods", &ev("MODIFIED", "p", "5"), re, None);
    assert!(first.out.is_empty());
    assert!(tr.holding());
    let second = tr.on_event("pods", &ev("MODIFIED", "p", "6"), re, None);
    assert_eq!(
        lines(&second),
        vec![t("MODIFIED", "a/p", "6"), t("MODIFIED", "a/p", "5")]
    );
    assert!(!tr.holding());
    let third = tr.on_event("pods", &ev("MODIFIED", "p", "7"), re, None);
    assert!(third.out.is_empty());
    assert_eq!(tr.take_held(), Some(ev("MODIFIED", "p", "7")));
    // Bookmarks are never held.
    let mark = tr.on_event("pods", &ev("BOOKMARK", "", "8"), re, None);
    assert_eq!(mark.out.len(), 1);
}

#[test]
fn cut_mid_event() {
    let cut = StreamFaults {
        cut_after: Some(1),
        ..Default::default()
    };
    let mut tr = Transformer::default();
    let first = tr.on_event("pods", &ev("ADDED", "p", "4"), cut, None);
    assert_eq!(lines(&first).len(), 1);
    let second = tr.on_event("pods", &ev("ADDED", "q", "5"), cut, None);
    let [Out::Partial(part)] = second.out.as_slice() else {
        panic!("a partial line: {second:?}");
    };
    assert!(!part.is_empty() && parse(part).is_none());
}

#[test]
fn helpers() {
    let mut buf = b"{\"a\":1}\n\n{\"b\"".to_vec();
    let got = split_lines(&mut buf);
    assert_eq!(got, vec![b"{\"a\":1}\n".to_vec()]);
    assert_eq!(buf, b"{\"b\"".to_vec());

    let list = json!({"items": [
        {"metadata": {"namespace": "a", "name": "x"}},
        {"metadata": {"namespace": "b", "name": "y"}},
    ]});
    let only_a = filter_list_namespace(&list, Some("a"));
    assert_eq!(only_a["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(filter_list_namespace(&list, None), list);

    let del = deleted_event(
        &json!({"metadata": {"name": "n", "resourceVersion": "9"}}),
        "3",
    );
    assert_eq!(object_rv(&del), Some("3"));
    assert_eq!(event_key(&del).as_deref(), Some("n"));
    assert_eq!(expired_event("3")["object"]["code"], 410);
}
