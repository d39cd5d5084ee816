//! What one reconcile of a Service key does, decided from what it observed
//! and read: whether the Service's objects are ours to touch at all, whether
//! a live read must come before anything is removed, what is removed, when
//! content is reconciled ([`decide`]); and, within the content, which pods
//! and Nodes the cache lost must be read live before the endpoints on them
//! go, and what each read means ([`pods_to_confirm`], [`pod_verdict`],
//! [`nodes_to_confirm`]). Pure (no client, no clock), so that every rule of
//! scope, ownership and the guard has a unit test without a server; the
//! reconciles (`sync.rs`, `slice_sync.rs`) gather what they observe, make the
//! reads asked for (`guard.rs`), and act. What the content should be is
//! `crate::desired`'s.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::desired::scope::{
    EndpointsRole, Handling, Invalid, Managed, Managers, OptInState, Scope,
};
use crate::desired::{self, PodInfo};
use crate::reconcile::kinds::CachedService;
use crate::settings::Controller;

/// Which managed-by values the objects that exist for a Service carry: for
/// Endpoints the one object's, for slices any of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Existing {
    /// Labelled `endpoints-guard`.
    pub own: bool,
    /// Labelled with kube-controller-manager's value.
    pub upstream: bool,
}

impl Existing {
    /// Whether something exists that `managers` takes as ours.
    fn ours(self, managers: Managers) -> bool {
        (self.own && managers.own()) || (self.upstream && managers.upstream())
    }
}

/// What a reconcile knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub scope: Scope,
    pub controller: Controller,
    /// The Service: as the live read found it, when one was made, else as
    /// the cache has it.
    pub service: Option<&'a CachedService>,
    /// Whether [`Observed::service`] comes from a live read.
    pub read_live: bool,
    /// What exists of this controller's kind for the Service.
    pub existing: Existing,
    /// For a Service that opted out: whether upstream's objects publish at
    /// least the ready endpoints ours do.
    pub covered: bool,
    /// For a Service whose upstream objects are about to be taken over:
    /// whether they publish ready endpoints of pods that still exist and
    /// that the opt-in's selector does not select ([`pods_missed`]).
    pub misses_pods: bool,
}

/// Why a live read of the Service comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The cache lacks the Service and something of ours exists for it:
    /// deleting that on the cache's word is upstream's fault.
    ServiceMissing,
    /// The cache shows the Service opted out, and upstream's objects cover
    /// ours: ours are removed only if the API agrees.
    OptOut,
    /// The cache shows the Service's opt-in abandoned (no label, no
    /// selector annotation, no `spec.selector`): ours are removed only if
    /// the API agrees.
    Abandoned,
    /// The cache shows an opted-in Service without its selector: upstream's
    /// objects are taken over (changed, removed) only if the API agrees.
    Takeover,
}

/// Why nothing is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// No Service, and nothing of ours for it.
    NoService,
    /// The Service is not handled and nothing of ours is left for it.
    NotHandled,
    /// Opted in with its selector still there: upstream's Endpoints
    /// controller writes its Endpoints.
    LeftToUpstream,
    /// Opted in without Endpoints, and none of ours or upstream's is left.
    EndpointsOff,
}

/// Why objects of ours go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// A live read found the Service gone.
    ServiceGone,
    /// The Service opted out and upstream's objects cover ours.
    OptedOut,
    /// The Service's opt-in was abandoned: no label, no selector
    /// annotation, no `spec.selector`.
    Abandoned,
    /// The Service opted in with its Endpoints turned off: what upstream
    /// froze, or we wrote, goes.
    EndpointsOff,
}

/// What the reconcile does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    Idle(Idle),
    /// Opted in but unusable: what is published stays; reported.
    Frozen(Invalid),
    /// Read the Service live, then decide again with what it says.
    ReadService(Read),
    /// Remove the objects that `managers` takes as ours.
    Remove {
        why: Removal,
        managers: Managers,
    },
    /// Reconcile the content.
    Reconcile(Managed<'a>),
}

/// The decision for one Service key.
pub fn decide<'a>(o: &Observed<'a>) -> Decision<'a> {
    let Some(service) = o.service else {
        let managers = o.scope.managers();
        return if !o.existing.ours(managers) {
            Decision::Idle(Idle::NoService)
        } else if !o.read_live {
            Decision::ReadService(Read::ServiceMissing)
        } else {
            Decision::Remove {
                why: Removal::ServiceGone,
                managers,
            }
        };
    };
    match service.handling(o.scope) {
        Handling::NotHandled => Decision::Idle(Idle::NotHandled),
        Handling::Frozen(why) => Decision::Frozen(why),
        Handling::OptedOut(managed) => opted_out(o, managed),
        Handling::Abandoned => abandoned(o),
        Handling::Managed(managed) => match o.controller {
            Controller::Endpoints => endpoints(o, managed),
            Controller::Endpointslices => slices(o, managed),
        },
    }
}

/// Our own objects of a Service that opted out are kept current from its
/// selector until upstream's cover them; then they go, once a live read
/// agrees. No timeout removes them: upstream may never publish, and then
/// they are the Service's only endpoints. Endpoints are never removed:
/// upstream's Endpoints controller rewrites the one object when it syncs.
fn opted_out<'a>(o: &Observed<'a>, managed: Managed<'a>) -> Decision<'a> {
    let managers = Managers::OWN;
    if !o.existing.ours(managers) {
        Decision::Idle(Idle::NotHandled)
    } else if !o.covered || o.controller == Controller::Endpoints {
        Decision::Reconcile(managed)
    } else if !o.read_live {
        Decision::ReadService(Read::OptOut)
    } else {
        Decision::Remove {
            why: Removal::OptedOut,
            managers,
        }
    }
}

/// Our own objects of a Service whose opt-in was abandoned go, once a live
/// read agrees.
fn abandoned<'a>(o: &Observed<'a>) -> Decision<'a> {
    let managers = Managers::OWN;
    if !o.existing.ours(managers) {
        Decision::Idle(Idle::NotHandled)
    } else if !o.read_live {
        Decision::ReadService(Read::Abandoned)
    } else {
        Decision::Remove {
            why: Removal::Abandoned,
            managers,
        }
    }
}

/// Upstream's objects are taken over only when the opt-in's selector keeps
/// every ready endpoint of a live pod they publish; otherwise they keep
/// serving and the Service is frozen.
fn takeover_blocked(o: &Observed<'_>, managed: Managed<'_>) -> bool {
    managed.takes_over() && o.existing.upstream && o.misses_pods
}

fn endpoints<'a>(o: &Observed<'a>, managed: Managed<'a>) -> Decision<'a> {
    match managed.endpoints {
        EndpointsRole::Write if takeover_blocked(o, managed) => {
            Decision::Frozen(Invalid::SelectorMissesPods)
        }
        EndpointsRole::Write => Decision::Reconcile(managed),
        // Ours, from before the selector came back: kept current until
        // upstream rewrites them (it does on its next sync).
        EndpointsRole::LeaveToUpstream if o.existing.own => Decision::Reconcile(managed),
        EndpointsRole::LeaveToUpstream => Decision::Idle(Idle::LeftToUpstream),
        EndpointsRole::Remove if !o.existing.ours(managed.managers) => {
            Decision::Idle(Idle::EndpointsOff)
        }
        EndpointsRole::Remove if !o.read_live => Decision::ReadService(Read::Takeover),
        EndpointsRole::Remove => Decision::Remove {
            why: Removal::EndpointsOff,
            managers: managed.managers,
        },
    }
}

/// In opt-in scope, upstream's slices of a Service that lost its selector
/// are taken over (replaced by ours, then deleted) once a live read agrees.
/// In all scope upstream's slices are always ours: no read.
fn slices<'a>(o: &Observed<'a>, managed: Managed<'a>) -> Decision<'a> {
    let takes_over = managed.takes_over() && o.existing.upstream;
    if takeover_blocked(o, managed) {
        Decision::Frozen(Invalid::SelectorMissesPods)
    } else if takes_over && !o.read_live {
        Decision::ReadService(Read::Takeover)
    } else {
        Decision::Reconcile(managed)
    }
}

/// Where one controller finds an opted-in Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    State(OptInState),
    Frozen(Invalid),
}

impl Status {
    pub fn state(self) -> OptInState {
        match self {
            Status::State(state) => state,
            Status::Frozen(_) => OptInState::Frozen,
        }
    }
}

/// Where a decision leaves an opted-in Service, for the reports
/// ([`crate::reconcile::opt_in::OptInStates`]); `None` for a Service that
/// is not opted in and has nothing of ours, or is gone.
pub fn opt_in_status(
    service: Option<&CachedService>,
    scope: Scope,
    decision: &Decision<'_>,
) -> Option<Status> {
    if let Decision::Frozen(why) = decision {
        return Some(Status::Frozen(*why));
    }
    match service?.handling(scope) {
        Handling::Managed(managed) => managed.opt_in.map(Status::State),
        Handling::OptedOut(managed) => match decision {
            Decision::Idle(_) | Decision::Remove { .. } => None,
            _ => managed.opt_in.map(Status::State),
        },
        Handling::NotHandled | Handling::Abandoned | Handling::Frozen(_) => None,
    }
}

/// The pods behind the ready endpoints upstream publishes (`published`)
/// that still exist (`alive` finds the same incarnation in the cache) and
/// that `selector` does not select: taking over would drop them.
pub fn pods_missed<'a>(
    published: impl IntoIterator<Item = NamedPod<'a>>,
    selector: &BTreeMap<String, String>,
    alive: impl Fn(NamedPod<'a>) -> Option<std::sync::Arc<PodInfo>>,
) -> Vec<&'a str> {
    let mut missed: Vec<&'a str> = published
        .into_iter()
        .filter(|pod| alive(*pod).is_some_and(|p| !desired::selector_matches(selector, p.as_ref())))
        .map(|pod| pod.name)
        .collect();
    missed.sort_unstable();
    missed.dedup();
    missed
}

/// A pod an address or endpoint of ours names: its name and incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedPod<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// The pods our objects name that the selection lacks because the cache
/// took them for deleted: its tombstone for the name holds the same
/// incarnation (`tombstoned` gives the UID of the name's tombstone, if any).
/// Each must be read live before its address goes; each once, in order. A
/// pod the cache lost another way (a new incarnation, no tombstone) or never
/// had is not: nothing says it still exists.
pub fn pods_to_confirm<'a>(
    named: impl IntoIterator<Item = NamedPod<'a>>,
    selected: &HashSet<&str>,
    tombstoned: impl Fn(&str) -> Option<String>,
) -> Vec<NamedPod<'a>> {
    let mut out: Vec<NamedPod<'a>> = Vec::new();
    for pod in named {
        if selected.contains(pod.name) || out.iter().any(|p| p.name == pod.name) {
            continue;
        }
        if tombstoned(pod.name).as_deref() == Some(pod.uid) {
            out.push(pod);
        }
    }
    out
}

/// What a live read of a pod the cache took for deleted means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodVerdict {
    /// The same pod, still selected: it goes back into the cache and its
    /// address stays (the watch's DELETE was wrong).
    Keep,
    /// The same pod, no longer selected: back into the cache; its address
    /// follows the selection.
    Unselected,
    /// Gone, or another pod of the same name: the deletion is confirmed.
    Gone,
}

/// The verdict on pod `uid` from a live read that found `found` (`None`:
/// gone).
pub fn pod_verdict(
    found: Option<&PodInfo>,
    uid: &str,
    selector: &BTreeMap<String, String>,
) -> PodVerdict {
    match found {
        Some(pod) if pod.uid() == uid => {
            if desired::selector_matches(selector, pod) {
                PodVerdict::Keep
            } else {
                PodVerdict::Unselected
            }
        }
        _ => PodVerdict::Gone,
    }
}

/// The Nodes, unknown to the cache (`unknown_pods`: the pods the desired
/// slices left out for it), of pods whose endpoints the current slices
/// publish (`published`): leaving those pods out would remove endpoints on
/// the cache's word, so each Node is read live first. A Node a read finds
/// goes back into the cache; one gone is left out, as upstream leaves it.
pub fn nodes_to_confirm<'a>(
    unknown_pods: &BTreeSet<&str>,
    published: &BTreeSet<&str>,
    pods: impl IntoIterator<Item = &'a PodInfo>,
) -> Vec<String> {
    let nodes: BTreeSet<String> = pods
        .into_iter()
        .filter(|p| unknown_pods.contains(p.name()) && published.contains(p.name()))
        .filter_map(|p| p.node_name())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    nodes.into_iter().collect()
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
