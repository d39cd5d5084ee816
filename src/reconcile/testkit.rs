//! Fixtures for the reconcile: a [`Context`] over any client (a scripted
//! peer, or nowhere), and small objects for the unit tests.

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};

use super::latency::{WriteClock, WriteTimer};
use super::{Context, Policy, Stores, Work};
use crate::desired::ManagedBy;
use crate::desired::scope::Scope;
use crate::metrics::Metrics;
use crate::settings::{Controller, Mode};

// The objects below are for the unit tests; the profiler needs only the
// context and the timer.
#[cfg(test)]
use {
    crate::desired::{PodFields, PodInfo},
    k8s_openapi::api::core::v1::{Endpoints, Service},
    serde_json::json,
    std::collections::BTreeMap,
};

/// A context whose client talks to `client`'s server, in enforce mode, leading.
/// Its Events are published when a runtime runs (as in async tests).
pub fn context_with(client: kube::Client) -> Context {
    let metrics = Arc::new(Metrics::new().unwrap_or_else(|err| panic!("metrics: {err}")));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test".into(),
            instance: None,
        },
    );
    let (events, publisher) = super::events::channel(recorder, metrics.events_dropped.clone());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(publisher.run());
    }
    Context {
        client,
        metrics,
        events,
        stores: Stores::new(),
        leader: tokio::sync::watch::channel(true).1,
        policy: Policy {
            mode: Mode::Enforce,
            scope: Scope::All,
            rules: crate::desired::Rules::of(crate::desired::KubeRelease::NEWEST),
            managed_by: ManagedBy::default(),
            max_endpoints_per_slice: crate::desired::slices::DEFAULT_MAX_ENDPOINTS_PER_SLICE,
            opt_out_grace: std::time::Duration::from_secs(300),
        },
        endpoints: Work::new(super::queue::MAX_RETRIES),
        slices: Work::new(super::queue::MAX_RETRIES),
        opt_in_states: Default::default(),
    }
}

/// A scripted peer answering `replies` in order (Event posts aside: those
/// always get `{}`), and a context whose requests to it time out after a
/// second.
#[cfg(test)]
pub async fn scripted(
    replies: Vec<hardened_watcher::testing::Reply>,
) -> (hardened_watcher::testing::ScriptedApi, Context) {
    use hardened_watcher::testing::{Reply, ScriptedApi};
    let peer = ScriptedApi::start(replies)
        .await
        .unwrap_or_else(|err| panic!("scripted peer: {err}"));
    peer.route("POST", "/apis/events.k8s.io", Reply::Body("{}".into()));
    let ctx = context_with(peer.client(std::time::Duration::from_secs(1)));
    (peer, ctx)
}

/// Whether an Event was posted to `peer` within `within`: Events are
/// published off the reconcile path, after it returns.
#[cfg(test)]
pub async fn event_posted(
    peer: &hardened_watcher::testing::ScriptedApi,
    within: std::time::Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if peer
            .requests()
            .iter()
            .any(|r| r.starts_with("POST /apis/events.k8s.io"))
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The timer of a reconcile no event caused: it records nothing.
pub fn untimed(ctx: &Context) -> WriteTimer {
    WriteClock::new(&ctx.metrics, Controller::Endpoints).timer(None)
}

/// Reconciles `key` for `controller`, untimed, and settles its effects as
/// a worker does.
pub async fn settled(
    ctx: &Context,
    controller: Controller,
    key: &hardened_watcher::ObjectKey,
) -> crate::error::Result<super::publish::Action> {
    super::publish::reconcile(ctx, controller, key, &untimed(ctx))
        .await
        .settle(ctx, controller, key)
}

/// A context whose client points nowhere: for code that never calls the API.
#[cfg(test)]
pub fn context() -> Context {
    let config = kube::Config::new(
        "http://127.0.0.1:9"
            .parse()
            .unwrap_or_else(|err| panic!("uri: {err}")),
    );
    context_with(kube::Client::try_from(config).unwrap_or_else(|err| panic!("client: {err}")))
}

/// Service `name` of `ns` selecting `app: <app>`, port 80 → 8080.
#[cfg(test)]
pub fn service(ns: &str, name: &str, app: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("{name}-uid"), "resourceVersion": "1"},
        "spec": {"selector": {"app": app}, "clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .unwrap_or_else(|err| panic!("service: {err}"))
}

/// Ready pod `name` of `ns` labelled `app: <app>` at `ip`, on node `n1`.
#[cfg(test)]
pub fn pod(ns: &str, name: &str, app: &str, ip: &str, rv: &str) -> PodInfo {
    PodFields {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("{name}-uid"),
        resource_version: rv.into(),
        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
        pod_ips: vec![ip.into()],
        phase: Some("Running".into()),
        ready: true,
        node_name: Some("n1".into()),
        ..PodFields::default()
    }
    .pack()
}

/// Endpoints `name` of `ns`, managed by us (the managed-by value written by
/// default), with one ready address per (pod name, ip), port 8080.
#[cfg(test)]
pub fn endpoints(ns: &str, name: &str, addresses: &[(&str, &str)]) -> Endpoints {
    let addresses: Vec<_> = addresses
        .iter()
        .map(|(pod, ip)| {
            json!({"ip": ip, "nodeName": "n1",
                   "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": format!("{pod}-uid")}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("{name}-ep-uid"), "resourceVersion": "5",
                     "labels": {"endpoints.kubernetes.io/managed-by": ManagedBy::default().endpoints()}},
        "subsets": [{"addresses": addresses, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}],
    }))
    .unwrap_or_else(|err| panic!("endpoints: {err}"))
}
