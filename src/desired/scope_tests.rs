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

/// [`Handling`], owning what it borrows, for comparisons.
#[derive(Debug, PartialEq)]
enum Seen {
    NotHandled,
    Frozen(Invalid),
    OptedOut(BTreeMap<String, String>),
    Abandoned,
    Managed {
        selector: BTreeMap<String, String>,
        endpoints: EndpointsRole,
        state: Option<OptInState>,
    },
}

/// How `svc` is handled in opt-in scope.
fn opt_in_handling(svc: &Service) -> Seen {
    let opt_in = OptIn::of(svc);
    match handling(Scope::OptIn, svc, &opt_in) {
        Handling::NotHandled => Seen::NotHandled,
        Handling::Frozen(why) => Seen::Frozen(why),
        Handling::OptedOut(m) => {
            assert_eq!(m.managers, Managers::OWN, "an opt-out touches only ours");
            Seen::OptedOut(m.selector.clone())
        }
        Handling::Abandoned => Seen::Abandoned,
        Handling::Managed(m) => Seen::Managed {
            selector: m.selector.clone(),
            endpoints: m.endpoints,
            state: m.opt_in,
        },
    }
}

fn state_of(svc: &Service) -> Option<OptInState> {
    match opt_in_handling(svc) {
        Seen::Managed { state, .. } => state,
        _ => None,
    }
}

#[test]
fn the_label_says_in_or_out_and_anything_else_freezes() {
    let labelled = |value: &str| {
        service(
            json!({LABEL_OPT_IN: value}),
            json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
            json!({"selector": {"app": "web"}}),
        )
    };
    assert_eq!(
        opt_in_handling(&labelled("false")),
        Seen::OptedOut(app("web"))
    );
    assert_eq!(
        state_of(&labelled("true")),
        Some(OptInState::BesideUpstream)
    );
    for value in ["yes", "True", ""] {
        assert_eq!(
            opt_in_handling(&labelled(value)),
            Seen::Frozen(Invalid::LabelValue),
            "{value:?}"
        );
    }
}

#[test]
fn an_opted_in_service_without_a_usable_selector_is_invalid() {
    let no_annotation = service(json!({LABEL_OPT_IN: "true"}), json!({}), json!({}));
    assert_eq!(
        opt_in_handling(&no_annotation),
        Seen::Frozen(Invalid::SelectorMissing)
    );
    assert_eq!(
        opt_in_handling(&opted_in("app=web")),
        Seen::Frozen(Invalid::SelectorMalformed)
    );
    assert_eq!(
        opt_in_handling(&opted_in("{}")),
        Seen::Frozen(Invalid::SelectorEmpty)
    );
    let external = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
        json!({"type": "ExternalName", "externalName": "example.invalid"}),
    );
    assert_eq!(
        opt_in_handling(&external),
        Seen::Frozen(Invalid::ExternalName)
    );
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
    let role = |svc: &Service| match opt_in_handling(svc) {
        Seen::Managed { endpoints, .. } => Some(endpoints),
        _ => None,
    };
    assert_eq!(role(&with("false")), Some(EndpointsRole::Remove));
    assert_eq!(role(&with("true")), Some(EndpointsRole::Write));
    assert_eq!(
        opt_in_handling(&with("no")),
        Seen::Frozen(Invalid::EndpointsValue)
    );
}

/// Every combination of label, annotation and spec.selector people and
/// GitOps tools leave behind, and what it means.
#[test]
fn every_partial_opt_in_has_a_meaning() {
    let web = || json!({"selector": {"app": "web"}});
    let annotation = json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#});
    let on = json!({LABEL_OPT_IN: "true"});
    // The label removed, the selector not back: still published from the
    // annotation (nobody else would).
    let label_removed = service(json!({}), annotation.clone(), json!({}));
    assert_eq!(state_of(&label_removed), Some(OptInState::LabelRemoved));
    // Label and annotation removed, no selector: abandoned.
    assert_eq!(
        opt_in_handling(&service(json!({}), json!({}), json!({}))),
        Seen::Abandoned
    );
    // The selector back, the label still on: beside upstream.
    assert_eq!(
        state_of(&service(on.clone(), annotation.clone(), web())),
        Some(OptInState::BesideUpstream)
    );
    // A selector back that differs from the annotation freezes.
    assert_eq!(
        opt_in_handling(&service(
            on.clone(),
            annotation.clone(),
            json!({"selector": {"app": "other"}})
        )),
        Seen::Frozen(Invalid::SelectorDiffers)
    );
    // Label off with the selector back: an opt-out, from spec.selector.
    assert_eq!(
        opt_in_handling(&service(
            json!({}),
            json!({ANNOTATION_SELECTOR: r#"{"app":"old"}"#}),
            web(),
        )),
        Seen::OptedOut(app("web"))
    );
    // A broken annotation with the label off and no selector freezes
    // rather than abandons.
    assert_eq!(
        opt_in_handling(&service(
            json!({}),
            json!({ANNOTATION_SELECTOR: "{"}),
            json!({})
        )),
        Seen::Frozen(Invalid::SelectorMalformed)
    );
    // ExternalName without the label: nothing to publish, ours go.
    assert_eq!(
        opt_in_handling(&service(
            json!({}),
            annotation,
            json!({"type": "ExternalName", "externalName": "example.invalid"})
        )),
        Seen::Abandoned
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
    assert_eq!(managed.opt_in, None);

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
    assert!(!opt_in.is_marked());
    assert!(matches!(
        handling(Scope::OptIn, &plain, &opt_in),
        Handling::OptedOut(_)
    ));
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
    assert_eq!(managed.opt_in, Some(OptInState::BesideUpstream));
    assert!(!managed.takes_over());

    let taken = opted_in(r#"{"app":"web"}"#);
    let opt_in = OptIn::of(&taken);
    let Handling::Managed(managed) = handling(Scope::OptIn, &taken, &opt_in) else {
        panic!("opted in");
    };
    assert_eq!(managed.endpoints, EndpointsRole::Write);
    assert_eq!(managed.managers, Managers::OWN_AND_UPSTREAM);
    assert!(managed.takes_over());

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

#[test]
fn opt_in_states_are_distinct_metric_labels() {
    let labels: std::collections::HashSet<_> =
        OptInState::ALL.iter().map(|s| s.metric_label()).collect();
    assert_eq!(labels.len(), OptInState::ALL.len());
}
