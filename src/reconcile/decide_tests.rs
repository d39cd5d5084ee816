//! Every rule of what a reconcile may touch, one test each: scope,
//! ownership by managed-by, and the live read that comes before any
//! removal.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Value, json};

use super::*;
use crate::desired::scope::{ANNOTATION_ENDPOINTS, ANNOTATION_SELECTOR, LABEL_OPT_IN, OptInState};

const OWN: Existing = Existing {
    own: true,
    upstream: false,
};
const UPSTREAM: Existing = Existing {
    own: false,
    upstream: true,
};
const NOTHING: Existing = Existing {
    own: false,
    upstream: false,
};
const BOTH: [Controller; 2] = Controller::ALL;

fn service(labels: Value, annotations: Value, spec: Value) -> CachedService {
    CachedService::new(
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "labels": labels, "annotations": annotations},
            "spec": spec,
        }))
        .unwrap_or_else(|err| panic!("service: {err}")),
    )
}

fn plain() -> CachedService {
    service(json!({}), json!({}), json!({"selector": {"app": "web"}}))
}

fn selectorless() -> CachedService {
    service(json!({}), json!({}), json!({}))
}

/// Opted in; `with_selector`: the Service still has its spec.selector.
fn opted_in(with_selector: bool) -> CachedService {
    let spec = if with_selector {
        json!({"selector": {"app": "web"}})
    } else {
        json!({})
    };
    service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
        spec,
    )
}

fn observed<'a>(
    scope: Scope,
    controller: Controller,
    service: Option<&'a CachedService>,
    existing: Existing,
) -> Observed<'a> {
    Observed {
        scope,
        controller,
        service,
        read_live: false,
        existing,
        covered: false,
        misses_pods: false,
    }
}

fn live(o: Observed<'_>) -> Observed<'_> {
    Observed {
        read_live: true,
        ..o
    }
}

fn removes(decision: Decision<'_>) -> bool {
    matches!(decision, Decision::Remove { .. })
}

fn reconciles(decision: Decision<'_>) -> bool {
    matches!(decision, Decision::Reconcile(_))
}

/// Nothing is removed on the cache's word alone: a missing Service, an
/// opt-out or a takeover is read live first, in either scope, by either
/// controller.
#[test]
fn no_removal_without_a_live_read() {
    let cached = [opted_in(false), plain(), selectorless()];
    for scope in [Scope::All, Scope::OptIn] {
        for controller in BOTH {
            for existing in [
                OWN,
                UPSTREAM,
                Existing {
                    own: true,
                    upstream: true,
                },
            ] {
                for service in [None].into_iter().chain(cached.iter().map(Some)) {
                    let o = Observed {
                        covered: true,
                        ..observed(scope, controller, service, existing)
                    };
                    assert!(
                        !removes(decide(&o)),
                        "{scope:?} {controller:?} {existing:?} {:?}: {:?}",
                        service.map(|s| s.metadata.labels.clone()),
                        decide(&o)
                    );
                }
            }
        }
    }
}

#[test]
fn a_missing_service_is_read_live_and_only_then_its_objects_go() {
    for controller in BOTH {
        let o = observed(Scope::All, controller, None, UPSTREAM);
        assert_eq!(decide(&o), Decision::ReadService(Read::ServiceMissing));
        assert_eq!(
            decide(&live(o)),
            Decision::Remove {
                why: Removal::ServiceGone,
                managers: Managers::OWN_AND_UPSTREAM
            }
        );
        let o = observed(Scope::All, controller, None, NOTHING);
        assert_eq!(decide(&o), Decision::Idle(Idle::NoService));
    }
}

/// In opt-in scope upstream's controllers still run: what they made for a
/// Service the cache lacks is theirs, whatever a read says.
#[test]
fn opt_in_scope_never_removes_upstreams_objects_of_a_missing_service() {
    for controller in BOTH {
        let o = observed(Scope::OptIn, controller, None, UPSTREAM);
        assert_eq!(decide(&o), Decision::Idle(Idle::NoService));
        assert_eq!(decide(&live(o)), Decision::Idle(Idle::NoService));
        let o = observed(Scope::OptIn, controller, None, OWN);
        assert_eq!(
            decide(&live(o)),
            Decision::Remove {
                why: Removal::ServiceGone,
                managers: Managers::OWN
            }
        );
    }
}

/// A Service that did not opt in is never written, and nothing but our own
/// leftovers of it is removed.
#[test]
fn opt_in_scope_never_touches_a_service_that_did_not_opt_in() {
    for svc in [plain(), selectorless()] {
        for controller in BOTH {
            for existing in [NOTHING, UPSTREAM] {
                let o = observed(Scope::OptIn, controller, Some(&svc), existing);
                assert_eq!(decide(&o), Decision::Idle(Idle::NotHandled));
                let o = Observed {
                    covered: true,
                    ..live(o)
                };
                assert_eq!(decide(&o), Decision::Idle(Idle::NotHandled));
            }
        }
    }
}

/// All scope leaves a Service without a selector alone: its Endpoints
/// belong to users (and ours, if it had one before, stay frozen as
/// upstream's would).
#[test]
fn all_scope_never_touches_a_selectorless_service() {
    let svc = selectorless();
    for controller in BOTH {
        for existing in [NOTHING, OWN, UPSTREAM] {
            let o = observed(Scope::All, controller, Some(&svc), existing);
            assert_eq!(decide(&live(o)), Decision::Idle(Idle::NotHandled));
        }
    }
}

/// Our slices of an opted-out Service are kept current, with no read and no
/// deadline, until upstream's cover them; only then a live read, and they
/// go. Our Endpoints are kept current until upstream rewrites them, and
/// never removed.
#[test]
fn an_opt_out_keeps_ours_current_until_upstream_covers_them() {
    let svc = plain();
    let o = observed(Scope::OptIn, Controller::Endpointslices, Some(&svc), OWN);
    let Decision::Reconcile(managed) = decide(&o) else {
        panic!("kept current: {:?}", decide(&o));
    };
    assert_eq!(managed.managers, Managers::OWN);
    assert_eq!(managed.opt_in, Some(OptInState::OptingOut));
    let covered = Observed { covered: true, ..o };
    assert_eq!(decide(&covered), Decision::ReadService(Read::OptOut));
    assert_eq!(
        decide(&live(covered)),
        Decision::Remove {
            why: Removal::OptedOut,
            managers: Managers::OWN
        }
    );
    let o = observed(Scope::OptIn, Controller::Endpoints, Some(&svc), OWN);
    for o in [
        o,
        Observed {
            covered: true,
            ..live(o)
        },
    ] {
        assert!(reconciles(decide(&o)), "{:?}", decide(&o));
    }
}

/// A label removed from a Service without a selector leaves nothing but the
/// annotation to publish from: publishing goes on, and nobody else would.
/// Only the annotation gone too abandons the opt-in, and then ours go once
/// a live read agrees.
#[test]
fn a_removed_label_keeps_publishing_until_the_annotation_goes_too() {
    let label_removed = service(
        json!({}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#}),
        json!({}),
    );
    for controller in BOTH {
        for existing in [OWN, UPSTREAM] {
            let o = observed(Scope::OptIn, controller, Some(&label_removed), existing);
            assert!(!removes(decide(&o)));
            let Decision::Reconcile(managed) = decide(&live(o)) else {
                panic!("{controller:?} {existing:?}: {:?}", decide(&live(o)));
            };
            assert_eq!(managed.opt_in, Some(OptInState::LabelRemoved));
        }
        let abandoned = selectorless();
        let o = observed(Scope::OptIn, controller, Some(&abandoned), OWN);
        assert_eq!(decide(&o), Decision::ReadService(Read::Abandoned));
        assert_eq!(
            decide(&live(o)),
            Decision::Remove {
                why: Removal::Abandoned,
                managers: Managers::OWN
            }
        );
    }
}

/// A takeover whose selector would drop ready endpoints of live pods
/// upstream publishes leaves upstream's objects serving.
#[test]
fn a_takeover_that_misses_pods_freezes() {
    let svc = opted_in(false);
    for controller in BOTH {
        let o = Observed {
            misses_pods: true,
            ..observed(Scope::OptIn, controller, Some(&svc), UPSTREAM)
        };
        assert_eq!(decide(&o), Decision::Frozen(Invalid::SelectorMissesPods));
        assert_eq!(
            decide(&live(o)),
            Decision::Frozen(Invalid::SelectorMissesPods)
        );
        let taken = Observed { existing: OWN, ..o };
        assert!(
            reconciles(decide(&taken)),
            "nothing of upstream's left: no check"
        );
    }
}

#[test]
fn opt_in_states_follow_the_service_and_the_decision() {
    let states = |svc: &CachedService, existing: Existing| {
        BOTH.map(|controller| {
            let o = observed(Scope::OptIn, controller, Some(svc), existing);
            opt_in_status(Some(svc), Scope::OptIn, &decide(&o)).map(Status::state)
        })
    };
    let s = Some;
    assert_eq!(
        states(&opted_in(false), OWN),
        [s(OptInState::Protecting); 2]
    );
    assert_eq!(
        states(&opted_in(true), UPSTREAM),
        [s(OptInState::BesideUpstream); 2]
    );
    assert_eq!(
        states(&plain(), OWN),
        [s(OptInState::OptingOut); 2],
        "ours still there"
    );
    assert_eq!(
        states(&plain(), UPSTREAM),
        [None, None],
        "an ordinary Service"
    );
    assert_eq!(states(&selectorless(), OWN), [None, None], "abandoned");
    let differs = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"other"}"#}),
        json!({"selector": {"app": "web"}}),
    );
    assert_eq!(states(&differs, UPSTREAM), [s(OptInState::Frozen); 2]);
}

/// A live read that finds the Service opted in again after all (the cache
/// was stale) removes nothing.
#[test]
fn an_opt_out_the_api_does_not_confirm_removes_nothing() {
    let stale = plain();
    let o = Observed {
        covered: true,
        ..observed(Scope::OptIn, Controller::Endpointslices, Some(&stale), OWN)
    };
    assert_eq!(decide(&o), Decision::ReadService(Read::OptOut));
    let current = opted_in(true);
    let read = Observed {
        service: Some(&current),
        covered: true,
        ..live(o)
    };
    assert!(reconciles(decide(&read)));
}

#[test]
fn invalid_opt_in_freezes_whatever_exists() {
    let broken = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: "{}"}),
        json!({}),
    );
    for controller in BOTH {
        for existing in [NOTHING, OWN, UPSTREAM] {
            let o = observed(Scope::OptIn, controller, Some(&broken), existing);
            assert_eq!(decide(&o), Decision::Frozen(Invalid::SelectorEmpty));
            assert_eq!(decide(&live(o)), Decision::Frozen(Invalid::SelectorEmpty));
        }
    }
}

/// While an opted-in Service keeps its selector, upstream's Endpoints
/// controller writes its Endpoints and we publish slices beside upstream's.
#[test]
fn with_its_selector_an_opted_in_service_shares_with_upstream() {
    let svc = opted_in(true);
    for existing in [NOTHING, OWN, UPSTREAM] {
        let o = observed(Scope::OptIn, Controller::Endpoints, Some(&svc), existing);
        if existing == OWN {
            assert!(
                reconciles(decide(&o)),
                "ours, from before the selector came back, kept current"
            );
        } else {
            assert_eq!(decide(&o), Decision::Idle(Idle::LeftToUpstream));
        }
        let o = observed(
            Scope::OptIn,
            Controller::Endpointslices,
            Some(&svc),
            existing,
        );
        let Decision::Reconcile(managed) = decide(&o) else {
            panic!("slices are reconciled: {:?}", decide(&o));
        };
        assert_eq!(
            managed.managers,
            Managers::OWN,
            "upstream's slices stay upstream's"
        );
    }
}

/// Without its selector, upstream's frozen slices are taken over once a
/// live read agrees; the Endpoints are simply written (no removal).
#[test]
fn without_its_selector_an_opted_in_service_is_taken_over_after_a_read() {
    let svc = opted_in(false);
    let o = observed(
        Scope::OptIn,
        Controller::Endpointslices,
        Some(&svc),
        UPSTREAM,
    );
    assert_eq!(decide(&o), Decision::ReadService(Read::Takeover));
    let Decision::Reconcile(managed) = decide(&live(o)) else {
        panic!("reconciled after the read");
    };
    assert_eq!(managed.managers, Managers::OWN_AND_UPSTREAM);
    let o = observed(Scope::OptIn, Controller::Endpointslices, Some(&svc), OWN);
    assert!(reconciles(decide(&o)), "only our own slices: no read");
    let o = observed(Scope::OptIn, Controller::Endpoints, Some(&svc), UPSTREAM);
    assert!(reconciles(decide(&o)));
}

/// All scope takes upstream's slices as its own without reading: ours carry
/// upstream's value by default, and a read on every reconcile would be waste.
#[test]
fn all_scope_reconciles_without_reads() {
    let svc = plain();
    for controller in BOTH {
        for existing in [NOTHING, OWN, UPSTREAM] {
            let o = observed(Scope::All, controller, Some(&svc), existing);
            assert!(reconciles(decide(&o)), "{controller:?} {existing:?}");
        }
    }
}

#[test]
fn endpoints_turned_off_remove_only_what_upstream_or_we_left() {
    let svc = service(
        json!({LABEL_OPT_IN: "true"}),
        json!({ANNOTATION_SELECTOR: r#"{"app":"web"}"#, ANNOTATION_ENDPOINTS: "false"}),
        json!({}),
    );
    let o = observed(Scope::OptIn, Controller::Endpoints, Some(&svc), NOTHING);
    assert_eq!(decide(&live(o)), Decision::Idle(Idle::EndpointsOff));
    for existing in [OWN, UPSTREAM] {
        let o = observed(Scope::OptIn, Controller::Endpoints, Some(&svc), existing);
        assert_eq!(decide(&o), Decision::ReadService(Read::Takeover));
        assert_eq!(
            decide(&live(o)),
            Decision::Remove {
                why: Removal::EndpointsOff,
                managers: Managers::OWN_AND_UPSTREAM
            }
        );
    }
    let o = observed(Scope::OptIn, Controller::Endpointslices, Some(&svc), OWN);
    assert!(reconciles(decide(&o)), "its slices are still written");
}

fn named<'a>(name: &'a str, uid: &'a str) -> NamedPod<'a> {
    NamedPod { name, uid }
}

fn pod_info(name: &str, uid: &str, app: &str, node: Option<&str>) -> PodInfo {
    crate::desired::PodFields {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
        resource_version: "1".into(),
        labels: std::collections::BTreeMap::from([("app".to_string(), app.to_string())]),
        node_name: node.map(str::to_owned),
        ..crate::desired::PodFields::default()
    }
    .pack()
}

/// A pod our objects name is read live before its address goes only when
/// the cache lost it through a DELETE of that same incarnation; once, and
/// never when the selection still has it.
#[test]
fn pods_are_read_before_their_addresses_go_only_after_a_watch_delete() {
    let selected = HashSet::from(["a"]);
    let tombstones = |name: &str| match name {
        "b" => Some("b-1".to_string()),
        "c" => Some("c-old".to_string()),
        "a" => Some("a-1".to_string()),
        _ => None,
    };
    let out = pods_to_confirm(
        [
            named("a", "a-1"),
            named("b", "b-1"),
            named("b", "b-1"),
            named("c", "c-2"),
            named("d", "d-1"),
        ],
        &selected,
        tombstones,
    );
    assert_eq!(
        out,
        [named("b", "b-1")],
        "selected (a), another incarnation's tombstone (c), no tombstone (d): no read"
    );
}

#[test]
fn a_pod_read_keeps_its_address_only_for_the_same_selected_pod() {
    let selector = std::collections::BTreeMap::from([("app".to_string(), "web".to_string())]);
    let same = pod_info("b", "b-1", "web", None);
    assert_eq!(pod_verdict(Some(&same), "b-1", &selector), PodVerdict::Keep);
    let relabelled = pod_info("b", "b-1", "other", None);
    assert_eq!(
        pod_verdict(Some(&relabelled), "b-1", &selector),
        PodVerdict::Unselected
    );
    let replaced = pod_info("b", "b-2", "web", None);
    assert_eq!(
        pod_verdict(Some(&replaced), "b-1", &selector),
        PodVerdict::Gone,
        "a new pod of the same name is not the one published"
    );
    assert_eq!(pod_verdict(None, "b-1", &selector), PodVerdict::Gone);
}

/// A Node the cache lacks is read live before the endpoints of its pods
/// leave the slices, but only for pods the slices publish now: one never
/// published is left out as upstream leaves it, without a read.
#[test]
fn nodes_are_read_only_for_published_pods_on_them() {
    let pods = [
        pod_info("a", "a-1", "web", Some("n1")),
        pod_info("b", "b-1", "web", Some("n2")),
        pod_info("c", "c-1", "web", Some("n2")),
        pod_info("d", "d-1", "web", Some("")),
        pod_info("e", "e-1", "web", Some("n3")),
    ];
    let unknown = BTreeSet::from(["a", "b", "c", "d"]);
    let published = BTreeSet::from(["a", "c", "d", "e"]);
    assert_eq!(
        nodes_to_confirm(&unknown, &published, pods.iter()),
        ["n1", "n2"],
        "n3's pod is on a known Node; d has no Node; each Node once"
    );
}

#[test]
fn a_takeover_keeps_only_live_pods_the_selector_selects() {
    let selector = std::collections::BTreeMap::from([("app".to_string(), "web".to_string())]);
    let pods = [
        pod_info("a", "a-1", "web", None),
        pod_info("b", "b-1", "wbe", None),
        pod_info("c", "c-2", "other", None),
    ];
    let alive = |pod: NamedPod<'_>| {
        pods.iter()
            .find(|p| p.name() == pod.name && p.uid() == pod.uid)
            .cloned()
            .map(std::sync::Arc::new)
    };
    let published = [
        named("a", "a-1"),
        named("b", "b-1"),
        named("b", "b-1"),
        named("c", "c-1"),
        named("gone", "g-1"),
    ];
    assert_eq!(
        pods_missed(published, &selector, alive),
        ["b"],
        "a is selected; c's published incarnation and gone are no more"
    );
}
