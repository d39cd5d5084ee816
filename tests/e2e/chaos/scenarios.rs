//! The scenarios of the chaos matrix: each sets up, starts the controller
//! behind watch-chaos, applies its fault and returns when the fault began and
//! the state the controller must reach.

use std::time::{Duration, Instant};

use anyhow::Result;
use eg_chaos::Expected;
use eg_harness::{PodBuilder, PodStatusSpec};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::NS;
use super::env::Env;
use super::store_faults::{self, Restore};
use crate::common::{already_exists, not_found, retried};

/// Sets up, applies the fault; returns when the fault began and the state the
/// controller must reach.
pub async fn scenario(name: &str, env: &mut Env) -> Result<(Instant, Expected)> {
    env.start_controller().await?;
    match name {
        // Failure A end to end: DELETE events carry the object's old RV (as
        // before kubernetes#58547); deleting the oldest Service sends the
        // client back to its creation RV, and the API server replays history.
        "failure-a-delete-oldest-service" => {
            env.service_with_pod("old", "10.1.0.1").await?;
            let expected = env.churn().await?;
            env.settle(&expected.clone().service("old", &["10.1.0.1"]))
                .await?;
            env.proxy
                .fault("services", "old-delete-rv", json!({"pace_ms": 400}))
                .await?;
            let fault = Instant::now();
            env.delete_service("old").await?;
            Ok((fault, expected.absent("old")))
        }
        // Failure A on command: an old DELETE of a live, long-lived Service.
        "failure-a-old-delete-of-live-service" => {
            env.service_with_pod("long", "10.1.0.1").await?;
            let expected = env.churn().await?.service("long", &["10.1.0.1"]);
            env.settle(&expected).await?;
            let fault = Instant::now();
            env.proxy
                .post("/actions/replay-old-delete", json!({"resource": "services", "namespace": NS, "name": "long", "pace_ms": 400}))
                .await?;
            Ok((fault, expected))
        }
        // Failure B: watches cut while a Service is deleted and etcd is
        // compacted (watch cache off, so resumes reach etcd and get a real
        // 410), then DELETEs replaced by ERROR 500 PrevKv=nil.
        "failure-b-compaction-and-prevkv-nil" => {
            env.services_settled(&[("a", "10.1.0.1"), ("x", "10.1.9.1"), ("y", "10.1.8.1")])
                .await?;
            let fault = Instant::now();
            env.proxy.fault("*", "refuse", json!({})).await?;
            env.proxy.post("/actions/cut-streams", json!({})).await?;
            env.delete_service("x").await?;
            env.pod("a-1", "a", "10.1.0.2", true).await?;
            env.cp.compact_etcd().await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            env.proxy.clear_faults().await?;
            env.proxy.fault("services", "prevkv-nil", json!({})).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            env.delete_service("y").await?;
            Ok((
                fault,
                Expected::default()
                    .service("a", &["10.1.0.1", "10.1.0.2"])
                    .absent("x")
                    .absent("y"),
            ))
        }
        // Failure A on command for pods: an old DELETE of the live pod a-0
        // (its old RV), then the pod history replayed from that RV, which
        // holds no later version of a-0.
        "failure-a-old-delete-of-live-pod" => {
            let expected = service_with_two_pods(env).await?;
            let fault = Instant::now();
            env.proxy
                .post(
                    "/actions/replay-old-delete",
                    json!({"resource": "pods", "namespace": NS, "name": "a-0", "pace_ms": 400}),
                )
                .await?;
            Ok((fault, expected))
        }
        // A Service and its pod deleted and made again at once, the same
        // names (a `kubectl replace --force`, an app redeployed): upstream's
        // slice tracker keeps the old Service's slices and the new one may
        // never get any (kubernetes#141592, fixed in 1.38 only).
        "service-and-pods-recreated" => {
            env.service_with_pod("a", "10.1.0.1").await?;
            env.settle(&Expected::default().service("a", &["10.1.0.1"]))
                .await?;
            let fault = Instant::now();
            env.delete_service("a").await?;
            env.cp.force_delete_pod(NS, "a-0").await?;
            env.service_with_pod("a", "10.1.0.2").await?;
            Ok((fault, Expected::default().service("a", &["10.1.0.2"])))
        }
        // An old DELETE of the live Node of every pod, replayed to the
        // controller's Node watch: upstream drops every endpoint on a Node
        // missing from its cache (kubernetes#107927), and a Node that does
        // not change (here: no kubelet) never comes back to it.
        "node-delete-replayed" => {
            let expected = service_with_two_pods(env).await?;
            let fault = Instant::now();
            env.proxy
                .post(
                    "/actions/replay-old-delete",
                    json!({"resource": "nodes", "name": "node-a", "pace_ms": 400}),
                )
                .await?;
            // A change after the replay: the Service is synced on it.
            env.pod("a-2", "a", "10.1.0.3", true).await?;
            Ok((
                fault,
                expected.service("a", &["10.1.0.1", "10.1.0.2", "10.1.0.3"]),
            ))
        }
        // Two kube-apiservers behind the load balancer, and the first one's
        // watches of etcd stall (a member cut off from the others while it
        // serves them, etcd#17611): its watch cache stops at one revision
        // while the second's goes on, and every client meets both (the
        // "Too large resource version" class, kubernetes#91073).
        "apiserver-watch-stalled" => {
            service_with_two_pods(env).await?;
            let fault = Instant::now();
            env.cp.etcd_hold_watches(true).await?;
            Ok((fault, replace_second_pod(env).await?))
        }
        // The pod watches go half-open: open, silent, bookmarks included,
        // as behind a load balancer whose far side is gone, while a pod goes
        // and another comes. Nothing but the silence tells.
        "half-open-pod-watch" => {
            service_with_two_pods(env).await?;
            let fault = Instant::now();
            env.proxy
                .post("/actions/silence-streams", json!({"resource": "pods"}))
                .await?;
            Ok((fault, replace_second_pod(env).await?))
        }
        // Node events lost: the Node watch goes half-open, then a Node is
        // added and a ready pod starts on it. A controller that knows only
        // the Nodes its watch told it of leaves the pod out (kubernetes#107927).
        "node-added-unseen" => {
            env.service_with_pod("a", "10.1.0.1").await?;
            env.settle(&Expected::default().service("a", &["10.1.0.1"]))
                .await?;
            let fault = Instant::now();
            env.proxy
                .post("/actions/silence-streams", json!({"resource": "nodes"}))
                .await?;
            let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-b"}}))?;
            Api::<Node>::all(env.cp.client())
                .create(&PostParams::default(), &node)
                .await?;
            env.cp
                .create_pod_with_status(
                    PodBuilder::serving(NS, "a-1", "a").node_name("node-b"),
                    PodStatusSpec::running(["10.1.0.2"], true),
                )
                .await?;
            Ok((
                fault,
                Expected::default().service("a", &["10.1.0.1", "10.1.0.2"]),
            ))
        }
        // The watches of what the controller writes lag 3 s behind the
        // store while a pod goes not ready and ready again within a second:
        // a controller that compares with its lagging cache sees its own
        // not-ready write as still to come, and the ready state as already
        // there (kubernetes#125638 and its family).
        "ready-flip-own-writes-lagging" => {
            let expected = service_with_two_pods(env).await?;
            for resource in ["endpoints", "endpointslices"] {
                env.proxy
                    .fault(resource, "watch-lag", json!({"delay_ms": 3000}))
                    .await?;
            }
            let fault = Instant::now();
            env.set_ready("a-1", "10.1.0.2", false).await?;
            tokio::time::sleep(Duration::from_millis(700)).await;
            env.set_ready("a-1", "10.1.0.2", true).await?;
            Ok((fault, expected))
        }
        // Three etcd members, two API servers behind a load balancer: the
        // etcd leader stalls (SIGSTOP) for 10 s while a pod comes and another
        // goes, then resumes.
        "etcd-leader-stopped" => {
            service_with_two_pods(env).await?;
            let leader = env.cp.etcd_leader().await?;
            let fault = Instant::now();
            env.cp.pause_etcd_member(leader, true)?;
            // Writes time out until the others elect a leader.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !matches!(env.cp.etcd_leader().await, Ok(now) if now != leader) {
                anyhow::ensure!(Instant::now() < deadline, "no new etcd leader within 30 s");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let expected = replace_second_pod(env).await?;
            tokio::time::sleep(Duration::from_secs(10)).await;
            env.cp.pause_etcd_member(leader, false)?;
            Ok((fault, expected))
        }
        // Three etcd members, two API servers behind a load balancer: the
        // member serving kube-apiserver's watches is cut off from the others
        // for the rest of the row while a pod comes and another goes. It
        // still answers, so nothing at the connection tells
        // (kubernetes#89488, etcd#17611).
        "etcd-member-partitioned" => {
            service_with_two_pods(env).await?;
            let cut = env.cp.etcd_member_serving_watches().await?;
            let fault = Instant::now();
            env.cp.partition_etcd_member(cut).await?;
            Ok((fault, replace_second_pod(env).await?))
        }
        "lost-service-delete" => {
            env.services_settled(&[("a", "10.1.0.1"), ("x", "10.1.9.1")])
                .await?;
            let expected = Expected::default().service("a", &["10.1.0.1"]);
            env.proxy
                .fault("services", "drop-deletes", json!({}))
                .await?;
            let fault = Instant::now();
            env.delete_service("x").await?;
            Ok((fault, expected.absent("x")))
        }
        "lost-pod-delete" => {
            service_with_two_pods(env).await?;
            env.proxy.fault("pods", "drop-deletes", json!({})).await?;
            let fault = Instant::now();
            env.cp.force_delete_pod(NS, "a-1").await?;
            Ok((fault, Expected::default().service("a", &["10.1.0.1"])))
        }
        // A stale watch cache: after a controller restart, its RV=0 LIST is
        // answered from a snapshot that predates Service n, and the watch
        // from that snapshot lags 6 s behind.
        "stale-rv0-list-on-restart" => {
            env.service_with_pod("a", "10.1.0.1").await?;
            env.settle(&Expected::default().service("a", &["10.1.0.1"]))
                .await?;
            env.proxy
                .fault("services", "stale-list", json!({"lag_ms": 6000}))
                .await?;
            env.service_with_pod("n", "10.1.3.1").await?;
            let expected = Expected::default()
                .service("a", &["10.1.0.1"])
                .service("n", &["10.1.3.1"]);
            env.settle(&expected).await?;
            let fault = Instant::now();
            env.stop_controller().await;
            env.start_controller().await?;
            Ok((fault, expected))
        }
        // Service events held back and sent after the next one: a selector
        // change and its revert arrive in the wrong order.
        "reordered-service-updates" => {
            env.service_with_pod("a", "10.1.0.1").await?;
            let expected = Expected::default().service("a", &["10.1.0.1"]);
            env.settle(&expected).await?;
            env.proxy
                .fault("services", "reorder", json!({"hold_ms": 2000}))
                .await?;
            let fault = Instant::now();
            env.set_selector("a", "nothing").await?;
            env.set_selector("a", "a").await?;
            Ok((fault, expected))
        }
        // Watch streams cut mid-event, again and again, while things change.
        "cut-streams-mid-event" => {
            env.services_settled(&[("a", "10.1.0.1"), ("x", "10.1.9.1")])
                .await?;
            env.proxy
                .fault("*", "cut-mid-event", json!({"after": 1}))
                .await?;
            let fault = Instant::now();
            env.pod("a-1", "a", "10.1.0.2", true).await?;
            env.proxy.post("/actions/cut-streams", json!({})).await?;
            env.delete_service("x").await?;
            env.cp.force_delete_pod(NS, "a-0").await?;
            env.proxy.post("/actions/cut-streams", json!({})).await?;
            env.pod("a-2", "a", "10.1.0.3", true).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            env.proxy.clear_faults().await?;
            Ok((
                fault,
                Expected::default()
                    .service("a", &["10.1.0.2", "10.1.0.3"])
                    .absent("x"),
            ))
        }
        "apiserver-restart" => {
            env.services_settled(&[("a", "10.1.0.1"), ("x", "10.1.9.1")])
                .await?;
            let fault = Instant::now();
            env.delete_service("x").await?;
            env.pod("a-1", "a", "10.1.0.2", true).await?;
            env.cp.restart_apiserver().await?;
            env.pod("a-2", "a", "10.1.0.3", true).await?;
            Ok((
                fault,
                Expected::default()
                    .service("a", &["10.1.0.1", "10.1.0.2", "10.1.0.3"])
                    .absent("x"),
            ))
        }
        "etcd-restore-plain" => store_faults::etcd_restore(env, Restore::Plain).await,
        "etcd-restore-bump-revision" => store_faults::etcd_restore(env, Restore::Bumped).await,
        "watch-cache-lost-pod-delete" => store_faults::watch_cache_lost_pod_delete(env).await,
        super::TWO_API_SERVERS => store_faults::lost_in_one_of_two_watch_caches(env).await,
        // Longer than upstream's retry budget (15 retries from 5 ms: ~164 s).
        "endpoints-writes-denied-past-retries" => {
            store_faults::writes_denied_longer_than_retries(env, Duration::from_secs(170)).await
        }
        "bare-404-on-get" => store_faults::bare_404_on_get(env).await,
        other => anyhow::bail!("no scenario {other}"),
    }
}

/// Service `a` with ready pods `a-0` and `a-1`, published; returns that
/// state.
async fn service_with_two_pods(env: &Env) -> Result<Expected> {
    env.service_with_pod("a", "10.1.0.1").await?;
    env.pod("a-1", "a", "10.1.0.2", true).await?;
    let expected = Expected::default().service("a", &["10.1.0.1", "10.1.0.2"]);
    env.settle(&expected).await?;
    Ok(expected)
}

/// `a-1` force-deleted and `a-2` started: the changes a fault must not
/// lose, and what must then be published. Each write is tried again until
/// it lands, as a client would while kube-apiserver answers 500 (its etcd
/// client still on a member that stalls).
async fn replace_second_pod(env: &Env) -> Result<Expected> {
    retried(|| async {
        match env.cp.force_delete_pod(NS, "a-1").await {
            Err(err) if not_found(&err) => Ok(()),
            other => other,
        }
    })
    .await?;
    retried(|| async {
        match env.cp.create_pod(PodBuilder::serving(NS, "a-2", "a")).await {
            Err(err) if already_exists(&err) => Ok(()),
            other => other.map(drop),
        }
    })
    .await?;
    retried(|| env.set_ready("a-2", "10.1.0.3", true)).await?;
    Ok(Expected::default().service("a", &["10.1.0.1", "10.1.0.3"]))
}

/// How a scenario hurts upstream when it does, and why it may not.
pub fn note(name: &str) -> (&'static str, &'static str) {
    match name {
        "slices/service-and-pods-recreated" => (
            "the Service made again gets no slices: upstream's tracker still expects the old Service's",
            "upstream's tracker had caught up with the deletion before the Service came back",
        ),
        "slices/node-delete-replayed" => (
            "the endpoints of every pod on the Node leave the slices, and stay out: the Node never changes again",
            "the replayed DELETE did not reach upstream's Node watch",
        ),
        "apiserver-watch-stalled" | "slices/apiserver-watch-stalled" => (
            "its watches stayed on the kube-apiserver whose cache had stopped: the changes never reach it",
            "its watches went to the kube-apiserver whose cache went on",
        ),
        "half-open-pod-watch" | "slices/half-open-pod-watch" => (
            "the pod changes made after the watch went silent never reach it: nothing on its side ends the watch",
            "its pod watch was opened again before the changes",
        ),
        "ready-flip-own-writes-lagging" | "slices/ready-flip-own-writes-lagging" => (
            "the pod left not ready: its own write still to come in its cache, the ready state looked written",
            "it does not skip a write on a cache that has not seen its own last write",
        ),
        "slices/node-added-unseen" => (
            "the pod on the Node it never heard of stays out of the slices",
            "it learnt of the Node another way",
        ),
        "etcd-member-partitioned" | "slices/etcd-member-partitioned" => (
            "an event was lost while the member serving kube-apiserver's watches was cut off",
            "kube-apiserver's watches of etcd require a leader: the cut-off member ends them and they move to another member",
        ),
        "etcd-leader-stopped" | "slices/etcd-leader-stopped" => (
            "an event was lost while the etcd leader stalled",
            "both controllers' watches went on through another member (kube-apiserver's etcd client moves)",
        ),
        "slices/lost-pod-delete" => (
            "the deleted pod stays an endpoint in the slices: upstream never re-reads the API",
            "the delete reached the controller another way",
        ),
        "slices/reordered-service-updates" => (
            "the older selector (matching no pod) arrives last; upstream empties the slices of a Service with a ready pod",
            "the two updates were not swapped",
        ),
        "slices/failure-a-delete-oldest-service" => (
            "the replayed history of b reaches the slices of the live b",
            "upstream's slice controller deletes no slice when a Service leaves its cache (the garbage collector does, after a live read of the owner), and the replayed ADDED of b's earlier incarnation is followed by its DELETE and the live b",
        ),
        "slices/failure-a-old-delete-of-live-pod" => (
            "the live pod's endpoint leaves the slice on the old DELETE; the replay never brings the pod back, so it stays out",
            "the old DELETE did not reach the controller",
        ),
        "slices/failure-b-compaction-and-prevkv-nil" => (
            "a delete was lost across the compaction",
            "client-go relists on 410 and on the 500 with a consistent LIST, and learns both deletes",
        ),
        "slices/apiserver-restart" => (
            "an event was lost across the restart",
            "both resume (or relist) after the restart; the time is mostly the restart itself",
        ),
        "failure-a-delete-oldest-service" => (
            "the replayed DELETE of an earlier incarnation of b deletes the Endpoints of the live b; re-created on the replayed ADDED",
            "the API server no longer held the history to replay",
        ),
        "failure-a-old-delete-of-live-service" => (
            "Endpoints of the live Service deleted; the replay never re-adds it, so they stay gone",
            "the old DELETE did not reach the controller",
        ),
        "failure-b-compaction-and-prevkv-nil" => (
            "a delete was lost across the compaction",
            "client-go relists on 410 and on the 500 with a consistent LIST, and learns both deletes",
        ),
        "lost-service-delete" => (
            "Endpoints of the deleted Service stay: upstream never re-reads the API",
            "the delete reached the controller another way",
        ),
        "lost-pod-delete" => (
            "the deleted pod's IP stays in the Endpoints: upstream never re-reads the API",
            "the delete reached the controller another way",
        ),
        "stale-rv0-list-on-restart" => (
            "the RV=0 relist (WatchListClient=false) lacks Service n; upstream deletes its Endpoints, re-creates them when the lagging watch catches up",
            "kube-controller-manager made no RV=0 LIST (see stats)",
        ),
        "reordered-service-updates" => (
            "the older selector (matching no pod) arrives last; upstream empties the Endpoints of a Service with a ready pod",
            "the two updates were not swapped",
        ),
        "cut-streams-mid-event" => (
            "an event was lost at a cut",
            "both resume from the last RV and lose nothing",
        ),
        "apiserver-restart" => (
            "an event was lost across the restart",
            "both resume (or relist) after the restart; the time is mostly the restart itself",
        ),
        "etcd-restore-plain" => (
            "its watches resume from resourceVersions the restored store has not reached: the API server accepts them and sends nothing, so the restored state and the new pod never arrive (kubernetes#107457)",
            "it relisted after the restore",
        ),
        "etcd-restore-bump-revision" => (
            "it relists after the 410, but its own staleness check then refuses the restored Endpoints (\"endpoints informer cache is out of date, resource version 199 already processed\": restored objects keep their old RVs), retries and drops the Service; the new pod never reaches the Endpoints",
            "the bumped, compacted revision answers every watch with 410; client-go relists and takes the restored state",
        ),
        "watch-cache-lost-pod-delete" => (
            "the deleted pod stays in kube-apiserver's watch cache, so in every watch and LIST; its IP stays in the Endpoints",
            "the DELETE reached the controller another way",
        ),
        super::TWO_API_SERVERS => (
            "the deleted pod stays in the watch cache of the API server the controller talks to, in its every watch and consistent LIST; its IP stays in the Endpoints",
            "the DELETE reached the controller another way",
        ),
        "endpoints-writes-denied-past-retries" => (
            "its key ran out of retries while writes were denied and nothing brings it back until the Service or its pods change again",
            "its retries outlasted the denial",
        ),
        "bare-404-on-get" => (
            "failure A: it deletes the Endpoints of the live Service on the replayed DELETE (it never reads the Service, so the 404 plays no part)",
            "the replayed DELETE did not reach it",
        ),
        _ => ("", ""),
    }
}
