//! The lost DELETE at scale, at the chart's defaults: the node runs two
//! kube-apiservers on one etcd (`NodeOptions::two_api_servers`); the first,
//! the `kubernetes` Service's, which the controllers use, loses every event
//! of one `web` pod (etcd-fault-proxy); the second, which the kubelet,
//! kube-proxy and this test's judge use, does not. The pod is deleted: its
//! kubelet stops it, yet the first API server's watch cache keeps it Ready in
//! every watch and consistent LIST, so its address stays published until a
//! controller learns from etcd that it is gone. Beside the real node, KWOK
//! plays fake nodes running other Services' pods (at least 10,000 pods and
//! 1,000 Services in the full form), so the controllers work at scale.
//! endpoints-guard runs the chart at its defaults (no ghost-scan override:
//! its resync's exact-RV list, which the first API server serves from etcd
//! once its consistency check found the ghost, docs/ghosts.md), then
//! kube-controller-manager's endpoint controllers; the requests failed by
//! wrong endpoints and the time until the dead pod's address left the
//! slices are reported for both.

use std::collections::BTreeMap;

use eg_harness::process::Process;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::*;

/// The row's name.
pub(super) const ROW: &str = eg_node::AT_SCALE_ROW;
/// The fake nodes' Services and pods.
const SCALE_NS: &str = "eg-scale";
/// The taint that keeps every other pod off the fake nodes.
const FAKE_NODE_TAINT: &str = "kwok.x-k8s.io/node";
/// kube-apiserver's check every 5 to 7.5 minutes, then the resync at its
/// default 90 s: 9 minutes, and the reads and writes after. The
/// short form's API server compacts every minute, which drops its cache's
/// snapshots sooner (docs/ghosts.md): about two minutes.
fn bound(form: Form) -> Duration {
    match form {
        Form::Full => Duration::from_secs(600),
        Form::Short => Duration::from_secs(240),
    }
}

/// How long a column watches for the dead pod's address to go:
/// endpoints-guard's bound and a minute; kube-controller-manager, which
/// never learns of it, in the short form only two minutes.
fn window(form: Form, controller: &str) -> Duration {
    match (form, controller) {
        (Form::Short, UPSTREAM) => Duration::from_secs(120),
        _ => bound(form) + Duration::from_secs(60),
    }
}

/// kube-apiserver's `--etcd-compaction-interval` for the node: its default
/// in the full form, a minute in the short one.
pub(super) fn compaction_interval(form: Form) -> Option<Duration> {
    match form {
        Form::Full => None,
        Form::Short => Some(Duration::from_secs(60)),
    }
}

/// What the fake nodes run.
#[derive(Clone, Copy, Debug)]
struct Scale {
    services: usize,
    pods_per_service: usize,
    nodes: usize,
}

impl Scale {
    fn of(form: Form) -> Self {
        match form {
            Form::Full => Scale {
                services: 1_000,
                pods_per_service: 10,
                nodes: 100,
            },
            Form::Short => Scale {
                services: 20,
                pods_per_service: 5,
                nodes: 2,
            },
        }
    }

    fn pods(self) -> usize {
        self.services * self.pods_per_service
    }
}

/// Both columns of the row: endpoints-guard (the chart at its defaults, in
/// all scope) and kube-controller-manager's endpoint controllers, each with
/// a ghost of its own. `kcm` is the upstream controllers' process of the
/// earlier rows, if any, stopped first.
pub(super) async fn rows(run: &mut Run<'_>, kcm: Option<Process>) -> Result<()> {
    if let Some(mut kcm) = kcm {
        kcm.stop().await?;
    }
    let scale = Scale::of(run.form);
    let truth = run.node.truth();
    let _kwok = fake_nodes(run, scale).await?;
    let target = web_address(&truth).await?;
    let watch = ServiceWatch::start(&truth, TEST_NS, SERVICE, "app=web").await;

    // endpoints-guard, at the chart's defaults but for the test image and
    // the short Lease (the node values' scan and resync overrides undone).
    run.install_chart_with(&[
        "scope=all",
        "chaos.enabled=false",
        "ghostScanPeriod=6h",
        "resyncInterval=90s",
    ])
    .await?;
    let row = ghost_row(run, GUARD, &watch, target, scale).await;
    let log_dir = run.node.cp.log_dir().to_path_buf();
    if let Err(err) = save_controller_logs(&run.client, &log_dir, "at-scale").await {
        eprintln!("e2e_node: the controller's logs were not saved: {err:#}");
    }
    run.rows.push(row?);
    helm(
        run.node,
        &["uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait"],
    )?;

    // kube-controller-manager's endpoint controllers, straight to the first
    // API server.
    let kubeconfig = format!("--kubeconfig={}", run.node.cp.kubeconfig_path().display());
    let mut upstream = run.node.cp.start_controller_manager(
        "endpoints-controller,endpointslice-controller",
        &[&kubeconfig],
    )?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let row = ghost_row(run, UPSTREAM, &watch, target, scale).await;
    upstream.stop().await?;
    run.rows.push(row?);
    Ok(())
}

/// One column: a web pod's events lost in the first API server's watch
/// cache, the pod deleted, traffic to web until its address left the
/// slices or [`WINDOW`] passed; then the ghost cleared (a restart of that
/// API server) for the next column.
async fn ghost_row(
    run: &mut Run<'_>,
    controller: &str,
    watch: &ServiceWatch,
    target: SocketAddr,
    scale: Scale,
) -> Result<Row> {
    wait_published_exactly(watch, 3, Duration::from_secs(180)).await?;
    wait_serving(target, 20, Duration::from_secs(60))
        .await
        .map_err(anyhow::Error::msg)?;
    eprintln!("e2e_node: {controller}: {ROW}");
    let window = window(run.form, controller);
    let traffic = Traffic::start(target, RATE, window + Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (pod, ip) = some_ready_pod(watch)?;
    run.node
        .cp
        .etcd_drop_events(
            &format!("/registry/pods/{TEST_NS}/{pod}"),
            &["PUT", "DELETE"],
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(run.node.truth(), TEST_NS);
    pods.delete(&pod, &DeleteParams::default()).await?;
    let deleted = Instant::now();
    let repaired = loop {
        if !watch.now().0.contains(&ip) {
            break Some(deleted.elapsed());
        }
        if deleted.elapsed() > window {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let samples = traffic.finish().await;
    let moments = watch.moments();
    let verdict = judge(&samples, &moments, GRACE, GAP);
    if let Some(first) = samples.iter().find(|s| !s.ok) {
        write_timeline(&run.out, controller, ROW, first.at, &samples, &moments)?;
    }
    let note = match repaired {
        Some(took) => format!(
            "{pod} deleted, its events lost in the first API server's watch cache, with {} other pods and {} Services on fake nodes; its address left the slices after {:.0} s",
            scale.pods(),
            scale.services,
            took.as_secs_f64()
        ),
        None => format!(
            "{pod} deleted, its events lost in the first API server's watch cache, with {} other pods and {} Services on fake nodes; its address still published after {} s",
            scale.pods(),
            scale.services,
            window.as_secs()
        ),
    };
    eprintln!("e2e_node: {controller}: {ROW}: {verdict:?} {note}");
    let mut row = Row::new(ROW, controller, verdict, note);
    row.repair_s = Some(repaired.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0));
    // The ghost goes with the first API server's watch cache.
    run.node.cp.etcd_clear_drops().await?;
    run.node.cp.restart_apiserver().await?;
    Ok(row)
}

/// KWOK playing `scale.nodes` fake nodes (through the second API server),
/// `scale.services` Services with `scale.pods_per_service` pods each on
/// them, all Ready. The KWOK process stops when the result is dropped.
async fn fake_nodes(run: &Run<'_>, scale: Scale) -> Result<Process> {
    let release = eg_harness::binaries::release_dir(&workspace_root()?, "target/conformance")?;
    let kwok_bin = release.join("bin/kwok");
    let stages = release.join("kwok-stages.yaml");
    for need in [&kwok_bin, &stages] {
        anyhow::ensure!(
            need.exists(),
            "{} is missing: build it with `bash tests/conformance/build.sh` (make e2e-node does; the same KUBE_VERSION)",
            need.display()
        );
    }
    let truth = run.node.truth();
    let kwok = Process::spawn(
        "kwok",
        &kwok_bin,
        &[
            format!("--kubeconfig={}", run.node.truth_kubeconfig().display()),
            format!("--config={}", stages.display()),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_string(),
            "--node-lease-duration-seconds=40".to_string(),
            "--cidr=10.245.0.0/16".to_string(),
        ],
        &run.node.cp.log_dir().join("kwok.log"),
    )?;
    let nodes: Api<Node> = Api::all(truth.clone());
    for i in 0..scale.nodes {
        let name = format!("kwok-{i}");
        let cidr = format!("10.245.{i}.0/24");
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok"}},
            // Tainted: only the pods made for them go there. A controller
            // pod scheduled on a fake node "runs" and does nothing.
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr],
                     "taints": [{"key": FAKE_NODE_TAINT, "value": "fake", "effect": "NoSchedule"}]},
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
    }
    create_namespace(&truth, SCALE_NS).await?;
    let started = Instant::now();
    let services: Api<Service> = Api::namespaced(truth.clone(), SCALE_NS);
    let pods: Api<Pod> = Api::namespaced(truth.clone(), SCALE_NS);
    let objects = (0..scale.services)
        .flat_map(|s| (0..=scale.pods_per_service).map(move |p| (s, p.checked_sub(1))));
    let created: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|(s, pod)| {
            let (services, pods) = (services.clone(), pods.clone());
            async move {
                let app = format!("scale-{s}");
                match pod {
                    None => {
                        let svc: Service = serde_json::from_value(json!({
                            "metadata": {"name": app},
                            "spec": {"selector": {"app": app},
                                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                        }))?;
                        services.create(&PostParams::default(), &svc).await?;
                    }
                    Some(p) => {
                        let pod: Pod = serde_json::from_value(json!({
                            "metadata": {"name": format!("{app}-{p}"), "labels": {"app": app}},
                            "spec": {
                                "nodeSelector": {"type": "kwok"},
                                "tolerations": [{"key": FAKE_NODE_TAINT, "operator": "Exists",
                                                 "effect": "NoSchedule"}],
                                "automountServiceAccountToken": false,
                                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                                "containers": [{"name": "server", "image": "eg.local/fake:e2e",
                                    "ports": [{"name": "http", "containerPort": 8080}],
                                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"]}}}],
                            },
                        }))?;
                        pods.create(&PostParams::default(), &pod).await?;
                    }
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect::<Result<()>>()?;
    wait_until_async(
        "every fake-node pod Ready",
        Duration::from_secs(1200),
        || async {
            let ready = pods
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|p| {
                            p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                })
                        })
                        .count()
                })
                .unwrap_or(0);
            ready == scale.pods()
        },
    )
    .await?;
    eprintln!(
        "e2e_node: {} pods of {} Services Ready on {} fake nodes in {:.0} s",
        scale.pods(),
        scale.services,
        scale.nodes,
        started.elapsed().as_secs_f64()
    );
    Ok(kwok)
}

/// What the row must show: endpoints-guard's address of the dead pod left
/// the slices within the bound; kube-controller-manager's column is
/// reported, whatever it shows.
pub(super) fn verdict(rows: &[Row], form: Form) -> Result<()> {
    let by_controller: BTreeMap<&str, &Row> = rows
        .iter()
        .filter(|r| r.name == ROW)
        .map(|r| (r.controller.as_str(), r))
        .collect();
    let Some(ours) = by_controller.get(GUARD) else {
        bail!("no {ROW} row of endpoints-guard");
    };
    match ours.repair_s.flatten() {
        Some(s) => ensure!(
            s <= bound(form).as_secs_f64(),
            "{ROW}: endpoints-guard took {s} s, over its {} s bound",
            bound(form).as_secs()
        ),
        None => bail!("{ROW}: endpoints-guard never removed the dead pod's address"),
    }
    ensure!(
        by_controller.contains_key(UPSTREAM),
        "no {ROW} row of kube-controller-manager"
    );
    Ok(())
}
