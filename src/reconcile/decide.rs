//! What one reconcile of a Service key does about the Service as a whole,
//! decided from what it observed: whether its objects are ours to touch at
//! all, whether a live read must come before anything is removed, what is
//! removed, and when content is reconciled. Pure (no client, no clock), so
//! that every rule of scope, ownership and the guard has a unit test without
//! a server; the reconciles (`sync.rs`, `slice_sync.rs`) gather an
//! [`Observed`], act on the [`Decision`], and come back with the live read
//! one asks for. What the content should be is `crate::desired`'s.

use std::time::Duration;

use crate::config::Controller;
use crate::desired::scope::{EndpointsRole, Handling, Invalid, Managed, Managers, Scope};
use crate::reconcile::kinds::CachedService;

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
    /// For a Service that opted out: how long since the opt-out was first
    /// confirmed, and how long ours may wait for upstream's to cover them.
    pub opted_out_for: Duration,
    pub opt_out_grace: Duration,
}

/// Why a live read of the Service comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The cache lacks the Service and something of ours exists for it:
    /// deleting that on the cache's word is upstream's fault.
    ServiceMissing,
    /// The cache shows the Service opted out: ours is removed only if the
    /// API agrees.
    OptOut,
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
    /// The Service opted out and upstream's objects did not cover ours
    /// within the grace period.
    OptOutTimedOut,
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
    /// Come back after this long (an opt-out waiting for upstream).
    Wait(Duration),
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
        Handling::OptedOut => opted_out(o),
        Handling::Managed(managed) => match o.controller {
            Controller::Endpoints => endpoints(o, managed),
            Controller::Endpointslices => slices(o, managed),
        },
    }
}

/// Only our own objects of a Service that opted out go, once a live read
/// agrees, and then only when upstream's cover them or the grace is over.
fn opted_out<'a>(o: &Observed<'a>) -> Decision<'a> {
    let managers = Managers::OWN;
    if !o.existing.ours(managers) {
        Decision::Idle(Idle::NotHandled)
    } else if !o.read_live {
        Decision::ReadService(Read::OptOut)
    } else if o.covered {
        Decision::Remove {
            why: Removal::OptedOut,
            managers,
        }
    } else if o.opted_out_for >= o.opt_out_grace {
        Decision::Remove {
            why: Removal::OptOutTimedOut,
            managers,
        }
    } else {
        Decision::Wait(o.opt_out_grace - o.opted_out_for)
    }
}

fn endpoints<'a>(o: &Observed<'a>, managed: Managed<'a>) -> Decision<'a> {
    match managed.endpoints {
        EndpointsRole::Write => Decision::Reconcile(managed),
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
/// are taken over (reused, relabelled or deleted by the plan) once a live
/// read agrees. In all scope upstream's slices are always ours: no read.
fn slices<'a>(o: &Observed<'a>, managed: Managed<'a>) -> Decision<'a> {
    let takes_over = managed.opt_in && managed.managers.upstream() && o.existing.upstream;
    if takes_over && !o.read_live {
        Decision::ReadService(Read::Takeover)
    } else {
        Decision::Reconcile(managed)
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
