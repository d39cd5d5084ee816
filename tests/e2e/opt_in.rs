//! Opt-in scope as GitOps tools and people operate Services, on the local
//! control plane: kube-controller-manager with every controller (one
//! process for the whole run, never restarted), endpoints-guard in opt-in
//! scope beside it, one Node kept alive by a heartbeat and three ready
//! pods. The application's manifests are applied by server-side apply under
//! the field manager a GitOps tool uses; people's changes are the
//! subcommands (the binary) and patches.
//!
//! The judge of every row: a watch of each Service's slices and pods, no
//! moment at which the published ready endpoints were wrong past the grace
//! (an address not a live ready pod, or nothing while pods were ready:
//! `eg_node::traffic::wrong_moments`). Besides: who publishes after
//! each row, and that each reported state shows in the metrics.
//!
//! `upstream_tracker_*` proves what a takeover must do on the release
//! under test (KUBE_VERSION): kube-controller-manager's slice controller
//! stalls for good after its slice is relabelled, and publishes again
//! after its slice is deleted.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use eg_chaos::ChaosProxy;
use eg_harness::process::Process;
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
use eg_node::traffic::{ServiceWatch, wrong_moments};
use endpoints_guard::desired::scope::{ANNOTATION_SELECTOR, LABEL_OPT_IN, LABEL_SKIP_MIRROR};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::common::{Guard, endpoints_guard, eventually};

const NS: &str = "shop";
const NODE: &str = "node-a";
const OURS: &str = "endpoints-guard";
const UPSTREAM: &str = "endpointslice-controller.k8s.io";
/// The field manager Argo CD's server-side apply uses.
const GITOPS: &str = "argocd-controller";
/// From a pod's change to its slice, on a control plane with nobody else to wait for.
const GRACE: Duration = Duration::from_secs(3);
/// How long kube-controller-manager gets to publish again.
const UPSTREAM_BACK: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(30);
/// endpoints-guard's --opt-out-grace here: the label-only row outlasts it
/// several times over.
const OPT_OUT_GRACE: &str = "5s";

/// The pods: (name, IP), all labelled app=web.
const PODS: [(&str, &str); 3] = [
    ("web-0", "10.244.1.10"),
    ("web-1", "10.244.1.11"),
    ("web-2", "10.244.1.12"),
];

/// kube-controller-manager with every controller, its credentials as a
/// kubeadm cluster gives them.
fn every_controller(cp: &ControlPlane) -> Result<Process> {
    let pki = cp.pki();
    cp.start_controller_manager(
        "*",
        &[
            &format!(
                "--service-account-private-key-file={}",
                pki.sa_private_key.display()
            ),
            &format!("--root-ca-file={}", pki.ca_cert.display()),
        ],
    )
}

/// Node `NODE`, Ready, and a task that renews its Lease as a kubelet does,
/// so that kube-controller-manager's node lifecycle controller never
/// evicts the pods on it.
async fn live_node(client: &Client) -> Result<tokio::task::JoinHandle<()>> {
    create_node(client).await?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    let client = client.clone();
    let beat = async move {
        let nodes: Api<Node> = Api::all(client.clone());
        loop {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let status = json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
            let _ = nodes
                .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&status))
                .await;
            let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": NODE, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                         "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}});
            let _ = leases
                .patch(
                    NODE,
                    &PatchParams::apply("kubelet").force(),
                    &Patch::Apply(&lease),
                )
                .await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    };
    Ok(tokio::spawn(beat))
}

async fn create_node(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
    }))?;
    nodes.create(&Default::default(), &node).await?;
    Ok(())
}

async fn pods(cp: &ControlPlane) -> Result<()> {
    for (name, ip) in PODS {
        cp.create_pod_with_status(
            PodBuilder::serving(NS, name, "web").node_name(NODE),
            PodStatusSpec::ready([ip]),
        )
        .await?;
    }
    Ok(())
}

/// The application's Service as its Git repository holds it.
fn original(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

/// The same Service opted in, as docs/opt-in.md tells a GitOps user to
/// commit it: the labels, the selector in the annotation (`annotated`), no
/// `spec.selector`.
fn opted_in(name: &str, annotated: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS,
            "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
            "annotations": {ANNOTATION_SELECTOR: annotated}},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

/// A GitOps sync: the manifest server-side applied under [`GITOPS`].
async fn sync(client: &Client, manifest: &Value) -> Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), NS);
    let name = manifest["metadata"]["name"].as_str().context("name")?;
    api.patch(
        name,
        &PatchParams::apply(GITOPS).force(),
        &Patch::Apply(manifest),
    )
    .await
    .with_context(|| format!("applying {name}"))?;
    Ok(())
}

async fn merge_patch(client: &Client, name: &str, patch: Value) -> Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), NS);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The binary's subcommand `args`, with the control plane's kubeconfig:
/// its exit status and standard output.
fn subcommand(cp: &ControlPlane, args: &[&str]) -> Result<(bool, String)> {
    let out = Command::new(endpoints_guard())
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(args)
        .output()
        .context("running endpoints-guard")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "opt_in: endpoints-guard {}: {}\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), stdout))
}

fn manager(slice: &EndpointSlice) -> &str {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("endpointslice.kubernetes.io/managed-by"))
        .map_or("", String::as_str)
}

/// Managed-by values of the Service's slices, and the ready addresses the
/// slices of `by` publish.
fn published_by(watch: &ServiceWatch, by: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let slices = watch.slices();
    let managers = slices.iter().map(|s| manager(s).to_string()).collect();
    let ready = slices
        .iter()
        .filter(|s| manager(s) == by)
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    (managers, ready)
}

/// Waits until `by` alone (`alone`) or among others publishes every live
/// ready pod of the Service.
async fn wait_publishing(
    watch: &ServiceWatch,
    by: &str,
    alone: bool,
    timeout: Duration,
) -> Result<()> {
    eventually(
        timeout,
        &format!("{by} publishing (alone: {alone})"),
        || async {
            let (managers, ready) = published_by(watch, by);
            let (_, live) = watch.now();
            let who_ok = !alone || managers == BTreeSet::from([by.to_string()]);
            Ok((who_ok && !live.is_empty() && ready == live).then_some(()))
        },
    )
    .await
}

/// No moment of `watch` since `from` (when the rows began: before that
/// nobody had published yet) was wrong; `row` names it in the failure.
fn judged(watch: &ServiceWatch, row: &str, from: Instant) -> Result<()> {
    let moments = watch.moments();
    let wrong = wrong_moments(&moments, GRACE, from);
    ensure!(
        wrong.is_empty(),
        "{row}: {} of {} moments wrong: {:?}",
        wrong.len(),
        moments.len(),
        &wrong[..wrong.len().min(3)]
    );
    eprintln!("opt_in: {row}: 0 of {} moments wrong", moments.len());
    Ok(())
}

async fn wait_metric(guard: &Guard, series: &str, want: f64) -> Result<()> {
    eventually(WAIT, &format!("{series} = {want}"), || async {
        Ok((guard.metric(series) == want).then_some(()))
    })
    .await
}

fn state(name: &str) -> String {
    format!("endpoints_guard_opted_in_services{{state=\"{name}\"}}")
}

/// Every row in order on one control plane, with one kube-controller-manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_and_people_never_darken_an_opted_in_service() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    cp.create_namespace(NS).await?;
    let _heartbeat = live_node(&client).await?;
    let _kcm = every_controller(&cp)?;
    pods(&cp).await?;
    let guard = Guard::start(
        client.clone(),
        &[
            "--scope=opt-in",
            "--controllers=endpoints,endpointslices",
            &format!("--opt-out-grace={OPT_OUT_GRACE}"),
        ],
    )
    .await?;
    for name in ["web", "api", "typo"] {
        sync(&client, &original(name)).await?;
    }
    let web = ServiceWatch::start(&client, NS, "web", "app=web").await;
    let api = ServiceWatch::start(&client, NS, "api", "app=web").await;
    let typo = ServiceWatch::start(&client, NS, "typo", "app=web").await;
    for watch in [&web, &api, &typo] {
        wait_publishing(watch, UPSTREAM, true, WAIT).await?;
    }
    let from = Instant::now();

    // 1. The three opt-in changes in one apply (a commit in Git).
    let upstream_uids: BTreeSet<String> = web
        .slices()
        .iter()
        .filter_map(|s| s.metadata.uid.clone())
        .collect();
    sync(&client, &opted_in("web", r#"{"app":"web"}"#)).await?;
    wait_publishing(&web, OURS, true, WAIT).await?;
    let relabelled: Vec<_> = web
        .slices()
        .iter()
        .filter(|s| {
            s.metadata
                .uid
                .as_ref()
                .is_some_and(|u| upstream_uids.contains(u))
        })
        .map(|s| s.metadata.name.clone())
        .collect();
    ensure!(
        relabelled.is_empty(),
        "upstream's slices kept, relabelled: {relabelled:?}"
    );
    // Pods change under endpoints-guard alone.
    cp.set_pod_ready(NS, "web-1", PODS[1].1, false).await?;
    wait_publishing(&web, OURS, true, WAIT).await?;
    cp.set_pod_ready(NS, "web-1", PODS[1].1, true).await?;
    wait_publishing(&web, OURS, true, WAIT).await?;
    wait_metric(&guard, &state("protecting"), 1.0).await?;
    judged(&web, "three opt-in changes in one apply", from)?;

    // 2. GitOps re-applies the original manifest (a revert in Git): the
    // selector back, label and annotation gone, in one apply. The same
    // kube-controller-manager publishes again; endpoints-guard's go.
    sync(&client, &original("web")).await?;
    wait_publishing(&web, UPSTREAM, false, UPSTREAM_BACK)
        .await
        .context("kube-controller-manager publishing again after the opt-out")?;
    wait_publishing(&web, UPSTREAM, true, WAIT).await?;
    // ... and re-opts in.
    sync(&client, &opted_in("web", r#"{"app":"web"}"#)).await?;
    wait_publishing(&web, OURS, true, WAIT).await?;
    judged(
        &web,
        "GitOps re-apply of the original manifest, and re-opt-in",
        from,
    )?;

    // 3. A person opts `api` in with the subcommand; the GitOps tool's
    // self-heal re-applies the manifest in Git: the selector comes back,
    // the label and annotation (the subcommand's fields) stay.
    let (ok, _) = subcommand(&cp, &["opt-in", "shop/api", "--timeout=60s"])?;
    ensure!(ok, "opt-in shop/api failed");
    wait_publishing(&api, OURS, true, WAIT).await?;
    sync(&client, &original("api")).await?;
    wait_publishing(&api, UPSTREAM, false, UPSTREAM_BACK)
        .await
        .context("kube-controller-manager publishing beside endpoints-guard after the selector came back")?;
    wait_metric(&guard, &state("selector_restored"), 1.0).await?;
    let (ok, status) = subcommand(&cp, &["status"])?;
    ensure!(
        ok && status
            .lines()
            .any(|l| l.starts_with("shop/api\tselector_restored")),
        "status: {status}"
    );
    let (ok, _) = subcommand(&cp, &["opt-in", "shop/api", "--timeout=60s"])?;
    ensure!(ok, "opt-in shop/api again failed");
    wait_publishing(&api, OURS, true, WAIT).await?;
    wait_metric(&guard, &state("selector_restored"), 0.0).await?;
    judged(
        &api,
        "selector restored by a GitOps sync, then opted in again",
        from,
    )?;

    // 4. The label alone removed, left for several --opt-out-grace: still
    // published (nobody else would), reported; pods change meanwhile.
    merge_patch(
        &client,
        "web",
        json!({"metadata": {"labels": {LABEL_OPT_IN: null}}}),
    )
    .await?;
    wait_metric(&guard, &state("label_removed"), 1.0).await?;
    cp.set_pod_ready(NS, "web-2", PODS[2].1, false).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    wait_publishing(&web, OURS, true, WAIT).await?;
    cp.set_pod_ready(NS, "web-2", PODS[2].1, true).await?;
    wait_publishing(&web, OURS, true, WAIT).await?;
    merge_patch(
        &client,
        "web",
        json!({"metadata": {"labels": {LABEL_OPT_IN: "true"}}}),
    )
    .await?;
    wait_metric(&guard, &state("label_removed"), 0.0).await?;
    judged(&web, "label-only removal left longer than the grace", from)?;

    // 5. A wrong annotation in the one apply: nothing taken over, upstream's
    // slices keep serving, the Service frozen and reported; fixed, taken over.
    sync(&client, &opted_in("typo", r#"{"app":"wbe"}"#)).await?;
    wait_metric(
        &guard,
        "endpoints_guard_opt_in_frozen_services{reason=\"selector_misses_pods\"}",
        1.0,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (managers, _) = published_by(&typo, UPSTREAM);
    ensure!(
        managers.contains(UPSTREAM),
        "upstream's slices of typo gone though its annotation misses the pods: {managers:?}"
    );
    sync(&client, &opted_in("typo", r#"{"app":"web"}"#)).await?;
    wait_publishing(&typo, OURS, true, WAIT).await?;
    judged(&typo, "wrong annotation, then fixed", from)?;

    // 6. Opt-out with the subcommand, the same kube-controller-manager.
    let (ok, _) = subcommand(&cp, &["opt-out", "shop/web", "--timeout=60s"])?;
    ensure!(ok, "opt-out shop/web failed");
    wait_publishing(&web, UPSTREAM, true, WAIT).await?;
    judged(&web, "opt-out with the subcommand", from)?;

    // 7. The emergency path: a dry run changes nothing; then every
    // opted-in Service back to upstream.
    let (ok, printed) = subcommand(&cp, &["hand-back", "--all", "--dry-run"])?;
    ensure!(
        ok && printed.contains("shop/api") && printed.contains("shop/typo"),
        "{printed}"
    );
    wait_publishing(&api, OURS, true, WAIT).await?;
    let (ok, _) = subcommand(&cp, &["hand-back", "--all", "--timeout=60s"])?;
    ensure!(ok, "hand-back --all failed");
    for watch in [&api, &typo] {
        wait_publishing(watch, UPSTREAM, true, WAIT).await?;
    }
    judged(&api, "hand-back --all (api)", from)?;
    judged(&typo, "hand-back --all (typo)", from)?;
    let (_, status) = subcommand(&cp, &["status"])?;
    ensure!(
        status.contains("(no Service carries an opt-in)"),
        "{status}"
    );
    guard.stop().await;
    Ok(())
}

/// An API server that reports a minor newer than the newest rules:
/// endpoints-guard starts with the newest rules, says so in a metric, and
/// publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_api_server_runs_with_the_newest_rules() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    cp.create_namespace(NS).await?;
    let chaos = ChaosProxy::in_front_of(&cp).await?;
    chaos
        .fault("version", "server-version", json!({"minor": 40}))
        .await?;
    let through = chaos.client().await?;
    let version = through.apiserver_version().await?;
    ensure!(
        version.minor == "40",
        "watch-chaos did not rewrite /version: {version:?}"
    );
    cp.create_pod_with_status(
        PodBuilder::serving(NS, "web-0", "web"),
        PodStatusSpec::ready([PODS[0].1]),
    )
    .await?;
    sync(&client, &opted_in("web", r#"{"app":"web"}"#)).await?;
    let guard = Guard::start(
        through,
        &["--scope=opt-in", "--controllers=endpoints,endpointslices"],
    )
    .await?;
    ensure!(
        guard.metric("endpoints_guard_server_newer_than_rules") == 1.0,
        "not reported"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    eventually(WAIT, "endpoints-guard's slice of web", || async {
        let listed = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await?;
        Ok(listed
            .items
            .iter()
            .any(|s| manager(s) == OURS)
            .then_some(()))
    })
    .await?;
    guard.stop().await;
    Ok(())
}

/// What a takeover must do, on this release's kube-controller-manager: a
/// Service loses its selector, its slice is relabelled (`relabel`) or
/// deleted, the selector comes back. Returns whether
/// kube-controller-manager published a slice of its own again within
/// [`UPSTREAM_BACK`].
async fn upstream_publishes_again(relabel: bool) -> Result<bool> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    cp.create_namespace(NS).await?;
    create_node(&client).await?;
    let _kcm = cp.start_controller_manager("endpointslice-controller", &[])?;
    cp.create_pod_with_status(
        PodBuilder::serving(NS, "web-0", "web").node_name(NODE),
        PodStatusSpec::ready([PODS[0].1]),
    )
    .await?;
    sync(&client, &original("web")).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let of_web = ListParams::default().labels("kubernetes.io/service-name=web");
    let upstream = eventually(WAIT, "kube-controller-manager's slice of web", || async {
        Ok(slices
            .list(&of_web)
            .await?
            .items
            .into_iter()
            .find(|s| manager(s) == UPSTREAM))
    })
    .await?;
    merge_patch(&client, "web", json!({"spec": {"selector": null}})).await?;
    let name = upstream.metadata.name.clone().context("slice name")?;
    if relabel {
        let patch =
            json!({"metadata": {"labels": {"endpointslice.kubernetes.io/managed-by": OURS}}});
        slices
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    } else {
        slices.delete(&name, &Default::default()).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    merge_patch(
        &client,
        "web",
        json!({"spec": {"selector": {"app": "web"}}}),
    )
    .await?;
    let back = eventually(
        UPSTREAM_BACK,
        "kube-controller-manager publishing again",
        || async {
            Ok(slices
                .list(&of_web)
                .await?
                .items
                .iter()
                .any(|s| manager(s) == UPSTREAM)
                .then_some(()))
        },
    )
    .await;
    Ok(back.is_ok())
}

/// The failure a relabelling takeover caused, shown on the real
/// kube-controller-manager, and the deletion that avoids it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tracker_stalls_after_a_relabel_not_after_a_delete() -> Result<()> {
    ensure!(
        !upstream_publishes_again(true).await?,
        "kube-controller-manager published again after its slice was relabelled: the failure does not reproduce on this release"
    );
    ensure!(
        upstream_publishes_again(false).await?,
        "kube-controller-manager did not publish again after its slice was deleted"
    );
    Ok(())
}
