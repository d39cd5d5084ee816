//! The reconcile of one Service key, one loop for both controllers: observe
//! the caches, decide what may be touched (`decide.rs`, pure), then the
//! controller's own guard and apply (`Publisher`: `sync.rs` for Endpoints,
//! `slice_sync.rs` for EndpointSlices). A reconcile returns its [`Action`]
//! and the effects it decided ([`Outcome`]); the worker (`controller.rs`)
//! alone applies them and queues the key again.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use super::Context;
use super::decide::{Decision, Existing, Idle, Observed, Removal, Status, decide, opt_in_status};
use super::effects::{Effect, Effects, Outcome, Warning};
use super::guard;
use super::kinds::{CachedService, Kind, ServiceKind};
use super::latency::WriteTimer;
use super::slice_sync::SlicesPublisher;
use super::sync::EndpointsPublisher;
use crate::desired::scope::{Handling, Managed, Managers, OptInState};
use crate::error::Result;
use crate::settings::Controller;
use hardened_watcher::{Cached, Confirmation, ObjectKey};

/// What a successful reconcile asks of its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the key comes back with the next change or resync.
    Done,
    /// Queue the key again after this long: a wait no watch event announces
    /// (the end of an opt-out's grace).
    RequeueAfter(Duration),
}

/// What differs between the two controllers' reconciles: what they find
/// cached for a Service, and how they remove and write it. The loop that
/// calls them is [`reconcile`]'s.
pub(crate) trait Publisher {
    const CONTROLLER: Controller;
    /// What the caches hold of this kind for the Service, ours and upstream's.
    type Found;

    fn find(ctx: &Context, key: &ObjectKey) -> Self::Found;

    /// What the reconcile found beside the decision: Endpoints report
    /// unmanaged orphans here.
    fn note_found(_job: &Job<'_>, _service_cached: bool, _found: &Self::Found) {}

    /// Which managed-by values what was found carries.
    fn existing(found: &Self::Found) -> Existing;

    /// The targetRefs of the ready endpoints upstream's objects publish
    /// (asked only when upstream's are there to be taken over).
    fn upstream_ready(found: &Self::Found) -> Result<Vec<ObjectReference>>;

    /// Whether upstream's objects publish every ready address ours do
    /// (asked only for an opted-out Service with objects of ours).
    fn upstream_covers_ours(found: &Self::Found) -> Result<bool>;

    /// Removes or writes, as the decision says ([`Act`]).
    fn apply(
        job: &Job<'_>,
        found: Self::Found,
        act: Act<'_>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// One reconcile: the controller and Service key, what it works with, the
/// timer of its first write, and the effects it leaves to its worker.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub ctx: &'a Context,
    pub controller: Controller,
    pub key: &'a ObjectKey,
    pub timer: &'a WriteTimer,
    pub effects: &'a Effects,
}

impl Job<'_> {
    /// Leaves `effect` to the worker.
    pub fn then(&self, effect: Effect) {
        self.effects.push(effect);
    }

    /// A Warning Event on the Service (for refused writes), as the cache
    /// knows it now.
    pub fn warn(&self, reason: &'static str, note: String) {
        self.then(Effect::Warning(Warning::sync(
            self.ctx, self.key, reason, note,
        )));
    }
}

/// What the decision leaves to the controller's own apply step.
pub(crate) enum Act<'a> {
    /// Delete what `managers` takes as ours: the Service's removal decided
    /// (after a live read).
    Remove { why: Removal, managers: Managers },
    /// Guard and write the content of the handled Service.
    Publish {
        service: &'a CachedService,
        managed: Managed<'a>,
    },
}

/// Reconciles Service `key` for `controller`; `timer` times the first write
/// (see [`WriteTimer`]). The caller settles the [`Outcome`].
pub async fn reconcile(
    ctx: &Context,
    controller: Controller,
    key: &ObjectKey,
    timer: &WriteTimer,
) -> Outcome {
    let effects = Effects::default();
    let job = Job {
        ctx,
        controller,
        key,
        timer,
        effects: &effects,
    };
    let result = match controller {
        Controller::Endpoints => run::<EndpointsPublisher>(&job).await,
        Controller::Endpointslices => run::<SlicesPublisher>(&job).await,
    };
    Outcome::new(result, effects)
}

async fn run<P: Publisher>(job: &Job<'_>) -> Result<Action> {
    let Job { ctx, key, .. } = *job;
    // The Service as a live read found it, once one was made.
    let mut live: Option<Option<Arc<CachedService>>> = None;
    loop {
        let found = P::find(ctx, key);
        let cached_service = ctx.stores.services.get(key);
        P::note_found(job, cached_service.is_some(), &found);
        let service = live.clone().unwrap_or(cached_service);
        let existing = P::existing(&found);
        let decision = decide(&Observed {
            scope: ctx.policy.scope,
            controller: P::CONTROLLER,
            service: service.as_deref(),
            read_live: live.is_some(),
            existing,
            covered: opted_out(ctx, service.as_deref())
                && existing.own
                && P::upstream_covers_ours(&found)?,
            misses_pods: takeover_misses_pods(ctx, key, service.as_deref(), existing, || {
                P::upstream_ready(&found)
            })?,
        });
        let action = follow_up(job, service.as_deref(), &decision);
        match decision {
            Decision::ReadService(why) => {
                live = Some(guard::read_service(job, why).await?);
                continue;
            }
            Decision::Idle(Idle::NoService) => {
                job.then(Effect::TriggerForgotten);
                release_service_tombstone(ctx, key);
            }
            Decision::Idle(_) | Decision::Frozen(_) => {}
            Decision::Remove { why, managers } => {
                P::apply(job, found, Act::Remove { why, managers }).await?;
            }
            Decision::Reconcile(managed) => {
                if let Some(service) = service.as_deref() {
                    P::apply(job, found, Act::Publish { service, managed }).await?;
                }
            }
        }
        return Ok(action);
    }
}

fn opted_out(ctx: &Context, service: Option<&CachedService>) -> bool {
    service.is_some_and(|svc| matches!(svc.handling(ctx.policy.scope), Handling::OptedOut(_)))
}

/// Whether taking over upstream's objects of the Service would drop ready
/// endpoints of live pods its opt-in's selector misses
/// ([`guard::selector_misses_pods`]). `upstream_ready` gives the targetRefs
/// of upstream's ready endpoints; it is asked only when a takeover is pending.
fn takeover_misses_pods(
    ctx: &Context,
    key: &ObjectKey,
    service: Option<&CachedService>,
    existing: Existing,
    upstream_ready: impl FnOnce() -> Result<Vec<ObjectReference>>,
) -> Result<bool> {
    let Some(Handling::Managed(managed)) = service.map(|s| s.handling(ctx.policy.scope)) else {
        return Ok(false);
    };
    if !(managed.takes_over() && existing.upstream) {
        return Ok(false);
    }
    Ok(guard::selector_misses_pods(
        ctx,
        key,
        managed.selector,
        &upstream_ready()?,
    ))
}

/// A Service gone from the cache with nothing of ours at stake (no Endpoints
/// or slices, or only ones we never delete): its tombstone goes without a
/// live read (any later deletion reads live anyway).
fn release_service_tombstone(ctx: &Context, key: &ObjectKey) {
    // The other controller may still have something of ours for it.
    if <ServiceKind as Kind>::at_stake(ctx, key, "") {
        return;
    }
    let store = &ctx.stores.services;
    let uid = store.with_cache(|services| {
        services
            .tombstone(key)
            .map(|t| t.last_known.uid().to_string())
    });
    if let Some(uid) = uid {
        store.confirm_deleted(key, &uid, Confirmation::Released);
    }
}

/// What a decision means besides its action: where the opted-in Service
/// stands, and the opt-out clock, whose grace the returned [`Action`] waits
/// out (both left to the worker as effects).
fn follow_up(job: &Job<'_>, service: Option<&CachedService>, decision: &Decision<'_>) -> Action {
    let ctx = job.ctx;
    let status = opt_in_status(service, ctx.policy.scope, decision);
    job.then(Effect::OptIn(status));
    if status.map(Status::state) != Some(OptInState::OptingOut) {
        job.then(Effect::OptOutOver);
        return Action::Done;
    }
    let now = Instant::now();
    let since = ctx.work(job.controller).opt_outs.since(job.key);
    if since.is_none() {
        job.then(Effect::OptOutWaits(now));
    }
    let waited = since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
    if waited < ctx.policy.opt_out_grace {
        // Back when the grace is over, to report a stalled opt-out (the
        // queue keeps the earliest instant asked for).
        return Action::RequeueAfter(ctx.policy.opt_out_grace - waited);
    }
    job.then(Effect::OptOutStalled);
    Action::Done
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Action, Job, follow_up};
    use crate::desired::scope::{Handling, Scope};
    use crate::reconcile::decide::Decision;
    use crate::reconcile::effects::{Effects, Outcome};
    use crate::reconcile::kinds::CachedService;
    use crate::reconcile::testkit::{context, service, untimed};
    use crate::settings::Controller;
    use hardened_watcher::ObjectKey;

    /// Where an opted-out Service's reconcile stands: `follow_up` of the
    /// decision that keeps its slices current while upstream's do not cover them.
    fn opting_out(grace: Duration) -> (crate::reconcile::Context, ObjectKey, CachedService) {
        let mut ctx = context();
        ctx.policy.scope = Scope::OptIn;
        ctx.policy.opt_out_grace = grace;
        // spec.selector and no opt-in label: opted out.
        (
            ctx,
            ObjectKey::new("ns", "web"),
            CachedService::new(service("ns", "web", "web")),
        )
    }

    /// One reconcile's `follow_up` of the decision to keep the slices
    /// current, its effects settled as the worker settles them.
    fn step(ctx: &crate::reconcile::Context, key: &ObjectKey, svc: &CachedService) -> Action {
        let effects = Effects::default();
        let action = follow_up_of(ctx, key, svc, &effects);
        Outcome::new(Ok(action), effects)
            .settle(ctx, Controller::Endpointslices, key)
            .unwrap_or_else(|err| panic!("settled: {err}"))
    }

    /// The slice controller's `follow_up` of the decision to keep `svc`'s
    /// slices current, its effects left in `effects`.
    fn follow_up_of(
        ctx: &crate::reconcile::Context,
        key: &ObjectKey,
        svc: &CachedService,
        effects: &Effects,
    ) -> Action {
        let Handling::OptedOut(managed) = svc.handling(ctx.policy.scope) else {
            panic!("not opted out: {:?}", svc.handling(ctx.policy.scope));
        };
        let timer = untimed(ctx);
        let job = Job {
            ctx,
            controller: Controller::Endpointslices,
            key,
            timer: &timer,
            effects,
        };
        follow_up(&job, Some(svc), &Decision::Reconcile(managed))
    }

    #[tokio::test]
    async fn an_opt_out_asks_to_come_back_when_its_grace_is_over() {
        let grace = Duration::from_secs(300);
        let (ctx, key, svc) = opting_out(grace);
        let Action::RequeueAfter(first) = step(&ctx, &key, &svc) else {
            panic!("no requeue for the end of the grace");
        };
        assert!(first <= grace && first > grace - Duration::from_secs(5));
        let Action::RequeueAfter(second) = step(&ctx, &key, &svc) else {
            panic!("asked again within the grace: no requeue");
        };
        assert!(
            second <= first,
            "the wait started once: {second:?} > {first:?}"
        );
    }

    #[tokio::test]
    async fn a_stalled_opt_out_is_reported_once_and_not_requeued() {
        let (ctx, key, svc) = opting_out(Duration::ZERO);
        assert_eq!(step(&ctx, &key, &svc), Action::Done);
        assert!(
            !ctx.slices.opt_outs.report(&key),
            "the first reconcile past the grace reported it"
        );
        assert_eq!(step(&ctx, &key, &svc), Action::Done);
    }

    /// The opt-out clock is the worker's to start: a reconcile that is
    /// never settled leaves it where it was.
    #[tokio::test]
    async fn the_clock_starts_only_when_the_outcome_is_settled() {
        let (ctx, key, svc) = opting_out(Duration::from_secs(300));
        follow_up_of(&ctx, &key, &svc, &Effects::default());
        assert_eq!(ctx.slices.opt_outs.since(&key), None);
        assert!(step(&ctx, &key, &svc) != Action::Done);
        assert!(ctx.slices.opt_outs.since(&key).is_some());
    }
}
