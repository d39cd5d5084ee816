//! The opt-in rows of `make e2e-node`: kube-controller-manager with all its
//! controllers (the node's, and the two endpoint controllers behind their
//! watch-chaos), endpoints-guard installed by the chart in opt-in scope
//! beside them (its pods behind their own watch-chaos sidecars), and one
//! Deployment behind two Services: `web`, which opts in during the first
//! row and out during the last, and `web-plain`, which never does. Traffic
//! goes to both through every row; `web`'s rows are endpoints-guard's and
//! `web-plain`'s kube-controller-manager's. A fault reaches every
//! watch-chaos, except the Service DELETE, which is replayed to
//! kube-controller-manager alone (its Endpoints controller then deletes
//! `web`'s Endpoints: endpoints-guard must restore them).
//!
//! Besides traffic: after the opt-in upstream's slices of `web` are gone
//! and its Endpoints are endpoints-guard's (skip-mirror); no mirrored slice
//! of `web` ever appears; nothing upstream writes touches `web`'s objects
//! afterwards (managedFields); `helm uninstall` is refused while `web` is
//! opted in; after the opt-out nothing of endpoints-guard's is left and the
//! uninstall goes through.

use std::collections::BTreeSet;

use endpoints_guard::desired::scope::{ANNOTATION_SELECTOR, LABEL_OPT_IN, LABEL_SKIP_MIRROR};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;

use super::*;

const SCOPE: &str = "opt-in";
pub(super) const PLAIN: &str = "web-plain";
const OPT_IN: &str = "opt in under traffic";
const OPT_OUT: &str = "opt out under traffic";
const FAILURE_A: &str = "failure A: old pod DELETEs replayed";
const SERVICE_DELETE: &str = "Service DELETE replayed to kube-controller-manager";
const SELECTOR_BACK: &str = "selector re-applied by a GitOps sync, then removed again";
const LABEL_REMOVED: &str = "label removed alone, left past the opt-out grace";
const REVERT: &str = "opt-in reverted in one apply, then re-applied in one apply";
const TYPO: &str = "an annotation that misses the pods, in one apply";
const NEWER_MINOR: &str = "API server reporting a newer minor";
/// The rows in which no request to `web` may fail at all, and none to
/// `web-plain` by wrong endpoints (see [`verdict`]).
const GAPLESS: [&str; 7] = [
    OPT_IN,
    SELECTOR_BACK,
    LABEL_REMOVED,
    REVERT,
    TYPO,
    NEWER_MINOR,
    OPT_OUT,
];
/// The opt-out grace the chart is installed with here: the label-only row
/// outlasts it several times over.
const OPT_OUT_GRACE_S: u64 = 10;
/// How long kube-controller-manager gets to publish again.
const UPSTREAM_BACK: Duration = Duration::from_secs(20);
const OUR_MANAGER: &str = "endpoints-guard";
const UPSTREAM_SLICES: &str = "endpointslice-controller.k8s.io";
const MIRRORING: &str = "endpointslicemirroring-controller.k8s.io";
/// The field manager kube-controller-manager's writes carry.
const UPSTREAM_FIELD_MANAGER: &str = "kube-controller-manager";
/// The field manager Argo CD's server-side apply uses.
const GITOPS: &str = "argocd-controller";

/// The two Services' watches and addresses.
struct Pair {
    web: ServiceWatch,
    plain: ServiceWatch,
    web_ip: SocketAddr,
    plain_ip: SocketAddr,
}

/// What the opt-in rows must show besides endpoints-guard's 0 requests
/// failed by wrong endpoints everywhere: while `web` opted in or out, no
/// request to it failed at all, and none to `web-plain` by wrong endpoints
/// (what a change to `web` could do to it: a slice or rule of the wrong
/// Service). A request to `web-plain` that timed out with its endpoints
/// right is the node's, not the row's: one SYN dropped costs the second a
/// request is given (seen once in 110, in a row that changes nothing of
/// `web-plain`). In the full form the replayed DELETEs must hurt
/// kube-controller-manager's Service (the short form reports it: the replay
/// has been seen not to bite, by chance).
pub(super) fn verdict(rows: &[Row], form: Form) -> Result<()> {
    for row in rows
        .iter()
        .filter(|r| r.scope == SCOPE && GAPLESS.contains(&r.name.as_str()))
    {
        let failed = match row.service.as_str() {
            PLAIN => row.failed_wrong_endpoints,
            _ => row.failed_wrong_endpoints + row.failed_other,
        };
        ensure!(
            failed == 0,
            "{} ({}): {failed} requests failed: {:?} {:?}",
            row.name,
            row.service,
            row.examples,
            row.other_examples
        );
    }
    let bitten = rows.iter().any(|r| {
        r.scope == SCOPE
            && r.name == FAILURE_A
            && r.controller == UPSTREAM
            && r.failed_wrong_endpoints > 0
    });
    match form {
        Form::Full => ensure!(
            bitten,
            "{FAILURE_A} did not hurt kube-controller-manager's {PLAIN}: the opt-in rows prove nothing about it"
        ),
        Form::Short if !bitten => {
            eprintln!("e2e_node: {SCOPE}: {FAILURE_A} did not hurt {PLAIN} this time")
        }
        Form::Short => {}
    }
    Ok(())
}

/// The rows; returns the writers, kube-controller-manager's still running.
pub(super) async fn rows(run: &mut Run<'_>, mut writer: Writer) -> Result<Writer> {
    let grace = format!("optOutGrace={OPT_OUT_GRACE_S}s");
    run.install_chart_with(&["scope=opt-in", &grace]).await?;
    run.deploy_workload().await?;
    let services: Api<Service> = Api::namespaced(run.client.clone(), TEST_NS);
    services
        .create(&PostParams::default(), &service(PLAIN))
        .await?;
    let pair = Pair {
        web: ServiceWatch::start(&run.client, TEST_NS, SERVICE, "app=web").await,
        plain: ServiceWatch::start(&run.client, TEST_NS, PLAIN, "app=web").await,
        web_ip: cluster_ip(&services, SERVICE).await?,
        plain_ip: cluster_ip(&services, PLAIN).await?,
    };
    // The same kube-controller-manager from the opt-in to the end of the
    // revert row: nothing restarted between an opt-in and an opt-out.
    let mut names = vec![
        OPT_IN,
        SELECTOR_BACK,
        LABEL_REMOVED,
        REVERT,
        TYPO,
        NEWER_MINOR,
        FAILURE_A,
    ];
    if run.form == Form::Full {
        names.extend([
            "lost pod DELETE",
            "rolling update",
            SERVICE_DELETE,
            "leader pod deleted",
            "kube-controller-manager restarted",
        ]);
    }
    names.push(OPT_OUT);
    let mut taken_over_at = None;
    for name in names {
        // The documented steps never let kube-controller-manager's mirroring
        // controller mirror web's Endpoints: skip-mirror reaches them while
        // the selector is still there. The one-patch opt-in of the revert
        // row cannot promise that (the selector goes before endpoints-guard
        // rewrites the frozen Endpoints), so mirrored slices are checked
        // up to it, and for being gone at the end.
        if name == REVERT {
            ensure!(
                !pair.web.managers_seen().contains(MIRRORING),
                "a mirrored slice of {SERVICE} appeared: {:?}",
                pair.web.managers_seen()
            );
        }
        if name == OPT_OUT {
            let taken_over_at = taken_over_at.context("the opt-out row before the opt-in's")?;
            nothing_written_by_upstream_since(&run.client, taken_over_at).await?;
            uninstall_refused(run).await?;
        }
        run_row(run, name, &mut writer, &pair).await?;
        // Rows that end with a takeover move the moment from which nobody
        // but endpoints-guard may write web's objects.
        if [OPT_IN, SELECTOR_BACK, REVERT].contains(&name) {
            taken_over_at = Some(taken_over(&run.client).await?);
        }
    }
    ensure!(
        !managers_now(&pair.web).contains(MIRRORING),
        "a mirrored slice of {SERVICE} is left: {:?}",
        managers_now(&pair.web)
    );
    nothing_left(&run.client, &pair.web).await?;
    helm(
        run.node,
        &["uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait"],
    )
    .context("helm uninstall once no Service is opted in")?;
    eprintln!("e2e_node: opt-in: uninstalled once nothing was opted in");
    Ok(writer)
}

/// One row: traffic to both Services while `name` happens, a verdict for
/// each, then both must publish their pods again.
async fn run_row(run: &mut Run<'_>, name: &str, writer: &mut Writer, pair: &Pair) -> Result<()> {
    for watch in [&pair.web, &pair.plain] {
        wait_published(watch, 3, Duration::from_secs(60)).await?;
    }
    for target in [pair.web_ip, pair.plain_ip] {
        wait_serving(target, 20, Duration::from_secs(60))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    eprintln!("e2e_node: {SCOPE}: {name}");
    let web_traffic = Traffic::start(pair.web_ip, RATE, MAX_ROW);
    let plain_traffic = Traffic::start(pair.plain_ip, RATE, MAX_ROW);
    let note = scenario(run, name, writer, pair)
        .await
        .with_context(|| format!("{SCOPE}: {name}"))?;
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let judged = [
        (SERVICE, GUARD, web_traffic.finish().await, &pair.web),
        (PLAIN, UPSTREAM, plain_traffic.finish().await, &pair.plain),
    ];
    for (service_name, controller, samples, watch) in judged {
        let moments = watch.moments();
        let verdict = judge(&samples, &moments, GRACE, GAP);
        if let Some(first) = samples.iter().find(|s| !s.ok) {
            let who = format!("{SCOPE}-{service_name}-{controller}");
            write_timeline(&run.out, &who, name, first.at, &samples, &moments)?;
        }
        eprintln!("e2e_node: {SCOPE}: {name}: {service_name}: {verdict:?} {note}");
        run.rows.push(Row::scoped(
            name,
            controller,
            SCOPE,
            service_name,
            verdict,
            note.clone(),
        ));
    }
    clear_faults(writer, &run.client).await?;
    converge(run, writer, pair, name).await
}

/// Between rows both Services must publish their pods again: `web`
/// through endpoints-guard alone; `web-plain` through kube-controller-
/// manager, restarted (a fresh list) when a fault left it wrong.
async fn converge(run: &mut Run<'_>, writer: &mut Writer, pair: &Pair, row: &str) -> Result<()> {
    wait_published_exactly(&pair.web, 3, Duration::from_secs(60))
        .await
        .with_context(|| format!("endpoints-guard ({SERVICE}) after {row}"))?;
    if wait_published_exactly(&pair.plain, 3, Duration::from_secs(60))
        .await
        .is_err()
    {
        eprintln!(
            "e2e_node: {SCOPE}: kube-controller-manager did not recover {PLAIN} from {row}: restarting it"
        );
        restart_upstream(run, writer).await?;
        wait_published_exactly(&pair.plain, 3, Duration::from_secs(60)).await?;
    }
    Ok(())
}

async fn restart_upstream(run: &mut Run<'_>, writer: &mut Writer) -> Result<()> {
    let Writer::Both { chaos, kcm } = writer else {
        bail!("the opt-in rows run with both writers");
    };
    kcm.stop().await?;
    *kcm = start_upstream(run.node, chaos)?;
    Ok(())
}

async fn scenario(
    run: &mut Run<'_>,
    name: &str,
    writer: &mut Writer,
    pair: &Pair,
) -> Result<String> {
    let services: Api<Service> = Api::namespaced(run.client.clone(), TEST_NS);
    let deployments: Api<Deployment> = Api::namespaced(run.client.clone(), TEST_NS);
    match name {
        OPT_IN => {
            opt_in_web(&services, &pair.web).await?;
            Ok("web labelled and annotated, then its selector removed".to_string())
        }
        OPT_OUT => {
            let patch = json!({"spec": {"selector": {"app": "web"}}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_until(
                "upstream's slices of web beside endpoints-guard's",
                Duration::from_secs(60),
                || publishes_every_pod(&pair.web, UPSTREAM_SLICES),
            )
            .await?;
            let patch =
                json!({"metadata": {"labels": {LABEL_OPT_IN: null, LABEL_SKIP_MIRROR: null}}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_until(
                "endpoints-guard's slices of web to go",
                Duration::from_secs(60),
                || managers_now(&pair.web) == BTreeSet::from([UPSTREAM_SLICES.to_string()]),
            )
            .await?;
            Ok("web's selector back, then its label removed".to_string())
        }
        FAILURE_A => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut pods_by_rv: Vec<(u64, String)> = pair
                .web
                .pods()
                .iter()
                .filter_map(|p| {
                    let rv = p.metadata.resource_version.as_ref()?.parse().ok()?;
                    Some((rv, p.metadata.name.clone()?))
                })
                .collect();
            pods_by_rv.sort();
            for (_, pod) in &pods_by_rv {
                replay_old_delete(writer, &run.client, pod).await?;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            tokio::time::sleep(Duration::from_secs(15)).await;
            Ok(format!(
                "{} pods replayed as deleted to every watch",
                pods_by_rv.len()
            ))
        }
        "lost pod DELETE" => {
            chaos_fault(writer, &run.client, "pods", "drop-deletes").await?;
            let (pod, ip) = some_ready_pod(&pair.web)?;
            let pods: Api<Pod> = Api::namespaced(run.client.clone(), TEST_NS);
            pods.delete(&pod, &DeleteParams::default()).await?;
            // Until endpoints-guard drops it from web, then up to 30 s for
            // kube-controller-manager to drop it from web-plain.
            let deadline = Instant::now() + Duration::from_secs(60);
            while pair.web.now().0.contains(&ip) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while pair.plain.now().0.contains(&ip) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let left = |watch: &ServiceWatch| {
                if watch.now().0.contains(&ip) {
                    "still published"
                } else {
                    "gone"
                }
            };
            Ok(format!(
                "{pod} deleted unseen by every watch; its address: {} from web, {} from web-plain",
                left(&pair.web),
                left(&pair.plain)
            ))
        }
        "rolling update" => {
            let patch = json!({"spec": {"template": {"metadata": {"annotations": {
                "e2e/rollout": format!("{:?}", Instant::now())}}}}});
            deployments
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_rolled_out(&deployments).await?;
            Ok("3 pods replaced one by one".to_string())
        }
        SERVICE_DELETE => {
            let endpoints: Api<Endpoints> = Api::namespaced(run.client.clone(), TEST_NS);
            let before = endpoints.get(SERVICE).await?.metadata.uid;
            let slices_before = slice_uids(&pair.web);
            let Writer::Both { chaos, .. } = &*writer else {
                bail!("the opt-in rows run with both writers");
            };
            replay_old_delete_to(&[host_chaos(chaos)], "services", SERVICE).await?;
            wait_until_async(
                "web's Endpoints deleted by kube-controller-manager and restored",
                Duration::from_secs(30),
                || async {
                    endpoints
                        .get_opt(SERVICE)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|ep| {
                            ep.metadata.uid != before && managed_by(&ep) == Some(OUR_MANAGER)
                        })
                },
            )
            .await?;
            ensure!(
                slice_uids(&pair.web) == slices_before,
                "web's slices changed: {slices_before:?} → {:?}",
                slice_uids(&pair.web)
            );
            Ok(
                "kube-controller-manager deleted web's Endpoints; restored, slices untouched"
                    .to_string(),
            )
        }
        SELECTOR_BACK => {
            let back = json!({"spec": {"selector": {"app": "web"}}});
            services
                .patch(
                    SERVICE,
                    &PatchParams::apply(GITOPS).force(),
                    &Patch::Apply(&applied(back)),
                )
                .await?;
            wait_until(
                "kube-controller-manager publishing web beside endpoints-guard",
                UPSTREAM_BACK,
                || publishes_every_pod(&pair.web, UPSTREAM_SLICES),
            )
            .await?;
            reported(&run.client, "SelectorRestored").await?;
            remove_selector(&services).await?;
            wait_taken_over(pair).await?;
            Ok("selector back by server-side apply: upstream published beside endpoints-guard; removed: taken over again".to_string())
        }
        LABEL_REMOVED => {
            let off = json!({"metadata": {"labels": {LABEL_OPT_IN: null}}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&off))
                .await?;
            reported(&run.client, "OptInLabelRemoved").await?;
            churn(&deployments, pair).await?;
            tokio::time::sleep(Duration::from_secs(3 * OPT_OUT_GRACE_S)).await;
            ensure!(
                publishes_every_pod(&pair.web, OUR_MANAGER),
                "endpoints-guard stopped publishing web after its label was removed"
            );
            let on = json!({"metadata": {"labels": {LABEL_OPT_IN: "true"}}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&on))
                .await?;
            Ok(format!(
                "label off for {}s (3 × the grace) with 3 → 4 → 3 replicas; still published; label back",
                3 * OPT_OUT_GRACE_S
            ))
        }
        REVERT => {
            let revert = json!({"metadata": {
                "labels": {LABEL_OPT_IN: null, LABEL_SKIP_MIRROR: null},
                "annotations": {ANNOTATION_SELECTOR: null}},
                "spec": {"selector": {"app": "web"}}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&revert))
                .await?;
            wait_until(
                "kube-controller-manager publishing web again, the same process",
                UPSTREAM_BACK,
                || publishes_every_pod(&pair.web, UPSTREAM_SLICES),
            )
            .await?;
            wait_until(
                "endpoints-guard's slices of web to go",
                Duration::from_secs(60),
                || managers_now(&pair.web) == BTreeSet::from([UPSTREAM_SLICES.to_string()]),
            )
            .await?;
            let opt_in = json!({"metadata": {
                "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
                "annotations": {ANNOTATION_SELECTOR: r#"{"app":"web"}"#}},
                "spec": {"selector": null}});
            services
                .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&opt_in))
                .await?;
            wait_taken_over(pair).await?;
            Ok("one patch back to the original, one patch opting in again".to_string())
        }
        TYPO => {
            let typo = json!({"metadata": {
                "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
                "annotations": {ANNOTATION_SELECTOR: r#"{"app":"wbe"}"#}},
                "spec": {"selector": null}});
            services
                .patch(PLAIN, &PatchParams::default(), &Patch::Merge(&typo))
                .await?;
            reported_on(&run.client, PLAIN, "OptInInvalid").await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            ensure!(
                publishes_every_pod(&pair.plain, UPSTREAM_SLICES),
                "web-plain's upstream slices no longer serve: {:?}",
                managers_now(&pair.plain)
            );
            let undo = json!({"metadata": {
                "labels": {LABEL_OPT_IN: null, LABEL_SKIP_MIRROR: null},
                "annotations": {ANNOTATION_SELECTOR: null}},
                "spec": {"selector": {"app": "web"}}});
            services
                .patch(PLAIN, &PatchParams::default(), &Patch::Merge(&undo))
                .await?;
            Ok("web-plain opted in with {\"app\":\"wbe\"}: frozen, upstream's slices kept serving; undone".to_string())
        }
        NEWER_MINOR => {
            // Every replica's watch-chaos answers /version with minor 40; the
            // chart's pods roll, and start with the newest rules.
            let newer = r#"chaos.args=["--listen=127.0.0.1:8001","--control=0.0.0.0:8002","--fault=version:server-version:minor=40"]"#;
            upgrade_chart(run.node, &["--set-json", newer])?;
            wait_until_async(
                "a replica warning of the newer server",
                Duration::from_secs(60),
                || async {
                    controller_logs_contain(&run.client, "newer than the newest rules").await
                },
            )
            .await?;
            churn(&deployments, pair).await?;
            Ok(
                "chart pods rolled behind watch-chaos reporting 1.40; they run with 1.37's rules"
                    .to_string(),
            )
        }
        "leader pod deleted" => {
            let leases: Api<Lease> = Api::namespaced(run.client.clone(), SYSTEM_NS);
            let leader = lease_holder(&leases).await?;
            let eg_pods: Api<Pod> = Api::namespaced(run.client.clone(), SYSTEM_NS);
            eg_pods.delete(&leader, &DeleteParams::default()).await?;
            wait_until_async("the Lease to move", Duration::from_secs(60), || async {
                let holder = lease_holder(&leases).await.unwrap_or_default();
                !holder.is_empty() && holder != leader
            })
            .await?;
            churn(&deployments, pair).await?;
            Ok(format!("{leader} deleted; then 3 → 4 → 3 replicas"))
        }
        "kube-controller-manager restarted" => {
            restart_upstream(run, writer).await?;
            churn(&deployments, pair).await?;
            Ok("its endpoint controllers restarted; then 3 → 4 → 3 replicas".to_string())
        }
        other => bail!("no opt-in scenario {other}"),
    }
}

/// 3 → 4 → 3 replicas, both Services following.
async fn churn(deployments: &Api<Deployment>, pair: &Pair) -> Result<()> {
    scale(deployments, 4).await?;
    for watch in [&pair.web, &pair.plain] {
        wait_published(watch, 4, Duration::from_secs(60)).await?;
    }
    scale(deployments, 3).await?;
    for watch in [&pair.web, &pair.plain] {
        wait_published_exactly(watch, 3, Duration::from_secs(60)).await?;
    }
    Ok(())
}

pub(super) async fn cluster_ip(services: &Api<Service>, name: &str) -> Result<SocketAddr> {
    let ip: IpAddr = services
        .get(name)
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .with_context(|| format!("{name} has no ClusterIP"))?
        .parse()?;
    Ok(SocketAddr::new(ip, 80))
}

fn slice_manager(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get("endpointslice.kubernetes.io/managed-by")
        .map(String::as_str)
}

fn managed_by(ep: &Endpoints) -> Option<&str> {
    ep.metadata
        .labels
        .as_ref()?
        .get("endpoints.kubernetes.io/managed-by")
        .map(String::as_str)
}

/// The managed-by values of the Service's slices now.
fn managers_now(watch: &ServiceWatch) -> BTreeSet<String> {
    watch
        .slices()
        .iter()
        .filter_map(|s| slice_manager(s).map(str::to_string))
        .collect()
}

/// Whether the slices of `manager` alone publish every live ready pod.
fn publishes_every_pod(watch: &ServiceWatch, manager: &str) -> bool {
    let ready: BTreeSet<String> = watch
        .slices()
        .iter()
        .filter(|s| slice_manager(s) == Some(manager))
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    let (_, live) = watch.now();
    live.len() == 3 && ready == live
}

fn slice_uids(watch: &ServiceWatch) -> BTreeSet<String> {
    watch
        .slices()
        .iter()
        .filter_map(|s| s.metadata.uid.clone())
        .collect()
}

/// After the opt-in: web's Endpoints are endpoints-guard's and carry
/// skip-mirror. Returns when its write took them over.
async fn taken_over(client: &Client) -> Result<Timestamp> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), TEST_NS);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ep = endpoints.get(SERVICE).await?;
        let skip_mirror = ep
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SKIP_MIRROR))
            .map(String::as_str);
        let ours = ep
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|f| f.manager.as_deref() == Some(OUR_MANAGER))
            .filter_map(|f| f.time.as_ref().map(|t| t.0))
            .max();
        if let (Some(OUR_MANAGER), Some("true"), Some(at)) = (managed_by(&ep), skip_mirror, ours) {
            return Ok(at);
        }
        ensure!(
            Instant::now() < deadline,
            "web's Endpoints not taken over: labels {:?}",
            ep.metadata.labels
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// No write of kube-controller-manager's to web's Endpoints or slices after
/// endpoints-guard took them over (a deletion is not a write, and the
/// restored Endpoints are a new object).
async fn nothing_written_by_upstream_since(client: &Client, since: Timestamp) -> Result<()> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), TEST_NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), TEST_NS);
    let ep = endpoints.get(SERVICE).await?;
    let listed = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={SERVICE}")))
        .await?;
    let entries = ep
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|f| (format!("Endpoints {SERVICE}"), f))
        .chain(listed.items.iter().flat_map(|s| {
            let name = format!(
                "EndpointSlice {}",
                s.metadata.name.clone().unwrap_or_default()
            );
            s.metadata
                .managed_fields
                .iter()
                .flatten()
                .map(move |f| (name.clone(), f))
        }));
    let late: Vec<String> = entries
        .filter(|(_, f)| f.manager.as_deref() != Some(OUR_MANAGER))
        .filter(|(_, f)| f.time.as_ref().is_some_and(|t| t.0 > since))
        .map(|(what, f)| format!("{what}: {:?} at {:?}", f.manager, f.time))
        .collect();
    ensure!(
        late.is_empty(),
        "written by someone else after endpoints-guard took web over at {since}: {late:?}"
    );
    let upstream_slices: Vec<_> = listed
        .items
        .iter()
        .filter(|s| slice_manager(s) != Some(OUR_MANAGER))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    ensure!(
        upstream_slices.is_empty(),
        "slices of web not endpoints-guard's: {upstream_slices:?}"
    );
    eprintln!(
        "e2e_node: {SCOPE}: no write by {UPSTREAM_FIELD_MANAGER} or anyone else to web's objects since {since}"
    );
    Ok(())
}

/// `helm uninstall` while web is opted in: the pre-delete check fails and
/// names it, and the controller keeps running.
async fn uninstall_refused(run: &mut Run<'_>) -> Result<()> {
    let refused = helm_result(
        run.node,
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            SYSTEM_NS,
            "--wait",
            "--timeout",
            "120s",
        ],
    )?;
    let Err(why) = refused else {
        bail!("helm uninstall went through while {TEST_NS}/{SERVICE} was opted in");
    };
    let jobs: Api<Pod> = Api::namespaced(run.client.clone(), SYSTEM_NS);
    let check = jobs
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name"))
        .await?;
    let mut logs = String::new();
    for pod in &check.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        logs.push_str(
            &jobs
                .logs(&name, &Default::default())
                .await
                .unwrap_or_default(),
        );
    }
    ensure!(
        logs.contains(&format!("{TEST_NS}/{SERVICE}")),
        "the pre-delete check's log does not name {TEST_NS}/{SERVICE}: {logs:?} (helm: {why})"
    );
    let leases: Api<Lease> = Api::namespaced(run.client.clone(), SYSTEM_NS);
    ensure!(
        !lease_holder(&leases).await?.is_empty(),
        "nobody leads after the refused uninstall"
    );
    eprintln!("e2e_node: {SCOPE}: helm uninstall refused while web is opted in");
    Ok(())
}

/// After the opt-out: no slice of endpoints-guard's for web, and its
/// Endpoints are upstream's again.
async fn nothing_left(client: &Client, web: &ServiceWatch) -> Result<()> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), TEST_NS);
    wait_until_async(
        "web's Endpoints upstream's again",
        Duration::from_secs(30),
        || async {
            endpoints
                .get_opt(SERVICE)
                .await
                .ok()
                .flatten()
                .is_some_and(|ep| managed_by(&ep) == Some("endpoint-controller"))
        },
    )
    .await?;
    let left: Vec<_> = web
        .slices()
        .iter()
        .filter(|s| slice_manager(s) == Some(OUR_MANAGER))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    ensure!(left.is_empty(), "endpoints-guard's slices left: {left:?}");
    Ok(())
}

/// The manifest of `web` as a GitOps tool applies it: its own fields only.
fn applied(spec: Value) -> Value {
    let mut manifest = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": TEST_NS}});
    if let (Some(target), Some(fields)) = (manifest.as_object_mut(), spec.as_object()) {
        for (key, value) in fields {
            target.insert(key.clone(), value.clone());
        }
    }
    manifest
}

/// `web` opted in by docs/opt-in.md's steps: the selector into the
/// annotation, the labels, endpoints-guard's slices beside upstream's, then
/// the selector goes; done when endpoints-guard alone publishes it.
pub(super) async fn opt_in_web(services: &Api<Service>, web: &ServiceWatch) -> Result<()> {
    let patch = json!({"metadata": {
        "annotations": {ANNOTATION_SELECTOR: r#"{"app":"web"}"#},
        "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
    }});
    services
        .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_until(
        "endpoints-guard's slices of web beside upstream's",
        Duration::from_secs(60),
        || publishes_every_pod(web, OUR_MANAGER),
    )
    .await?;
    remove_selector(services).await?;
    wait_until(
        "upstream's slices of web taken over",
        Duration::from_secs(60),
        || {
            publishes_every_pod(web, OUR_MANAGER)
                && managers_now(web) == BTreeSet::from([OUR_MANAGER.to_string()])
        },
    )
    .await
}

async fn remove_selector(services: &Api<Service>) -> Result<()> {
    let remove = json!({"spec": {"selector": null}});
    services
        .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&remove))
        .await?;
    Ok(())
}

/// endpoints-guard alone publishes every pod of web.
async fn wait_taken_over(pair: &Pair) -> Result<()> {
    wait_until(
        "web taken over by endpoints-guard",
        Duration::from_secs(60),
        || {
            publishes_every_pod(&pair.web, OUR_MANAGER)
                && managers_now(&pair.web) == BTreeSet::from([OUR_MANAGER.to_string()])
        },
    )
    .await
}

/// A Warning Event `reason` on Service web.
async fn reported(client: &Client, reason: &str) -> Result<()> {
    reported_on(client, SERVICE, reason).await
}

/// A Warning Event `reason` on Service `name`, from endpoints-guard.
async fn reported_on(client: &Client, name: &str, reason: &str) -> Result<()> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), TEST_NS);
    let fields = format!("involvedObject.name={name},reason={reason}");
    wait_until_async(
        &format!("Event {reason} on {name}"),
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default().fields(&fields))
                .await
                .is_ok_and(|l| !l.items.is_empty())
        },
    )
    .await
}

/// Whether a log line of a running controller pod contains `text`.
async fn controller_logs_contain(client: &Client, text: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let Ok(running) = controller_pods(client).await else {
        return false;
    };
    for pod in running {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let params = LogParams {
            container: Some("endpoints-guard".to_string()),
            ..LogParams::default()
        };
        if pods
            .logs(&name, &params)
            .await
            .is_ok_and(|l| l.contains(text))
        {
            return true;
        }
    }
    false
}
