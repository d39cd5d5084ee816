//! Tests of the test harness itself (`eg-harness`) against the real
//! etcd, kube-apiserver and kube-controller-manager.
//!
//! Needs the control-plane programs: `make controlplane`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use eg_harness::sockets::listening_addrs;
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Pod, ServiceAccount};
use kube::api::{ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};

use crate::common::eventually;

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

/// Collects watch events until `done` says so, failing after `timeout`.
async fn watch_until(
    api: &Api<ConfigMap>,
    resource_version: &str,
    timeout: Duration,
    mut done: impl FnMut(&[WatchEvent<ConfigMap>]) -> bool,
) -> anyhow::Result<Vec<WatchEvent<ConfigMap>>> {
    let params = WatchParams::default().timeout(60);
    let mut stream = api.watch(&params, resource_version).await?.boxed();
    let mut events = Vec::new();
    let collect = async {
        while let Some(event) = stream.try_next().await? {
            events.push(event);
            if done(&events) {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("watch ended early")
    };
    match tokio::time::timeout(timeout, collect).await {
        Ok(result) => result.map(|()| events),
        Err(_) => anyhow::bail!("watch: no end after {timeout:?}"),
    }
}

fn summary(events: &[WatchEvent<ConfigMap>]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            WatchEvent::Added(cm) => format!("ADDED {} {:?}", cm.name_any(), cm.data),
            WatchEvent::Modified(cm) => format!("MODIFIED {} {:?}", cm.name_any(), cm.data),
            WatchEvent::Deleted(cm) => format!("DELETED {}", cm.name_any()),
            WatchEvent::Bookmark(_) => "BOOKMARK".to_string(),
            WatchEvent::Error(status) => format!("ERROR {} {}", status.code, status.reason),
        })
        .collect()
}

/// One control plane for: listening on loopback only, create/list/watch,
/// ServiceAccount tokens, and a restart of kube-apiserver keeping the data.
#[tokio::test]
async fn objects_watch_tokens_and_restart() {
    let started = Instant::now();
    let mut cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane starts");
    eprintln!("control plane ready in {:?}", started.elapsed());

    // Nothing listens anywhere but 127.0.0.1.
    let mut listening = Vec::new();
    for pid in cp.pids() {
        listening.extend(listening_addrs(pid).expect("read listeners"));
    }
    assert!(
        listening.len() >= 3,
        "etcd client+peer and kube-apiserver: {listening:?}"
    );
    assert!(
        listening
            .iter()
            .all(|addr| addr.ip().to_string() == "127.0.0.1"),
        "{listening:?}"
    );
    assert!(cp.server_url().starts_with("https://127.0.0.1:"));
    assert!(cp.etcd_client_url().starts_with("http://127.0.0.1:"));

    // Create, list and watch.
    cp.create_namespace("watch").await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), "watch");
    let start_rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("list resourceVersion");
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move {
            watch_until(&api, &start_rv, Duration::from_secs(30), |events| {
                matches!(events.last(), Some(WatchEvent::Deleted(_)))
            })
            .await
        })
    };
    let pp = PostParams::default();
    let mut cm = api
        .create(&pp, &config_map("one", "1"))
        .await
        .expect("create");
    api.create(&pp, &config_map("two", "2"))
        .await
        .expect("create");
    let names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, ["one", "two"]);
    cm.data = Some(BTreeMap::from([("k".to_string(), "changed".to_string())]));
    api.replace("one", &pp, &cm).await.expect("replace");
    api.delete("one", &Default::default())
        .await
        .expect("delete");
    let events = watcher.await.expect("watch task").expect("watch");
    assert_eq!(
        summary(&events),
        [
            r#"ADDED one Some({"k": "1"})"#,
            r#"ADDED two Some({"k": "2"})"#,
            r#"MODIFIED one Some({"k": "changed"})"#,
            "DELETED one",
        ]
    );

    // A ServiceAccount token authenticates through client_for_token and a
    // kubeconfig (the signing key pair is set up right).
    let sa_api: Api<ServiceAccount> = Api::namespaced(cp.client(), "watch");
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("robot".to_string()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    sa_api.create(&pp, &sa).await.expect("service account");
    // No audiences: kube-apiserver's own (the issuer) are used.
    let request = TokenRequest {
        spec: Some(TokenRequestSpec::default()),
        ..TokenRequest::default()
    };
    let token = sa_api
        .create_token_request("robot", &pp, &request)
        .await
        .expect("token request")
        .status
        .expect("token status")
        .token
        .expect("token");
    let review = Api::<SelfSubjectReview>::all(cp.client_for_token(&token).await.expect("client"))
        .create(&pp, &SelfSubjectReview::default())
        .await
        .expect("self subject review with the token");
    let username = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(
        username.as_deref(),
        Some("system:serviceaccount:watch:robot")
    );
    let kubeconfig = cp
        .kubeconfig_for_token("robot", &token)
        .expect("kubeconfig");
    let text = std::fs::read_to_string(&kubeconfig).expect("read kubeconfig");
    assert!(
        text.contains(&token) && text.contains(&cp.server_url()),
        "{text}"
    );
    // Unauthorised through RBAC: the ServiceAccount has no rights.
    let denied =
        Api::<ConfigMap>::namespaced(cp.client_for_token(&token).await.expect("client"), "watch")
            .list(&ListParams::default())
            .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(s)) if s.code == 403),
        "{denied:?}"
    );

    // Restarting kube-apiserver keeps the data in etcd.
    let before = api.get("two").await.expect("get before restart");
    let started = Instant::now();
    cp.restart_apiserver().await.expect("restart");
    eprintln!("kube-apiserver restarted in {:?}", started.elapsed());
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), "watch");
    let after = api.get("two").await.expect("get after restart");
    assert_eq!(after.data, before.data);
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert!(api.get_opt("one").await.expect("get").is_none());
    api.create(&pp, &config_map("three", "3"))
        .await
        .expect("write after restart");
}

/// After etcd is compacted, a watch from an older resourceVersion fails with
/// 410 Gone. kube-apiserver's watch cache would keep serving old events from
/// memory, so this control plane runs with `--watch-cache=false`: watches
/// reach etcd, as they do once the cache has moved past a revision.
#[tokio::test]
async fn watch_from_compacted_revision_is_gone() {
    let cp =
        ControlPlane::start(ControlPlaneOptions::default().apiserver_arg("--watch-cache=false"))
            .await
            .expect("control plane starts");
    cp.create_namespace("compact").await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), "compact");
    let pp = PostParams::default();
    let early = api
        .create(&pp, &config_map("cm", "0"))
        .await
        .expect("create");
    let early_rv = early.resource_version().expect("resourceVersion");
    for i in 1..=3 {
        let mut cm = api.get("cm").await.expect("get");
        cm.data = Some(BTreeMap::from([("k".to_string(), i.to_string())]));
        api.replace("cm", &pp, &cm).await.expect("replace");
    }

    // Before compaction the early resourceVersion can be watched from.
    let events = watch_until(&api, &early_rv, Duration::from_secs(20), |events| {
        events.len() >= 3
    })
    .await
    .expect("watch before compaction");
    assert_eq!(
        summary(&events),
        [
            r#"MODIFIED cm Some({"k": "1"})"#,
            r#"MODIFIED cm Some({"k": "2"})"#,
            r#"MODIFIED cm Some({"k": "3"})"#,
        ]
    );

    let revision = cp.compact_etcd().await.expect("compact");
    assert!(revision > early_rv.parse::<i64>().expect("numeric resourceVersion"));
    // kube-apiserver keeps writing (leases), so the revision may have moved on.
    assert!(cp.etcd_revision().await.expect("revision") >= revision);

    // kube-apiserver reports it either as the answer to the request or as
    // the stream's first event.
    let gone = match api
        .watch(&WatchParams::default().timeout(20), &early_rv)
        .await
    {
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(err) => panic!("unexpected error: {err}"),
        Ok(stream) => {
            let first = tokio::time::timeout(Duration::from_secs(20), stream.boxed().next())
                .await
                .expect("an event within 20 s");
            match first {
                Some(Ok(WatchEvent::Error(status))) => Some(status.code),
                Some(Err(kube::Error::Api(status))) => Some(status.code),
                other => panic!("expected 410 Gone, got {other:?}"),
            }
        }
    };
    assert_eq!(gone, Some(410));

    // A watch from after the compaction still works. (Not from the object's
    // own resourceVersion: other writes, such as leases, may have moved the
    // compaction point past it.)
    let current = api
        .list(&Default::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("list rv");
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move {
            watch_until(&api, &current, Duration::from_secs(20), |events| {
                !events.is_empty()
            })
            .await
        })
    };
    api.delete("cm", &Default::default()).await.expect("delete");
    let events = watcher
        .await
        .expect("task")
        .expect("watch after compaction");
    assert_eq!(summary(&events), ["DELETED cm"]);
}

/// Pods are made Ready with IPs through the status subresource, and
/// kube-controller-manager's endpoints controller builds Endpoints from them.
/// The API server is the release `KUBE_VERSION` picked.
#[tokio::test]
async fn pod_status_and_controller_manager_endpoints() {
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane starts");
    let served = cp.client().apiserver_version().await.expect("/version");
    eprintln!("harness: kube-apiserver {}", served.git_version);
    assert_eq!(
        served.git_version,
        cp.binaries().version,
        "the release asked for"
    );
    cp.create_namespace("web").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(cp.client(), "web");

    // A pod made Ready with two IPs reads back Ready with those IPs.
    cp.create_pod(
        PodBuilder::new("web", "web-0")
            .label("app", "web")
            .container_port("http", 8080, "TCP")
            .sidecar_port("metrics", 9090, "TCP")
            .hostname("web-0")
            .subdomain("web")
            .node_name("node-a"),
    )
    .await
    .expect("create pod");
    let pod = pods.get("web-0").await.expect("get");
    assert_eq!(pod.status.as_ref().and_then(|s| s.pod_ip.clone()), None);
    cp.set_pod_status(
        "web",
        "web-0",
        PodStatusSpec::ready(["10.244.0.5", "fd00:10:244::5"]),
    )
    .await
    .expect("set status");
    let pod = pods.get("web-0").await.expect("get");
    let status = pod.status.clone().expect("status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.0.5"));
    let ips: Vec<String> = status
        .pod_ips
        .unwrap_or_default()
        .into_iter()
        .map(|ip| ip.ip)
        .collect();
    assert_eq!(ips, ["10.244.0.5", "fd00:10:244::5"]);
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True");
    assert!(ready.last_transition_time.is_some());
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("node-a"));
    let sidecar = &spec.init_containers.expect("sidecar")[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));

    // A second pod, running but not Ready.
    cp.create_pod(
        PodBuilder::new("web", "web-1")
            .label("app", "web")
            .container_port("http", 8080, "TCP")
            .node_name("node-a"),
    )
    .await
    .expect("create pod");
    cp.set_pod_status("web", "web-1", PodStatusSpec::not_ready(["10.244.0.6"]))
        .await
        .expect("set status");

    let service = cp
        .create_service(
            ServiceBuilder::new("web", "web")
                .selector("app", "web")
                .named_port("http", 80, "http", "TCP")
                .dual_stack(),
        )
        .await
        .expect("create service");
    let cluster_ips = service.spec.and_then(|s| s.cluster_ips).unwrap_or_default();
    assert_eq!(
        cluster_ips.len(),
        2,
        "dual-stack cluster IPs: {cluster_ips:?}"
    );

    let mut kcm = cp
        .start_controller_manager("endpoints-controller", &[])
        .expect("start kube-controller-manager");
    let endpoints: Api<Endpoints> = Api::namespaced(cp.client(), "web");
    let deadline = Instant::now() + Duration::from_secs(60);
    let subset = loop {
        kcm.ensure_running().expect("kube-controller-manager runs");
        if let Some(subset) = endpoints
            .get_opt("web")
            .await
            .expect("get endpoints")
            .and_then(|e| e.subsets)
            .and_then(|s| s.into_iter().next())
        {
            break subset;
        }
        assert!(Instant::now() < deadline, "no Endpoints web after 60 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let ips = |addresses: Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| -> Vec<String> {
        addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.ip)
            .collect()
    };
    assert_eq!(ips(subset.addresses), ["10.244.0.5"]);
    assert_eq!(ips(subset.not_ready_addresses), ["10.244.0.6"]);
    // kube-controller-manager, fully up now, listens nowhere.
    let kcm_listening = listening_addrs(kcm.pid().expect("pid")).expect("listeners");
    assert!(kcm_listening.is_empty(), "{kcm_listening:?}");
    let ports = subset.ports.unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].port),
        (Some("http"), 8080)
    );

    // Graceful deletion of a pod on a node leaves it Terminating.
    let terminating = cp
        .delete_pod_gracefully("web", "web-1", 30)
        .await
        .expect("delete")
        .expect("pod stays");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(
        pods.get("web-1")
            .await
            .expect("still there")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cp.force_delete_pod("web", "web-1")
        .await
        .expect("force delete");
    assert!(pods.get_opt("web-1").await.expect("get").is_none());
    kcm.stop().await.expect("stop kube-controller-manager");
}

/// A kube-apiserver that cannot start fails `start` with its log's tail, and
/// the logs are kept for debugging.
#[tokio::test]
async fn a_failing_apiserver_reports_its_log() {
    let err = ControlPlane::start(ControlPlaneOptions::default().apiserver_arg("--no-such-flag"))
        .await
        .expect_err("kube-apiserver rejects an unknown flag");
    let message = format!("{err:#}");
    assert!(message.contains("kube-apiserver exited"), "{message}");
    assert!(
        message.contains("unknown flag: --no-such-flag"),
        "{message}"
    );
    let kept = message
        .split("logs kept in ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the kept log folder is named");
    let logs = std::path::Path::new(kept);
    assert!(logs.join("kube-apiserver.log").is_file(), "{message}");
    assert!(logs.join("etcd.log").is_file(), "{message}");
    std::fs::remove_dir_all(logs.parent().expect("control-plane folder")).expect("clean up");
}

/// The production-shaped control plane (`ControlPlaneOptions::highly_available`):
/// three etcd members agreeing on a leader, two kube-apiservers behind
/// HAProxy, each serving, API Priority and Fairness on (every answer names
/// the FlowSchema it matched); endpoints-guard through the load balancer
/// publishes a pod; with the etcd leader stopped (SIGSTOP) another member
/// leads, writes go on and are published; resumed, it rejoins. Then the
/// member serving kube-apiserver's watches is partitioned from the others:
/// it answers but knows no leader, writes go on and are published; healed,
/// it follows the leader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_highly_available_control_plane() -> anyhow::Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::highly_available()).await?;
    assert_eq!(cp.etcd_member_count(), 3);
    let leader = cp.etcd_leader().await?;
    assert_eq!(cp.extra_apiservers().len(), 1);
    let direct = cp.extra_apiservers()[0].client.clone();
    Api::<ConfigMap>::namespaced(direct, "default")
        .list(&ListParams::default())
        .await?;
    let request =
        http::Request::get("/api/v1/namespaces/default").body(kube::client::Body::empty())?;
    let answer = cp.client().send(request).await?;
    assert!(
        answer
            .headers()
            .contains_key("x-kubernetes-pf-flowschema-uid"),
        "API Priority and Fairness is off: {:?}",
        answer.headers()
    );
    cp.create_namespace("web").await?;
    cp.service_with_pod("web", "web", "10.1.0.1").await?;
    let guard = crate::common::Guard::start(cp.client(), &[]).await?;
    crate::common::wait_endpoint_ips(&cp, "web", "web", &["10.1.0.1"], Duration::from_secs(30))
        .await?;

    cp.pause_etcd_member(leader, true)?;
    let new_leader = eventually(MEMBER_WAIT, "a new etcd leader", || async {
        let now = cp.etcd_leader().await?;
        Ok((now != leader).then_some(now))
    })
    .await?;
    // kube-apiserver answers 500 until its etcd client has moved off the
    // stopped member: the write is tried again, as a client would.
    crate::common::retried(|| async {
        let pod = eg_harness::PodBuilder::serving("web", "web-1", "web");
        match cp.create_pod(pod).await {
            Err(err) if crate::common::already_exists(&err) => Ok(()),
            other => other.map(drop),
        }
    })
    .await?;
    crate::common::retried(|| cp.set_pod_ready("web", "web-1", "10.1.0.2", true)).await?;
    crate::common::wait_endpoint_ips(
        &cp,
        "web",
        "web",
        &["10.1.0.1", "10.1.0.2"],
        Duration::from_secs(60),
    )
    .await?;
    cp.pause_etcd_member(leader, false)?;
    eventually(MEMBER_WAIT, "the resumed member to rejoin", || async {
        let rejoined = cp.etcd_leader().await? == new_leader && every_member_answers(&cp).await;
        Ok(rejoined.then_some(()))
    })
    .await?;

    let cut = cp.etcd_member_serving_watches().await?;
    cp.partition_etcd_member(cut).await?;
    knows_a_leader(&cp, cut, false).await?;
    crate::common::retried(|| cp.set_pod_ready("web", "web-1", "10.1.0.3", true)).await?;
    crate::common::wait_endpoint_ips(
        &cp,
        "web",
        "web",
        &["10.1.0.1", "10.1.0.3"],
        Duration::from_secs(60),
    )
    .await?;
    cp.heal_etcd_partition().await?;
    knows_a_leader(&cp, cut, true).await?;
    guard.stop().await;
    Ok(())
}

/// How long an etcd member gets to follow a change of the cluster.
const MEMBER_WAIT: Duration = Duration::from_secs(30);

/// Waits until etcd member `index` knows a leader (`true`) or has forgotten
/// it (`false`).
async fn knows_a_leader(cp: &ControlPlane, index: usize, wanted: bool) -> anyhow::Result<()> {
    let what = format!("etcd member {index} to know a leader: {wanted}");
    eventually(MEMBER_WAIT, &what, || async {
        Ok((cp.etcd_member_knows_a_leader(index).await? == wanted).then_some(()))
    })
    .await
}

/// Whether every etcd member answers a status request.
async fn every_member_answers(cp: &ControlPlane) -> bool {
    for index in 0..cp.etcd_member_count() {
        if cp.etcd_member_status(index).await.is_err() {
            return false;
        }
    }
    true
}
