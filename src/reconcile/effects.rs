//! What a reconcile leaves to its worker besides its [`Action`]: the updates
//! of the tables the reconciles keep between runs (trigger times, where each
//! opted-in Service stands, opt-out clocks, restored Endpoints, unmanaged
//! orphans) and the Warning Events it reports.
//!
//! A reconcile reads those tables and writes none of them: it collects its
//! effects, in the order it decided them, and [`Outcome::settle`] applies
//! them once it has returned, whether it succeeded or failed (the Event of a
//! refused write is one of them). The caches are not among them: what a
//! reconcile reads live or writes goes into them at once, because its next
//! step reads them.

use std::sync::Mutex;
use std::time::Instant;

use tracing::{info, warn};

use super::Context;
use super::decide::Status;
use super::guard;
use super::opt_in::SELECTOR_RESTORED;
use super::publish::Action;
use super::trigger::Seen;
use crate::desired::scope::{ANNOTATION_SELECTOR, LABEL_OPT_IN, OptInState};
use crate::error::Result;
use crate::locks::lock;
use crate::settings::Controller;
use hardened_watcher::ObjectKey;

/// One thing a reconcile asks its worker to do for its Service key.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Where the Service's opt-in stands as this controller decided it
    /// (`None`: not an opted-in Service, or gone): recorded in
    /// `OptInStates`, with a Warning Event when the Service enters a state
    /// that needs a person.
    OptIn(Option<Status>),
    /// The opt-out's wait for upstream started at this instant (kept if it
    /// had started already).
    OptOutWaits(Instant),
    /// The opt-out waited past its grace: reported once, with a Warning Event.
    OptOutStalled,
    /// The opt-out is over (done, or the Service opted in again).
    OptOutOver,
    /// What this sync saw for the trigger-time annotation.
    TriggerSeen(Seen),
    /// The Service's objects were deleted: its trigger times start again.
    TriggerForgotten,
    /// Endpoints were created: counted as restored if someone else had
    /// deleted ours.
    EndpointsCreated,
    /// Whether the Endpoints are an unmanaged orphan now, and whose they are.
    Orphan {
        orphan: bool,
        managed_by: Option<String>,
    },
    /// A Warning Event on the Service.
    Warning(Warning),
}

/// A Warning Event on the reconciled Service.
#[derive(Debug)]
pub(crate) struct Warning {
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
    /// The Service's UID where it was known when the Event was decided.
    pub uid: Option<String>,
}

impl Warning {
    /// A Warning about syncing Service `key`, on the Service as the cache
    /// knows it now.
    pub(crate) fn sync(ctx: &Context, key: &ObjectKey, reason: &'static str, note: String) -> Self {
        let uid = ctx
            .stores
            .services
            .get(key)
            .and_then(|s| s.metadata.uid.clone());
        Self {
            reason,
            action: "Sync",
            note,
            uid,
        }
    }
}

/// The effects one reconcile collects. Shared by reference through the
/// reconcile's steps, across their awaits; never locked across one.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    list: Mutex<Vec<Effect>>,
}

impl Effects {
    pub(crate) fn push(&self, effect: Effect) {
        lock(&self.list).push(effect);
    }

    fn into_list(self) -> Vec<Effect> {
        std::mem::take(&mut *lock(&self.list))
    }
}

/// What one reconcile returned: its result, and the effects its worker
/// applies ([`Outcome::settle`]) before acting on the result.
#[must_use = "an outcome's effects apply only when it is settled"]
pub struct Outcome {
    result: Result<Action>,
    effects: Vec<Effect>,
}

impl Outcome {
    pub(crate) fn new(result: Result<Action>, effects: Effects) -> Self {
        Self {
            result,
            effects: effects.into_list(),
        }
    }

    /// Applies the effects for `controller`'s reconcile of `key`, in order,
    /// and hands back the result.
    pub fn settle(self, ctx: &Context, controller: Controller, key: &ObjectKey) -> Result<Action> {
        for effect in self.effects {
            apply(ctx, controller, key, effect);
        }
        self.result
    }
}

fn apply(ctx: &Context, controller: Controller, key: &ObjectKey, effect: Effect) {
    let work = ctx.work(controller);
    match effect {
        Effect::OptIn(status) => {
            let gauges = ctx.opt_in_gauges();
            if let Some(entered) = ctx.opt_in_states.record(key, controller, status, &gauges) {
                report_opt_in(ctx, key, entered);
            }
        }
        Effect::OptOutWaits(since) => work.opt_outs.start(key, since),
        Effect::OptOutStalled => {
            if work.opt_outs.report(key) {
                report_stalled_opt_out(ctx, controller, key);
            }
        }
        Effect::OptOutOver => work.opt_outs.forget(key),
        Effect::TriggerSeen(seen) => work.trigger_times.remember(key, seen),
        Effect::TriggerForgotten => work.trigger_times.forget(key),
        Effect::EndpointsCreated => {
            if work.restores.take(key) {
                ctx.metrics.endpoints_restored.inc();
                info!(%key, "restored Endpoints that someone else deleted while their Service was handled");
            }
        }
        Effect::Orphan { orphan, managed_by } => {
            super::orphans::record(ctx, key, orphan, managed_by.as_deref());
        }
        Effect::Warning(warning) => guard::publish_warning(ctx, key, warning),
    }
}

/// A Warning Event of the worker's own.
fn warning(ctx: &Context, key: &ObjectKey, reason: &'static str, note: String) {
    guard::publish_warning(ctx, key, Warning::sync(ctx, key, reason, note));
}

fn report_stalled_opt_out(ctx: &Context, controller: Controller, key: &ObjectKey) {
    warn!(%key, %controller, "opt-out stalled: kube-controller-manager does not publish the ready endpoints ours do");
    let objects = controller.objects();
    warning(
        ctx,
        key,
        "OptOutStalled",
        format!(
            "Opted out, but kube-controller-manager has not published the same ready endpoints within {:?}: endpoints-guard keeps its {objects} current and removes them once it does (is kube-controller-manager's {objects} controller running?)",
            ctx.policy.opt_out_grace,
        ),
    );
}

/// The Warning Event of an opted-in Service that entered `status`.
fn report_opt_in(ctx: &Context, key: &ObjectKey, status: Status) {
    let (reason, note) = match status {
        Status::Frozen(why) => (
            "OptInInvalid",
            format!(
                "Opted in, but {}: endpoints-guard leaves what is published as it is until this is fixed",
                why.explain()
            ),
        ),
        Status::State(OptInState::SelectorRestored) => (
            SELECTOR_RESTORED,
            "spec.selector is back on this opted-in Service (a re-applied manifest?): kube-controller-manager publishes beside endpoints-guard, and protection is off until spec.selector is removed again where the manifest lives, or the Service opts out".to_string(),
        ),
        Status::State(OptInState::BesideUpstream) => (
            "ProtectionOff",
            "Opted in, but spec.selector is still there: kube-controller-manager publishes beside endpoints-guard, and protection is off until spec.selector is removed".to_string(),
        ),
        Status::State(OptInState::LabelRemoved) => (
            "OptInLabelRemoved",
            format!(
                "Label {LABEL_OPT_IN} is gone, but the Service has no spec.selector: endpoints-guard keeps publishing from annotation {ANNOTATION_SELECTOR}. Put spec.selector back to opt out, or the label back; removing the annotation too removes these endpoints"
            ),
        ),
        Status::State(OptInState::Protecting | OptInState::OptingOut | OptInState::Frozen) => {
            info!(%key, state = status.state().metric_label(), "opt-in state");
            return;
        }
    };
    warn!(%key, reason, "{note}");
    warning(ctx, key, reason, note);
}

#[cfg(test)]
mod tests {
    use super::{Action, Effect, Effects, Outcome};
    use crate::reconcile::testkit::context;
    use crate::settings::Controller;
    use hardened_watcher::ObjectKey;

    fn settle(ctx: &crate::reconcile::Context, key: &ObjectKey, list: Vec<Effect>) {
        let effects = Effects::default();
        for effect in list {
            effects.push(effect);
        }
        Outcome::new(Ok(Action::Done), effects)
            .settle(ctx, Controller::Endpoints, key)
            .unwrap_or_else(|err| panic!("settled: {err}"));
    }

    #[tokio::test]
    async fn a_create_counts_as_a_restore_once_after_someone_else_deleted() {
        let ctx = context();
        let key = ObjectKey::new("ns", "web");
        settle(&ctx, &key, vec![Effect::EndpointsCreated]);
        assert_eq!(ctx.metrics.endpoints_restored.get(), 0, "nobody deleted");
        ctx.endpoints.restores.note(key.clone());
        settle(&ctx, &key, vec![Effect::EndpointsCreated]);
        settle(&ctx, &key, vec![Effect::EndpointsCreated]);
        assert_eq!(ctx.metrics.endpoints_restored.get(), 1);
    }

    #[tokio::test]
    async fn effects_apply_in_the_order_they_were_decided() {
        let ctx = context();
        let key = ObjectKey::new("ns", "web");
        let start = std::time::Instant::now();
        // A live read ended the opt-out that the cache's view had started.
        settle(
            &ctx,
            &key,
            vec![Effect::OptOutWaits(start), Effect::OptOutOver],
        );
        assert_eq!(ctx.endpoints.opt_outs.since(&key), None);
        settle(
            &ctx,
            &key,
            vec![Effect::OptOutOver, Effect::OptOutWaits(start)],
        );
        assert_eq!(ctx.endpoints.opt_outs.since(&key), Some(start));
    }

    #[tokio::test]
    async fn a_failed_reconcile_still_leaves_its_effects() {
        let ctx = context();
        let key = ObjectKey::new("ns", "web");
        let effects = Effects::default();
        effects.push(Effect::OptOutWaits(std::time::Instant::now()));
        let failed = Outcome::new(
            Err(crate::error::Error::UnknownNodes {
                service: key.to_string(),
                pods: 1,
            }),
            effects,
        )
        .settle(&ctx, Controller::Endpoints, &key);
        assert!(failed.is_err());
        assert!(ctx.endpoints.opt_outs.since(&key).is_some());
    }
}
