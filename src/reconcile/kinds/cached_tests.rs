use k8s_openapi::api::core::v1::Endpoints;

use super::packed::TargetRefUid;
use super::*;
use crate::desired;
use crate::wire::EndpointsWire;

fn endpoints() -> Endpoints {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "namespace": "ns", "name": "web", "uid": "ep-uid", "resourceVersion": "12",
            "labels": {"endpoints.kubernetes.io/managed-by": "endpoint-controller"},
            "annotations": {"x": "y"},
            "managedFields": [{"manager": "kcm", "operation": "Update", "fieldsV1": {"f:subsets": {}}}],
        },
        "subsets": [{
            "addresses": [{"ip": "10.0.0.1", "nodeName": "n",
                "targetRef": {"kind": "Pod", "namespace": "ns", "name": "a", "uid": "pod-\"a\""}}],
            "notReadyAddresses": [{"ip": "10.0.0.2",
                "targetRef": {"kind": "Pod", "namespace": "ns", "name": "b", "uid": "pod-b"}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }],
    }))
    .expect("endpoints")
}

/// What all scope takes as ours.
const ALL_SCOPE: crate::desired::scope::Managers =
    crate::desired::scope::Managers::OWN_AND_UPSTREAM;

#[test]
fn cached_endpoints_decode_to_the_object_without_managed_fields() {
    let cached = CachedEndpoints::new(endpoints()).expect("encodes");
    let mut want = endpoints();
    want.metadata.managed_fields = None;
    assert_eq!(cached.decode().expect("decodes"), want);
    assert_eq!(cached.key(), ObjectKey::new("ns", "web"));
    assert_eq!((cached.uid(), cached.resource_version()), ("ep-uid", "12"));
    assert_eq!(cached.managed_by(), Some(desired::UPSTREAM_MANAGER));
    assert!(ALL_SCOPE.endpoints(cached.managed_by()));

    let mut bare = endpoints();
    bare.subsets = None;
    bare.metadata.labels = None;
    let cached = CachedEndpoints::new(bare).expect("encodes");
    assert_eq!(cached.decode().expect("decodes").subsets, None);
    assert!(
        !ALL_SCOPE.endpoints(cached.managed_by()),
        "no managed-by label"
    );

    // Both values endpoints-guard may write (--managed-by upstream or own) are
    // its own, whichever it writes now; any other is left alone.
    for (manager, deletable) in [
        (desired::UPSTREAM_MANAGER, true),
        (desired::MANAGER, true),
        ("someone-else", false),
    ] {
        let mut ep = endpoints();
        ep.metadata.labels =
            Some([(desired::LABEL_MANAGED_BY.to_string(), manager.to_string())].into());
        let cached = CachedEndpoints::new(ep).expect("encodes");
        assert_eq!(
            ALL_SCOPE.endpoints(cached.managed_by()),
            deletable,
            "{manager}"
        );
    }
}

#[test]
fn target_refs_are_found_by_uid_in_both_address_lists() {
    let cached = CachedEndpoints::new(endpoints()).expect("encodes");
    let cases = [
        ("ready address, quotes escaped", "pod-\"a\"", true),
        ("not-ready address", "pod-b", true),
        ("the Endpoints' own uid is no targetRef", "ep-uid", false),
        ("a prefix of a uid", "pod-", false),
        ("unknown", "pod-c", false),
    ];
    for (case, uid, want) in cases {
        assert_eq!(cached.references(&TargetRefUid::new(uid)), want, "{case}");
    }
}

/// The Endpoints as text, read as the watch reads them.
fn wire(text: &str) -> CachedEndpoints {
    let wire: EndpointsWire = serde_json::from_str(text).expect("wire");
    CachedEndpoints::from_wire(wire).expect("packs")
}

#[test]
fn endpoints_from_the_wire_pack_like_decoded_ones() {
    let plain = {
        let mut ep = endpoints();
        let refs = ep.subsets.iter_mut().flatten().flat_map(|s| {
            s.addresses
                .iter_mut()
                .flatten()
                .chain(s.not_ready_addresses.iter_mut().flatten())
        });
        for address in refs {
            if let Some(r) = address.target_ref.as_mut() {
                r.uid = r.uid.as_ref().map(|uid| uid.replace('"', ""));
            }
        }
        ep
    };
    for (case, ep) in [("escaped uid", endpoints()), ("plain", plain)] {
        let typed = CachedEndpoints::new(ep.clone()).expect("encodes");
        let compact = serde_json::to_string(&ep).expect("json");
        let pretty = serde_json::to_string_pretty(&ep).expect("json");
        for (layout, text) in [("compact", compact), ("pretty", pretty)] {
            let cached = wire(&text);
            let what = format!("{case}, {layout}");
            assert_eq!(
                cached.decode().expect("decodes"),
                typed.decode().expect("decodes"),
                "{what}"
            );
            assert_eq!(cached.key(), typed.key(), "{what}");
            assert_eq!(cached.uid(), typed.uid(), "{what}");
            assert_eq!(
                cached.resource_version(),
                typed.resource_version(),
                "{what}"
            );
            assert_eq!(cached.managed_by(), typed.managed_by(), "{what}");
            assert_eq!(
                cached.packed.object_json, typed.packed.object_json,
                "{what}"
            );
            for uid in ["pod-\"a\"", "pod-a", "pod-b", "ep-uid", "pod-", "pod-c"] {
                let uid = TargetRefUid::new(uid);
                assert_eq!(cached.references(&uid), typed.references(&uid), "{what}");
            }
        }
    }
    // Escapes or whitespace: the subsets are written again, as decoded ones are.
    let typed = CachedEndpoints::new(endpoints()).expect("encodes");
    let pretty = wire(&serde_json::to_string_pretty(&endpoints()).expect("json"));
    assert_eq!(pretty, typed);

    let bare =
        wire(r#"{"metadata":{"namespace":"ns","name":"web","uid":"u","resourceVersion":"1"}}"#);
    assert_eq!(bare.decode().expect("decodes").subsets, None);
    let null = wire(r#"{"metadata":{"namespace":"ns","name":"web"},"subsets":null}"#);
    assert_eq!(null.decode().expect("decodes").subsets, None);
    let bad: EndpointsWire =
        serde_json::from_str(r#"{"metadata":{"name":"web"},"subsets":[{"addresses": 7}]}"#)
            .expect("wire");
    assert!(
        CachedEndpoints::from_wire(bad).is_none(),
        "subsets that are written again must decode"
    );
}
