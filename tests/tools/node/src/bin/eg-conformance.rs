//! `make conformance` (and the fake-node part of `make test`): upstream's
//! network e2e specs for the Endpoints, EndpointSlice and mirroring
//! controllers, once against kube-controller-manager's own endpoint
//! controllers, once against endpoints-guard in their place (the release
//! binary, enforce mode, both controllers), and once with endpoints-guard in
//! opt-in scope beside them (no spec's Service opts in: it must disturb
//! none), each on a fresh cluster of the same kind, of the Kubernetes release
//! `KUBE_VERSION` picks (default the newest pinned; the report's context
//! names it). `target/conformance/<k8s version>/` holds that release's
//! programs (below: `<release>/`):
//!
//! - etcd and kube-apiserver from `make controlplane`, with kube-apiserver's
//!   lease endpoint reconciler and an advertise address that is not loopback
//!   (the host's own address, or one on a dummy interface made for the run
//!   and removed after it; kube-apiserver still listens on 127.0.0.1 only,
//!   and nothing is sent anywhere);
//! - kube-controller-manager with every controller, or every controller but
//!   `endpoints-controller` and `endpointslice-controller`;
//! - kube-scheduler; KWOK (`<release>/bin/kwok`) playing two nodes,
//!   each pod getting an IP of its node's podCIDR.
//!
//! Then the specs that need a real node ([`REAL_NODE_SPECS`]: exec, container
//! logs, traffic, Service names, probes), the same two columns on the real
//! one-node cluster of `eg_node` (kubelet, containerd,
//! kube-proxy, the node's cluster DNS), one fresh node per column, holding
//! `/run/eg-e2e-node.lock` as `make e2e-node` does; the images are
//! `<release>/images/` (`hack/conformance-node.sh`). Where no real
//! node can run (not root, packages or images missing) those rows are
//! skipped and the reason is in the report's context.
//!
//! Writes `target/conformance/report.json`, `report.md`, and per column the
//! JUnit file, ginkgo's JSON report and every program's log (`real-node/`
//! for the real node). Exits non-zero when endpoints-guard does not pass a
//! spec that kube-controller-manager passes, when a spec is run by neither
//! column, or when a real node left the host changed.
//!
//! Usage: `eg-conformance [--only upstream|endpoints-guard|opt-in] [--nodes
//! fake|real|all] [--out DIR]` (default all). `EG_BINARY` names the
//! endpoints-guard binary (default `target/release/endpoints-guard`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_harness::binaries::{self, workspace_root};
use eg_harness::loopback;
use eg_harness::process::{Process, free_port};
use eg_harness::{ControlPlane, ControlPlaneOptions};
use eg_node::conformance::{
    Columns, Outcome, REAL_NODE_SPECS, Row, Spec, SpecResult, fake_node_specs, focus,
    read_ginkgo_report, report_json, report_markdown, rows, verdict,
};
use eg_node::{self as node, NodeImages, NodeOptions, RealNode};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// The columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    /// kube-controller-manager's endpoint controllers.
    Upstream,
    /// endpoints-guard in their place (all scope).
    Guard,
    /// endpoints-guard in opt-in scope beside them: no spec's Service opts
    /// in, so it must disturb none.
    OptIn,
}

impl Column {
    const ALL: [Column; 3] = [Column::Upstream, Column::Guard, Column::OptIn];

    fn dir_name(self) -> &'static str {
        match self {
            Column::Upstream => "upstream",
            Column::Guard => "endpoints-guard",
            Column::OptIn => "opt-in",
        }
    }

    /// kube-controller-manager's `--controllers`.
    fn kcm_controllers(self) -> &'static str {
        match self {
            Column::Upstream | Column::OptIn => "*",
            Column::Guard => "*,-endpoints-controller,-endpointslice-controller",
        }
    }

    /// endpoints-guard's `--scope`, where it runs.
    fn guard_scope(self) -> Option<&'static str> {
        match self {
            Column::Upstream => None,
            Column::Guard => Some("all"),
            Column::OptIn => Some("opt-in"),
        }
    }
}

const NODES: usize = 2;
const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// A dummy interface holding the advertise address, removed on drop.
struct DummyInterface;

impl DummyInterface {
    const NAME: &'static str = "egconf0";
    const ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 254, 254, 1);

    fn create() -> Result<Self> {
        let ip = |args: &[&str]| -> Result<()> {
            let status = Command::new("ip")
                .args(args)
                .status()
                .with_context(|| format!("running ip {}", args.join(" ")))?;
            if !status.success() {
                bail!("ip {} failed ({status})", args.join(" "));
            }
            Ok(())
        };
        ip(&["link", "add", Self::NAME, "type", "dummy"])?;
        let iface = Self;
        let address = format!("{}/32", Self::ADDRESS);
        ip(&["addr", "add", &address, "dev", Self::NAME])?;
        ip(&["link", "set", Self::NAME, "up"])?;
        Ok(iface)
    }
}

impl Drop for DummyInterface {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", Self::NAME])
            .status();
    }
}

/// The host's own address on its default route, found without sending
/// anything (a UDP socket's connect only picks a route); else an address on a
/// dummy interface made for the run.
fn advertise_address() -> Result<(IpAddr, Option<DummyInterface>)> {
    let routed = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| {
            s.connect((Ipv4Addr::new(192, 0, 2, 1), 9))?;
            s.local_addr()
        })
        .map(|a| a.ip());
    match routed {
        Ok(ip) if !ip.is_loopback() && !ip.is_unspecified() => Ok((ip, None)),
        _ => {
            let iface = DummyInterface::create()
                .context("no routable host address, and no dummy interface could be made")?;
            Ok((IpAddr::V4(DummyInterface::ADDRESS), Some(iface)))
        }
    }
}

struct Paths {
    out: PathBuf,
    e2e: PathBuf,
    /// kubectl of the suite's release, which it runs for `kubectl exec`.
    kubectl: PathBuf,
    kwok: PathBuf,
    kwok_stages: PathBuf,
    guard: PathBuf,
    scheduler: PathBuf,
}

impl Paths {
    fn locate(out: PathBuf, need_guard: bool) -> Result<Self> {
        let root = workspace_root()?;
        let release = binaries::release_dir(&root, "target/conformance")?;
        let bin = release.join("bin");
        let need = |path: PathBuf, how: &str| -> Result<PathBuf> {
            if !path.is_file() {
                bail!("{} is missing: {how}", path.display());
            }
            Ok(path)
        };
        let build = "build it with `bash tests/conformance/build.sh` (make conformance does; the same KUBE_VERSION)";
        let guard = std::env::var_os("EG_BINARY")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/release/endpoints-guard"));
        Ok(Self {
            out,
            e2e: need(bin.join("e2e-network.test"), build)?,
            kubectl: need(bin.join("kubectl"), build)?,
            kwok: need(bin.join("kwok"), build)?,
            kwok_stages: need(release.join("kwok-stages.yaml"), build)?,
            guard: if need_guard {
                need(guard, "cargo build --release -p endpoints-guard")?
            } else {
                guard
            },
            scheduler: binaries::program("kube-scheduler")?,
        })
    }
}

/// A cluster for one column, up and with Ready nodes.
struct Cluster {
    cp: ControlPlane,
    _programs: Vec<Process>,
}

async fn wait_nodes_ready(nodes: &Api<Node>, programs: &mut [Process], logs: &Path) -> Result<()> {
    let start = Instant::now();
    loop {
        for p in programs.iter_mut() {
            p.ensure_running()?;
        }
        let list = nodes.list(&Default::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == NODES {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "{ready} of {NODES} KWOK nodes Ready after 2 minutes (logs in {})",
                logs.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn start_guard(
    paths: &Paths,
    kubeconfig: String,
    scope: &str,
    logs: &Path,
) -> Result<Process> {
    let port = free_port()?;
    let mut guard = Process::spawn(
        "endpoints-guard",
        &paths.guard,
        &[
            kubeconfig,
            format!("--metrics-addr=127.0.0.1:{port}"),
            "--mode=enforce".into(),
            "--controllers=endpoints,endpointslices".into(),
            format!("--scope={scope}"),
        ],
        &logs.join("endpoints-guard.log"),
    )?;
    let start = Instant::now();
    loop {
        guard.ensure_running()?;
        if let Ok((200, _)) = loopback::request(port, "GET", "/readyz", "text/plain", "").await {
            return Ok(guard);
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "endpoints-guard not ready after 60 s: {}",
                guard.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn start_cluster(column: Column, paths: &Paths, advertise: IpAddr) -> Result<Cluster> {
    let options = ControlPlaneOptions::default()
        .apiserver_arg(format!("--advertise-address={advertise}"))
        .apiserver_arg("--endpoint-reconciler-type=lease");
    let cp = ControlPlane::start(options).await?;
    let logs = cp.log_dir().to_path_buf();
    let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let pki = cp.pki();
    let mut programs = vec![cp.start_controller_manager(
        column.kcm_controllers(),
        &[
            &format!("--root-ca-file={}", pki.ca_cert.display()),
            &format!(
                "--service-account-private-key-file={}",
                pki.sa_private_key.display()
            ),
        ],
    )?];
    programs.push(Process::spawn(
        "kube-scheduler",
        &paths.scheduler,
        &[
            kubeconfig.clone(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--v=1".into(),
        ],
        &logs.join("kube-scheduler.log"),
    )?);
    programs.push(Process::spawn(
        "kwok",
        &paths.kwok,
        &[
            kubeconfig.clone(),
            format!("--config={}", paths.kwok_stages.display()),
            format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
            "--node-lease-duration-seconds=40".into(),
            "--cidr=10.244.0.0/16".into(),
        ],
        &logs.join("kwok.log"),
    )?);
    let nodes: Api<Node> = Api::all(cp.client());
    for i in 0..NODES {
        let name = format!("kwok-node-{i}");
        let cidr = format!("10.244.{i}.0/24");
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok"},
            },
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
    }
    wait_nodes_ready(&nodes, &mut programs, &logs).await?;
    if let Some(scope) = column.guard_scope() {
        programs.push(start_guard(paths, kubeconfig, scope, &logs).await?);
    }
    Ok(Cluster {
        cp,
        _programs: programs,
    })
}

fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// Runs `specs` of the suite against the cluster of `kubeconfig`, reports
/// into `dir`; the results by spec name.
async fn run_suite(
    what: &str,
    paths: &Paths,
    kubeconfig: &Path,
    dir: &Path,
    specs: &[Spec],
) -> Result<BTreeMap<String, SpecResult>> {
    let json_report = dir.join("ginkgo.json");
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--kubectl-path={}", paths.kubectl.display()),
        "--provider=skeleton".into(),
        "--allowed-not-ready-nodes=-1".into(),
        "--minStartupPods=-1".into(),
        format!("--report-dir={}", dir.display()),
        format!("--ginkgo.json-report={}", json_report.display()),
        "--ginkgo.no-color".into(),
        "--ginkgo.timeout=40m".into(),
        "--disable-log-dump".into(),
    ];
    args.extend(specs.iter().map(|s| format!("--ginkgo.focus={}", focus(s))));
    let suite_start = Instant::now();
    let mut e2e = Process::spawn("e2e", &paths.e2e, &args, &dir.join("e2e.log"))?;
    while e2e.ensure_running().is_ok() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "conformance: {what}: suite ran in {:.1} s",
        suite_start.elapsed().as_secs_f64()
    );
    let text = std::fs::read_to_string(&json_report).with_context(|| {
        format!(
            "reading {} (the suite's log: {})",
            json_report.display(),
            dir.join("e2e.log").display()
        )
    })?;
    read_ginkgo_report(&text, specs)
}

/// Runs the fake-node `specs` against one fresh cluster; the results by spec
/// name.
async fn run_column(
    column: Column,
    paths: &Paths,
    advertise: IpAddr,
    specs: &[Spec],
) -> Result<BTreeMap<String, SpecResult>> {
    let dir = paths.out.join(column.dir_name());
    fresh_dir(&dir)?;
    let started = Instant::now();
    let cluster = start_cluster(column, paths, advertise).await?;
    eprintln!(
        "conformance: {}: cluster up in {:.1} s",
        column.dir_name(),
        started.elapsed().as_secs_f64()
    );
    let results = run_suite(
        column.dir_name(),
        paths,
        cluster.cp.kubeconfig_path(),
        &dir,
        specs,
    )
    .await;
    let copied = copy_logs(cluster.cp.log_dir(), &dir.join("logs"));
    drop(cluster);
    copied?;
    results
}

/// The lock every real-node run on this host holds (`hack/e2e-node.sh`
/// takes it too): one node at a time, as they share cni0 and ports.
const NODE_LOCK: &str = "/run/eg-e2e-node.lock";

/// Holds [`NODE_LOCK`] (flock(2)) until dropped: closing the file releases
/// it.
struct NodeLock {
    _file: std::fs::File,
}

impl NodeLock {
    async fn take() -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(NODE_LOCK)
            .with_context(|| format!("opening {NODE_LOCK}"))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let started = Instant::now();
        let mut said = false;
        // Non-blocking attempts, so the wait is on the runtime and is logged.
        // SAFETY: flock(2) on a descriptor this function owns.
        while unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if !said {
                eprintln!("conformance: another real-node run holds {NODE_LOCK}; waiting for it");
                said = true;
            }
            if started.elapsed() > Duration::from_secs(3600) {
                bail!("waited an hour for {NODE_LOCK}");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(Self { _file: file })
    }
}

/// Why the real-node specs cannot run here, if they cannot.
fn real_node_unavailable(images: &NodeImages) -> Option<String> {
    if let Some(why) = node::unavailable() {
        return Some(why);
    }
    ["agnhost.tar", "pause.tar"]
        .iter()
        .find(|f| !images.dir.join(f).exists())
        .map(|f| {
            format!(
                "{} is missing: build the images with `bash hack/conformance-node.sh` (make conformance does)",
                images.dir.join(f).display()
            )
        })
}

/// Runs the real-node specs against one fresh real node; the results by
/// spec name. The node is taken down before it returns, and a host left
/// changed is an error.
async fn run_real_column(
    column: Column,
    paths: &Paths,
    images: &NodeImages,
) -> Result<BTreeMap<String, SpecResult>> {
    let what = format!("real node, {}", column.dir_name());
    let dir = paths.out.join("real-node").join(column.dir_name());
    fresh_dir(&dir)?;
    let work = tempfile::Builder::new()
        .prefix("eg-conformance-node-")
        .tempdir()?;
    let started = Instant::now();
    let options = NodeOptions {
        controllers: column.kcm_controllers().to_string(),
        cluster_dns: true,
        ..NodeOptions::default()
    };
    let mut node = RealNode::start_with(work.path(), images, options).await?;
    node.copy_logs_on_stop(dir.join("logs"));
    eprintln!(
        "conformance: {what}: node Ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let kubeconfig = node.cp.kubeconfig_path().to_path_buf();
    let logs = node.cp.log_dir().to_path_buf();
    let guard = if let Some(scope) = column.guard_scope() {
        match start_guard(
            paths,
            format!("--kubeconfig={}", kubeconfig.display()),
            scope,
            &logs,
        )
        .await
        {
            Ok(guard) => Some(guard),
            Err(err) => {
                let teardown = node.stop().await;
                return Err(err.context(format!("host after clean-up: {:?}", teardown.differences)));
            }
        }
    } else {
        None
    };
    let results = run_suite(&what, paths, &kubeconfig, &dir, &REAL_NODE_SPECS).await;
    if let Some(mut guard) = guard {
        let _ = guard.stop().await;
    }
    let teardown = node.stop().await;
    std::fs::write(
        dir.join("teardown.json"),
        serde_json::to_string_pretty(&teardown)?,
    )?;
    eprintln!(
        "conformance: {what}: {:.1} s in all, host {}",
        started.elapsed().as_secs_f64(),
        if teardown.host_clean() {
            "as it was"
        } else {
            "changed"
        }
    );
    if !teardown.host_clean() {
        bail!(
            "the real node left the host changed: {:?} (clean-up problems: {:?})",
            teardown.differences,
            teardown.cleanup_problems
        );
    }
    results
}

fn copy_logs(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Which specs a run covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nodes {
    Fake,
    Real,
    All,
}

impl Nodes {
    fn fake(self) -> bool {
        self != Nodes::Real
    }

    fn real(self) -> bool {
        self != Nodes::Fake
    }
}

const USAGE: &str =
    "eg-conformance [--only upstream|endpoints-guard|opt-in] [--nodes fake|real|all] [--out DIR]";

#[tokio::main]
async fn main() -> Result<()> {
    let mut only = None;
    let mut nodes = Nodes::All;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => {
                let name = args.next();
                only = Some(
                    Column::ALL
                        .into_iter()
                        .find(|c| Some(c.dir_name()) == name.as_deref())
                        .with_context(|| {
                            format!("--only upstream|endpoints-guard|opt-in, not {name:?}")
                        })?,
                )
            }
            "--nodes" => {
                nodes = match args.next().as_deref() {
                    Some("fake") => Nodes::Fake,
                    Some("real") => Nodes::Real,
                    Some("all") => Nodes::All,
                    other => bail!("--nodes fake|real|all, not {other:?}"),
                }
            }
            "--out" => out = args.next().map(PathBuf::from),
            other => bail!("unknown argument {other:?} (usage: {USAGE})"),
        }
    }
    let root = workspace_root()?;
    let out = out.unwrap_or_else(|| root.join("target/conformance"));
    std::fs::create_dir_all(&out)?;
    let columns: Vec<Column> = match only {
        Some(c) => vec![c],
        None => Column::ALL.to_vec(),
    };
    let needs_guard = columns.iter().any(|c| c.guard_scope().is_some());
    let paths = Paths::locate(out.clone(), needs_guard)?;
    let started = Instant::now();
    let mut results: BTreeMap<&str, BTreeMap<String, SpecResult>> = BTreeMap::new();
    let kubernetes = binaries::kubernetes_version(&root)?;
    eprintln!("conformance: Kubernetes {kubernetes}");
    // The suite of each release names its specs as that release does.
    let fake_specs = fake_node_specs(&kubernetes);
    let mut context = json!({"kubernetes": kubernetes});

    if nodes.fake() {
        let (advertise, dummy) = advertise_address()?;
        eprintln!(
            "conformance: kube-apiserver advertises {advertise}{}",
            if dummy.is_some() {
                " (dummy interface)"
            } else {
                ""
            }
        );
        let fake_started = Instant::now();
        for column in &columns {
            let found = run_column(*column, &paths, advertise, fake_specs).await?;
            results.entry(column.dir_name()).or_default().extend(found);
        }
        drop(dummy);
        context["fake_nodes"] = json!({
            "nodes": "KWOK", "advertise_address": advertise.to_string(),
            "seconds": fake_started.elapsed().as_secs_f64().round(),
        });
    }

    let mut real_ran = false;
    if !nodes.real() {
        context["real_node"] = json!({"skipped": "not asked for (--nodes fake)"});
    } else {
        let images = NodeImages {
            dir: binaries::release_dir(&root, "target/conformance")?.join("images"),
        };
        let real_started = Instant::now();
        // The lock first: another run's kubelet is not a reason to skip.
        let lock = NodeLock::take().await?;
        // What a killed run left (its bridge, its shims) would read as a
        // node this run must not touch.
        if let Some(problems) = node::clean_leftovers() {
            eprintln!("conformance: undid what a killed node run left ({problems:?})");
        }
        match real_node_unavailable(&images) {
            Some(why) => {
                eprintln!("conformance: real-node specs skipped: {why}");
                context["real_node"] = json!({"skipped": why});
            }
            None => {
                for column in &columns {
                    let found = run_real_column(*column, &paths, &images).await?;
                    results.entry(column.dir_name()).or_default().extend(found);
                }
                real_ran = true;
                context["real_node"] = json!({
                    "node": "one real node (kubelet, containerd, kube-proxy iptables, CNI bridge)",
                    "seconds": real_started.elapsed().as_secs_f64().round(),
                });
            }
        }
        drop(lock);
    }

    let columns = Columns {
        upstream: results.get(Column::Upstream.dir_name()),
        endpoints_guard: results.get(Column::Guard.dir_name()),
        opt_in: results.get(Column::OptIn.dir_name()),
    };
    let specs: Vec<Spec> = fake_specs
        .iter()
        .chain(REAL_NODE_SPECS.iter())
        .copied()
        .collect();
    let rows = rows(&specs, columns);
    let commit = eg_workload::command_output("git", &["rev-parse", "--short", "HEAD"], &root);
    let date = eg_workload::command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"], &root);
    let seconds = started.elapsed().as_secs_f64();
    context["commit"] = json!(commit);
    context["date"] = json!(date);
    context["seconds"] = json!(seconds.round());
    let report = report_json(&rows, context);
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let scope = match (nodes.fake(), real_ran) {
        (true, true) => "KWOK nodes and a real node",
        (true, false) => "KWOK nodes; no real node",
        (false, _) => "a real node",
    };
    let md = report_markdown(
        &rows,
        &format!("# Conformance ({scope}): commit {commit}, {date}, {seconds:.0} s"),
    );
    std::fs::write(out.join("report.md"), &md)?;
    println!("{md}");
    // Only the rows of what ran are judged: a real-node row where no real
    // node can run is a skip the report states, not a failure.
    let judged: Vec<Row> = rows
        .into_iter()
        .filter(|r| {
            let real = eg_node::conformance::needs_real_node(&r.spec);
            if real { real_ran } else { nodes.fake() }
        })
        .collect();
    let problems = verdict(&judged, columns);
    if !problems.is_empty() {
        eprintln!(
            "conformance: {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        );
        std::process::exit(1);
    }
    let count = |column: fn(&Row) -> Outcome, outcome| {
        judged.iter().filter(|r| column(r) == outcome).count()
    };
    println!("report: {}", out.join("report.md").display());
    // endpoints-guard's columns, in the closing form CI reads.
    for (what, column) in [
        ("", Row::guard_outcome as fn(&Row) -> Outcome),
        (" (opt-in scope)", Row::opt_in_outcome),
    ] {
        println!(
            "conformance{what}: {} passed, {} failed, {} skipped",
            count(column, Outcome::Pass),
            count(column, Outcome::Fail),
            count(column, Outcome::Skip)
        );
    }
    Ok(())
}
