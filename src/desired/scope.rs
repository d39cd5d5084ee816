//! Which Services this controller handles (`--scope`), and how.
//!
//! In `all` scope every Service with a selector is handled, as
//! kube-controller-manager's controllers handle them (whose Endpoints and
//! slices controllers must then be turned off). In `opt-in` scope only the
//! Services that ask for it are, beside upstream's controllers: a Service
//! opts in with the label [`LABEL_OPT_IN`]` = "true"` and carries its
//! selector in the annotation [`ANNOTATION_SELECTOR`] (a JSON object, as
//! `kubectl get svc -o jsonpath='{.spec.selector}'` prints it). Once its
//! `spec.selector` is removed, upstream's controllers leave it alone
//! (a Service without a selector "is assumed to have an external process
//! managing its endpoints"); until then they publish beside it.
//!
//! Everything here is a function of one Service: the parse of its opt-in
//! ([`OptIn::of`], made once when the Service enters the cache) and what
//! that means for the controllers ([`handling`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

use super::slices::UPSTREAM_SLICE_MANAGER;
use super::{MANAGER, UPSTREAM_MANAGER};

/// The label that opts a Service in (`"true"`), or out (`"false"`, or no label).
pub const LABEL_OPT_IN: &str = "endpoints-guard/opt-in";
/// The annotation holding an opted-in Service's selector: a JSON object of
/// label keys to values, e.g. `{"app":"web"}`.
pub const ANNOTATION_SELECTOR: &str = "endpoints-guard/selector";
/// The annotation that turns the Endpoints of an opted-in Service off
/// (`"false"`; `"true"`, the default, writes them).
pub const ANNOTATION_ENDPOINTS: &str = "endpoints-guard/endpoints";
/// The label that keeps kube-controller-manager's mirroring controller from
/// mirroring Endpoints into slices (it acts on exactly `"true"`).
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";

/// Which Services the controllers handle (`--scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Scope {
    /// Every Service with a selector, in place of kube-controller-manager's
    /// Endpoints and EndpointSlice controllers (turn those off).
    #[default]
    All,
    /// Only Services labelled `endpoints-guard/opt-in=true`, beside
    /// kube-controller-manager's controllers.
    OptIn,
}

impl Scope {
    /// The bounded `scope` label value (also the flag value).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::OptIn => "opt-in",
        }
    }

    /// The managed-by values whose objects are ours to change and delete,
    /// for any Service: in `all` scope upstream's too (taken over); in
    /// `opt-in` scope only our own, since upstream's controllers still run.
    pub fn managers(self) -> Managers {
        match self {
            Scope::All => Managers::OWN_AND_UPSTREAM,
            Scope::OptIn => Managers::OWN,
        }
    }
}

/// The managed-by values whose Endpoints and slices a controller takes as
/// its own: to change, to delete, to guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Managers {
    own: bool,
    upstream: bool,
}

impl Managers {
    /// `endpoints-guard` only.
    pub const OWN: Managers = Managers {
        own: true,
        upstream: false,
    };
    /// kube-controller-manager's values only.
    pub const UPSTREAM: Managers = Managers {
        own: false,
        upstream: true,
    };
    /// No value.
    pub const NONE: Managers = Managers {
        own: false,
        upstream: false,
    };
    /// `endpoints-guard` and kube-controller-manager's values.
    pub const OWN_AND_UPSTREAM: Managers = Managers {
        own: true,
        upstream: true,
    };

    /// Whether objects labelled `endpoints-guard` are ours.
    pub fn own(self) -> bool {
        self.own
    }

    /// Whether objects labelled with kube-controller-manager's values are ours.
    pub fn upstream(self) -> bool {
        self.upstream
    }

    /// Whether Endpoints with this `endpoints.kubernetes.io/managed-by` are ours.
    pub fn endpoints(self, manager: Option<&str>) -> bool {
        match manager {
            Some(MANAGER) => self.own,
            Some(UPSTREAM_MANAGER) => self.upstream,
            _ => false,
        }
    }

    /// Whether slices with this `endpointslice.kubernetes.io/managed-by` are ours.
    pub fn slices(self, manager: Option<&str>) -> bool {
        match manager {
            Some(MANAGER) => self.own,
            Some(m) if m == UPSTREAM_SLICE_MANAGER => self.upstream,
            _ => false,
        }
    }
}

/// Why an opted-in Service cannot be handled: what is published for it is
/// left as it is until the Service is fixed. Each is a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Invalid {
    /// The opt-in label has a value other than "true" or "false".
    LabelValue,
    /// No selector annotation.
    SelectorMissing,
    /// The selector annotation is not a JSON object of strings, or a key or
    /// value is not a valid label key or value.
    SelectorMalformed,
    /// The selector annotation is `{}`: it would select every pod of the
    /// namespace, which is never what an opt-in means.
    SelectorEmpty,
    /// The Service still has its `spec.selector`, and the annotation says
    /// another: publishing beside upstream would route to other pods.
    SelectorDiffers,
    /// Taking over would drop ready endpoints upstream publishes for pods
    /// that still exist: the annotation's selector does not select them (a
    /// typo, or pod labels renamed since).
    SelectorMissesPods,
    /// The Endpoints annotation is neither "true" nor "false".
    EndpointsValue,
    /// An ExternalName Service has no endpoints.
    ExternalName,
}

impl Invalid {
    pub const ALL: [Invalid; 8] = [
        Invalid::LabelValue,
        Invalid::SelectorMissing,
        Invalid::SelectorMalformed,
        Invalid::SelectorEmpty,
        Invalid::SelectorDiffers,
        Invalid::SelectorMissesPods,
        Invalid::EndpointsValue,
        Invalid::ExternalName,
    ];

    /// The bounded `reason` label value.
    pub fn metric_label(self) -> &'static str {
        match self {
            Invalid::LabelValue => "label_value",
            Invalid::SelectorMissing => "selector_missing",
            Invalid::SelectorMalformed => "selector_malformed",
            Invalid::SelectorEmpty => "selector_empty",
            Invalid::SelectorDiffers => "selector_differs",
            Invalid::SelectorMissesPods => "selector_misses_pods",
            Invalid::EndpointsValue => "endpoints_value",
            Invalid::ExternalName => "external_name",
        }
    }

    /// What to tell the Service's owner, for the Warning Event.
    pub fn explain(self) -> String {
        match self {
            Invalid::LabelValue => format!("label {LABEL_OPT_IN} must be \"true\" or \"false\""),
            Invalid::SelectorMissing => {
                format!(
                    "opted in without annotation {ANNOTATION_SELECTOR} (a JSON object, e.g. {{\"app\":\"web\"}})"
                )
            }
            Invalid::SelectorMalformed => format!(
                "annotation {ANNOTATION_SELECTOR} is not a JSON object of valid label keys and values"
            ),
            Invalid::SelectorEmpty => format!(
                "annotation {ANNOTATION_SELECTOR} is empty: it would select every pod of the namespace"
            ),
            Invalid::SelectorDiffers => format!(
                "annotation {ANNOTATION_SELECTOR} differs from spec.selector: copy spec.selector into it"
            ),
            Invalid::SelectorMissesPods => format!(
                "annotation {ANNOTATION_SELECTOR} does not select pods kube-controller-manager publishes as ready: taking over would drop them"
            ),
            Invalid::EndpointsValue => {
                format!("annotation {ANNOTATION_ENDPOINTS} must be \"true\" or \"false\"")
            }
            Invalid::ExternalName => "an ExternalName Service has no endpoints".to_string(),
        }
    }
}

/// What the opt-in label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    /// No label, or `"false"`.
    Off,
    On,
    Invalid,
}

/// What a Service says about opting in, parsed once: its label and
/// annotations, each on its own, since people and GitOps tools change them
/// one at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptIn {
    label: Label,
    /// The selector annotation: `None` when absent.
    selector: Option<Result<BTreeMap<String, String>, Invalid>>,
    /// Whether Endpoints are written besides slices.
    endpoints: Result<bool, Invalid>,
}

impl OptIn {
    /// Reads the opt-in label and annotations of `svc`.
    pub fn of(svc: &Service) -> OptIn {
        let label = match svc
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OPT_IN))
            .map(String::as_str)
        {
            None | Some("false") => Label::Off,
            Some("true") => Label::On,
            Some(_) => Label::Invalid,
        };
        let annotation = |key: &str| {
            svc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(String::as_str)
        };
        let endpoints = match annotation(ANNOTATION_ENDPOINTS) {
            None | Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(_) => Err(Invalid::EndpointsValue),
        };
        OptIn {
            label,
            selector: annotation(ANNOTATION_SELECTOR).map(parse_selector),
            endpoints,
        }
    }

    /// Whether the Service carries anything of an opt-in (the label, or
    /// the selector annotation).
    pub fn is_marked(&self) -> bool {
        self.label != Label::Off || self.selector.is_some()
    }
}

/// Parses the selector annotation: a JSON object whose keys are label keys
/// and whose values are label values, at least one of them.
pub fn parse_selector(text: &str) -> Result<BTreeMap<String, String>, Invalid> {
    let selector: BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|_| Invalid::SelectorMalformed)?;
    if selector.is_empty() {
        return Err(Invalid::SelectorEmpty);
    }
    let valid = selector
        .iter()
        .all(|(key, value)| is_label_key(key) && is_label_value(value));
    if !valid {
        return Err(Invalid::SelectorMalformed);
    }
    Ok(selector)
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of 1
/// to 63 characters (alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric).
fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    !name.is_empty() && is_label_value(name) && prefix.is_none_or(is_dns_subdomain)
}

/// A label value: empty, or up to 63 characters as a key's name.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_none_or(u8::is_ascii_alphanumeric);
    bytes.len() <= 63
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: up to 253 characters of dot-separated lower-case
/// labels, each starting and ending alphanumeric.
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|part| {
            let bytes = part.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= 63
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}

fn is_external_name(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName")
}

/// The Endpoints object of a handled Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointsRole {
    /// Written by this controller.
    Write,
    /// Upstream's Endpoints controller writes them: the Service has its
    /// `spec.selector`. Endpoints of ours still there (from before the
    /// selector came back) are kept current until upstream rewrites them.
    LeaveToUpstream,
    /// Not wanted (annotation [`ANNOTATION_ENDPOINTS`] `"false"`): what
    /// upstream or we left behind is removed.
    Remove,
}

/// Where an opted-in Service stands: the bounded `state` label of
/// `endpoints_guard_opted_in_services`. Every state but
/// [`OptInState::Protecting`] is reported (a Warning Event and an alert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OptInState {
    /// Opted in without `spec.selector`: endpoints-guard alone publishes.
    Protecting,
    /// Opted in with `spec.selector`, endpoints-guard's slices beside
    /// upstream's: the first step of an opt-in, or a selector that came back
    /// (GitOps re-apply) before a takeover was seen. Protection is off.
    BesideUpstream,
    /// As [`OptInState::BesideUpstream`], after endpoints-guard had taken the
    /// Service over: the selector came back (a re-applied manifest).
    SelectorRestored,
    /// The opt-in label was removed but not the selector annotation, and
    /// the Service has no `spec.selector`: endpoints-guard keeps publishing,
    /// since nobody else would.
    LabelRemoved,
    /// The label is off and the selector back, and endpoints-guard's
    /// objects wait for upstream's to list the same ready endpoints.
    OptingOut,
    /// Opted in, but unusable (`opt_in_frozen_services{reason}` says why):
    /// what is published stays as it is.
    Frozen,
}

impl OptInState {
    pub const ALL: [OptInState; 6] = [
        OptInState::Protecting,
        OptInState::BesideUpstream,
        OptInState::SelectorRestored,
        OptInState::LabelRemoved,
        OptInState::OptingOut,
        OptInState::Frozen,
    ];

    /// The bounded `state` label value.
    pub fn metric_label(self) -> &'static str {
        match self {
            OptInState::Protecting => "protecting",
            OptInState::BesideUpstream => "beside_upstream",
            OptInState::SelectorRestored => "selector_restored",
            OptInState::LabelRemoved => "label_removed",
            OptInState::OptingOut => "opting_out",
            OptInState::Frozen => "frozen",
        }
    }

    /// Whether endpoints-guard alone publishes the Service's endpoints.
    pub fn protected(self) -> bool {
        matches!(self, OptInState::Protecting | OptInState::LabelRemoved)
    }
}

/// How a handled Service is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Managed<'a> {
    /// The selector its endpoints come from.
    pub selector: &'a BTreeMap<String, String>,
    pub endpoints: EndpointsRole,
    /// Whose objects for it are ours: in `opt-in` scope, once the Service
    /// has lost its `spec.selector`, upstream's frozen objects too (taken
    /// over, so that no endpoint they froze outlives its pod).
    pub managers: Managers,
    /// `opt-in` scope: where the Service stands (`None` in `all` scope).
    /// The objects written carry our own managed-by value, and Endpoints
    /// [`LABEL_SKIP_MIRROR`].
    pub opt_in: Option<OptInState>,
}

impl Managed<'_> {
    /// Whether upstream's objects of the Service are taken over: replaced
    /// by ours and deleted, never relabelled (`opt-in` scope without
    /// `spec.selector`).
    pub fn takes_over(&self) -> bool {
        self.opt_in.is_some() && self.managers.upstream()
    }
}

/// What the controllers do for one Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling<'a> {
    /// Not handled: nothing of it is written or removed. In `all` scope, an
    /// ExternalName Service or one without a selector (whose Endpoints
    /// belong to users).
    NotHandled,
    /// Opted in, but unusable: what is published stays as it is.
    Frozen(Invalid),
    /// `opt-in` scope, not opted in, with `spec.selector`: objects of ours
    /// left for it (an opt-out) are kept current from that selector until
    /// upstream's list the same ready endpoints, then removed. Never on a
    /// timeout: upstream may never publish.
    OptedOut(Managed<'a>),
    /// `opt-in` scope, with no opt-in label, no selector annotation and no
    /// `spec.selector` (or ExternalName): whoever opted it in has let it go.
    /// Objects of ours left for it are removed once a live read agrees.
    Abandoned,
    Managed(Managed<'a>),
}

impl<'a> Handling<'a> {
    /// The selector whose pods concern the Service's objects of ours, in
    /// any handling that keeps them current.
    pub fn selector(&self) -> Option<&'a BTreeMap<String, String>> {
        match self {
            Handling::Managed(m) | Handling::OptedOut(m) => Some(m.selector),
            _ => None,
        }
    }
}

/// The selector kube-controller-manager's controllers act on: that of a
/// Service with `spec.selector` that is not ExternalName. An empty selector
/// selects every pod of the namespace.
pub fn spec_selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    if is_external_name(svc) {
        return None;
    }
    svc.spec.as_ref()?.selector.as_ref()
}

/// How the controllers handle `svc` in `scope`; `opt_in` is [`OptIn::of`]
/// the same Service.
pub fn handling<'a>(scope: Scope, svc: &'a Service, opt_in: &'a OptIn) -> Handling<'a> {
    let spec = spec_selector(svc);
    if scope == Scope::All {
        return match spec {
            Some(selector) => Handling::Managed(Managed {
                selector,
                endpoints: EndpointsRole::Write,
                managers: Managers::OWN_AND_UPSTREAM,
                opt_in: None,
            }),
            None => Handling::NotHandled,
        };
    }
    if is_external_name(svc) {
        // No endpoints, whatever the opt-in says.
        return match opt_in.label {
            Label::On => Handling::Frozen(Invalid::ExternalName),
            Label::Invalid => Handling::Frozen(Invalid::LabelValue),
            Label::Off => Handling::Abandoned,
        };
    }
    let annotation = opt_in.selector.as_ref().map(|s| s.as_ref().map_err(|e| *e));
    let (selector, state) = match (opt_in.label, annotation, spec) {
        (Label::Invalid, _, _) => return Handling::Frozen(Invalid::LabelValue),
        (Label::Off, _, Some(spec)) => {
            return Handling::OptedOut(Managed {
                selector: spec,
                endpoints: EndpointsRole::LeaveToUpstream,
                managers: Managers::OWN,
                opt_in: Some(OptInState::OptingOut),
            });
        }
        (Label::Off, None, None) => return Handling::Abandoned,
        (_, Some(Err(why)), _) => return Handling::Frozen(why),
        (Label::On, None, _) => return Handling::Frozen(Invalid::SelectorMissing),
        (Label::On, Some(Ok(selector)), Some(spec)) if selector != spec => {
            return Handling::Frozen(Invalid::SelectorDiffers);
        }
        (Label::On, Some(Ok(selector)), Some(_)) => (selector, OptInState::BesideUpstream),
        (Label::On, Some(Ok(selector)), None) => (selector, OptInState::Protecting),
        (Label::Off, Some(Ok(selector)), None) => (selector, OptInState::LabelRemoved),
    };
    let endpoints = match opt_in.endpoints {
        Ok(endpoints) => endpoints,
        Err(why) => return Handling::Frozen(why),
    };
    // Upstream's controllers act on a Service while it has a selector, and
    // never again once it has none.
    let upstream_active = spec.is_some();
    let endpoints = match (endpoints, upstream_active) {
        (_, true) => EndpointsRole::LeaveToUpstream,
        (true, false) => EndpointsRole::Write,
        (false, false) => EndpointsRole::Remove,
    };
    let managers = if upstream_active {
        Managers::OWN
    } else {
        Managers::OWN_AND_UPSTREAM
    };
    Handling::Managed(Managed {
        selector,
        endpoints,
        managers,
        opt_in: Some(state),
    })
}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
