use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::*;

fn service(labels: Value, annotations: Value, spec: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap_or_else(|err| panic!("service: {err}"))
}

fn opted_in(selector: &str) -> Service {
    service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: selector}),
        json!({}),
    )
}

fn app(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), value.to_string())])
}

#[test]
fn the_selector_annotation_is_a_json_object_of_label_keys_and_values() {
    assert_eq!(parse_selector(r#"{"app":"web"}"#), Ok(app("web")));
    let two = parse_selector(r#"{"app.kubernetes.io/name":"web","tier":""}"#);
    assert_eq!(
        two.map(|s| s.len()),
        Ok(2),
        "prefixed keys and empty values"
    );
    for malformed in [
        "app=web",
        r#"["app","web"]"#,
        r#"{"app":1}"#,
        r#"{"app":null}"#,
        r#"{"app":"web""#,
        r#"{"":"web"}"#,
        r#"{"/app":"web"}"#,
        r#"{"Example.com/app":"web"}"#,
        r#"{"-app":"web"}"#,
        r#"{"app":"web!"}"#,
        r#"{"app":"-web"}"#,
        r#"{"a b":"web"}"#,
        "",
    ] {
        assert_eq!(
            parse_selector(malformed),
            Err(Invalid::SelectorMalformed),
            "{malformed:?}"
        );
    }
    let long = format!(r#"{{"app":"{}"}}"#, "a".repeat(64));
    assert_eq!(parse_selector(&long), Err(Invalid::SelectorMalformed));
    let longest = format!(r#"{{"app":"{}"}}"#, "a".repeat(63));
    assert!(parse_selector(&longest).is_ok());
    assert_eq!(parse_selector("{}"), Err(Invalid::SelectorEmpty));
    assert_eq!(parse_selector(" { } "), Err(Invalid::SelectorEmpty));
}

#[test]
fn the_label_says_in_or_out_and_anything_else_freezes() {
    let labelled = |value: &str| {
        service(
            json!({LABEL_OPT_IN: value}),
            json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
            json!({}),
        )
    };
    assert_eq!(
        OptIn::of(&service(json!({}), json!({}), json!({}))),
        OptIn::No
    );
    assert_eq!(OptIn::of(&labelled("false")), OptIn::No);
    assert_eq!(
        OptIn::of(&labelled("true")),
        OptIn::Yes {
            selector: app("web"),
            endpoints: true
        }
    );
    for value in ["yes", "True", ""] {
        assert_eq!(
            OptIn::of(&labelled(value)),
            OptIn::Invalid(Invalid::LabelValue),
            "{value:?}"
        );
    }
}

#[test]
fn an_opted_in_service_without_a_usable_selector_is_invalid() {
    let no_annotation = service(json!({LABEL_OPT_IN: "true"}), json!({}), json!({}));
    assert_eq!(
        OptIn::of(&no_annotation),
        OptIn::Invalid(Invalid::SelectorMissing)
    );
    assert_eq!(
        OptIn::of(&opted_in("app=web")),
        OptIn::Invalid(Invalid::SelectorMalformed)
    );
    assert_eq!(
        OptIn::of(&opted_in("{}")),
        OptIn::Invalid(Invalid::SelectorEmpty)
    );
    let external = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
        json!({"type": "ExternalName", "externalName": "example.invalid"}),
    );
    assert_eq!(OptIn::of(&external), OptIn::Invalid(Invalid::ExternalName));
}

#[test]
fn the_endpoints_annotation_turns_endpoints_off_per_service() {
    let with = |value: &str| {
        service(
            json!({LABEL_OPT_IN: "true"}),
            json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#, ANNOTATION_ENDPOINTS: value}),
            json!({}),
        )
    };
    assert_eq!(
        OptIn::of(&with("false")),
        OptIn::Yes {
            selector: app("web"),
            endpoints: false
        }
    );
    assert!(matches!(
        OptIn::of(&with("true")),
        OptIn::Yes {
            endpoints: true,
            ..
        }
    ));
    assert_eq!(
        OptIn::of(&with("no")),
        OptIn::Invalid(Invalid::EndpointsValue)
    );
}

#[test]
fn all_scope_handles_every_service_with_a_selector_and_nothing_else() {
    let plain = service(json!({}), json!({}), json!({"selector": {"app": "web"}}));
    let opt_in = OptIn::of(&plain);
    let Handling::Managed(managed) = handling(Scope::All, &plain, &opt_in) else {
        panic!("a selector Service is handled in all scope");
    };
    assert_eq!(managed.selector, &app("web"));
    assert_eq!(managed.endpoints, EndpointsRole::Write);
    assert_eq!(managed.managers, Managers::OWN_AND_UPSTREAM);
    assert!(!managed.opt_in);

    let selectorless = service(json!({}), json!({}), json!({}));
    let opt_in = OptIn::of(&selectorless);
    assert_eq!(
        handling(Scope::All, &selectorless, &opt_in),
        Handling::NotHandled
    );
    let external = service(
        json!({}),
        json!({}),
        json!({"type": "ExternalName", "selector": {"app": "web"}}),
    );
    let opt_in = OptIn::of(&external);
    assert_eq!(
        handling(Scope::All, &external, &opt_in),
        Handling::NotHandled
    );
    let everything = service(json!({}), json!({}), json!({"selector": {}}));
    let opt_in = OptIn::of(&everything);
    assert!(
        matches!(handling(Scope::All, &everything, &opt_in), Handling::Managed(m) if m.selector.is_empty()),
        "an empty spec.selector selects every pod, as upstream's"
    );
    // The opt-in annotations mean nothing in all scope.
    let annotated = opted_in(r#"{"app":"other"}"#);
    let opt_in = OptIn::of(&annotated);
    assert_eq!(
        handling(Scope::All, &annotated, &opt_in),
        Handling::NotHandled
    );
}

#[test]
fn opt_in_scope_never_handles_a_service_that_did_not_opt_in() {
    let plain = service(json!({}), json!({}), json!({"selector": {"app": "web"}}));
    let opt_in = OptIn::of(&plain);
    assert_eq!(handling(Scope::OptIn, &plain, &opt_in), Handling::OptedOut);
    let invalid = opted_in("{}");
    let opt_in = OptIn::of(&invalid);
    assert_eq!(
        handling(Scope::OptIn, &invalid, &opt_in),
        Handling::Frozen(Invalid::SelectorEmpty)
    );
}

/// While the Service keeps its selector upstream still writes: its
/// Endpoints are left to it and only our own slices are ours. Once the
/// selector is gone, upstream's frozen objects are ours to take over.
#[test]
fn opt_in_scope_takes_over_from_upstream_only_once_the_selector_is_gone() {
    let both = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
        json!({"selector": {"app": "web"}}),
    );
    let opt_in = OptIn::of(&both);
    let Handling::Managed(managed) = handling(Scope::OptIn, &both, &opt_in) else {
        panic!("opted in");
    };
    assert_eq!(managed.endpoints, EndpointsRole::LeaveToUpstream);
    assert_eq!(managed.managers, Managers::OWN);
    assert!(managed.opt_in);

    let taken = opted_in(r#"{"app":"web"}"#);
    let opt_in = OptIn::of(&taken);
    let Handling::Managed(managed) = handling(Scope::OptIn, &taken, &opt_in) else {
        panic!("opted in");
    };
    assert_eq!(managed.endpoints, EndpointsRole::Write);
    assert_eq!(managed.managers, Managers::OWN_AND_UPSTREAM);

    let no_endpoints = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#, ANNOTATION_ENDPOINTS: "false"}),
        json!({}),
    );
    let opt_in = OptIn::of(&no_endpoints);
    let Handling::Managed(managed) = handling(Scope::OptIn, &no_endpoints, &opt_in) else {
        panic!("opted in");
    };
    assert_eq!(managed.endpoints, EndpointsRole::Remove);
}

#[test]
fn ownership_never_covers_another_managers_objects() {
    use crate::desired::slices::UPSTREAM_SLICE_MANAGER;
    for managers in [Managers::OWN, Managers::OWN_AND_UPSTREAM] {
        for other in [
            None,
            Some(""),
            Some("endpointslicemirroring-controller.k8s.io"),
            Some("cilium"),
        ] {
            assert!(!managers.slices(other), "{managers:?} {other:?}");
            assert!(!managers.endpoints(other), "{managers:?} {other:?}");
        }
        assert!(managers.slices(Some(MANAGER)));
        assert!(managers.endpoints(Some(MANAGER)));
    }
    assert!(!Managers::OWN.slices(Some(UPSTREAM_SLICE_MANAGER)));
    assert!(!Managers::OWN.endpoints(Some(UPSTREAM_MANAGER)));
    assert!(Managers::OWN_AND_UPSTREAM.slices(Some(UPSTREAM_SLICE_MANAGER)));
    assert!(Managers::OWN_AND_UPSTREAM.endpoints(Some(UPSTREAM_MANAGER)));
    // Each manager value on its own kind only.
    assert!(!Managers::OWN_AND_UPSTREAM.slices(Some(UPSTREAM_MANAGER)));
    assert!(!Managers::OWN_AND_UPSTREAM.endpoints(Some(UPSTREAM_SLICE_MANAGER)));
    assert_eq!(Scope::OptIn.managers(), Managers::OWN);
    assert_eq!(Scope::All.managers(), Managers::OWN_AND_UPSTREAM);
}

#[test]
fn invalid_reasons_are_distinct_metric_labels() {
    let labels: std::collections::HashSet<_> =
        Invalid::ALL.iter().map(|i| i.metric_label()).collect();
    assert_eq!(labels.len(), Invalid::ALL.len());
}
