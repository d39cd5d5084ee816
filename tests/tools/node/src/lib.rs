//! A real one-node cluster on this host: the local control plane (its
//! kube-apiserver on the node's address), kube-controller-manager without
//! the endpoint controllers, kube-scheduler, containerd, a kubelet and
//! kube-proxy in iptables mode, pods on a CNI bridge. Images are imported
//! from tarballs, never pulled.
//!
//! Traffic stays on the host: pod and Service addresses live only on the
//! bridge `cni0` and in the pods' network namespaces; nothing masquerades;
//! a FORWARD rule drops anything from the bridge toward another interface
//! (its counter is read at the end); the Service range is routed to the
//! bridge, so a packet to a ClusterIP kube-proxy has no rule for stays there.
//!
//! The host is put back as it was ([`host::restore`]) and compared with a
//! snapshot from before the run ([`host::HostSnapshot`]).

pub mod conformance;
pub mod dns;
pub mod host;
pub mod traffic;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use eg_harness::binaries::program;
use eg_harness::process::Process;
use eg_harness::{ControlPlane, ControlPlaneOptions, InflightLimits, SecondApiserver};
use host::{HostSnapshot, run};

/// The name of the real-node row of a pod DELETE lost in the watch cache
/// with hundreds of Services on fake nodes beside the real one
/// (`tests/e2e/real_node/at_scale.rs`): judged by how long the dead pod's
/// address stayed published, not by requests (`make matrix` reads it).
pub const AT_SCALE_ROW: &str = "lost pod DELETE in the watch cache, at scale";

/// The node's address: the bridge's gateway address, where kube-apiserver
/// listens and what the `kubernetes` Service points at.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pods' addresses (host-local IPAM on the bridge).
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The Services' IPv4 range (kube-apiserver's first range).
pub const SERVICE_SUBNET: &str = "10.96.0.0/16";
/// The Node object's name.
pub const NODE_NAME: &str = "eg-node";
/// The bridge.
pub const BRIDGE: &str = "cni0";
/// The comment on the FORWARD rule that keeps pod traffic on the bridge.
const GUARD_COMMENT: &str = "eg-e2e-node: pod traffic stays on the bridge";
/// Debian packages the node needs.
pub const PACKAGES: [&str; 7] = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "nftables",
    "conntrack",
    "ca-certificates",
];
/// Where Debian's containernetworking-plugins puts the plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The pod sandbox image the run imports (see [`NodeImages`]).
pub const PAUSE_IMAGE: &str = "eg.local/pause:e2e";

/// Why this host cannot run a real node, if it cannot: not root, a
/// required program missing, or a kubelet or containerd already running
/// that this run would fight with.
pub fn unavailable() -> Option<String> {
    not_root().or_else(missing_program).or_else(occupied)
}

/// Why the run cannot start as this user, if it cannot.
pub fn not_root() -> Option<String> {
    // SAFETY: getuid(2) has no preconditions.
    (unsafe { libc::getuid() } != 0)
        .then(|| "a real node needs root (kubelet, containerd, iptables)".to_string())
}

/// The first program (or CNI plugin) the node needs that this host lacks.
/// After the node scripts installed [`PACKAGES`], one still missing is a gap
/// in that list, not a reason to skip.
pub fn missing_program() -> Option<String> {
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "iptables",
        "ip",
        "nft",
        "unshare",
        "mount",
    ] {
        if which(tool).is_none() {
            return Some(format!(
                "{tool} not found: install Debian's {} (make e2e-node does as root)",
                PACKAGES.join(" ")
            ));
        }
    }
    if !Path::new(CNI_BIN_DIR).join("bridge").exists() {
        return Some(format!(
            "{CNI_BIN_DIR}/bridge not found: install containernetworking-plugins"
        ));
    }
    None
}

/// A kubelet, containerd, kube-proxy or bridge this run did not make.
pub fn occupied() -> Option<String> {
    if let Ok(before) = HostSnapshot::take() {
        for name in ["kubelet", "containerd", "kube-proxy"] {
            if before.processes.contains_key(name) {
                return Some(format!(
                    "a {name} this run did not start is already running: refusing to touch its node"
                ));
            }
        }
        if before.links.contains(BRIDGE) {
            return Some(format!(
                "a {BRIDGE} interface already exists: refusing to touch it"
            ));
        }
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join(tool))
        .find(|p| p.is_file())
}

/// The image tarballs a node imports (docker-archive, from
/// `hack/node-images.sh`), by the name pods use.
#[derive(Debug, Clone)]
pub struct NodeImages {
    pub dir: PathBuf,
}

impl NodeImages {
    /// `target/e2e-node/images`, or `$EG_NODE_IMAGES`.
    pub fn locate() -> Result<Self> {
        let dir = match std::env::var_os("EG_NODE_IMAGES") {
            Some(dir) => PathBuf::from(dir),
            None => eg_harness::binaries::workspace_root()?.join("target/e2e-node/images"),
        };
        if !dir.join("pause.tar").exists() {
            bail!(
                "no node images in {}: build them with `bash hack/node-images.sh` (make e2e-node does)",
                dir.display()
            );
        }
        Ok(Self { dir })
    }

    fn tarballs(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("reading {}", self.dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "tar") {
                out.push(path);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// What differs between runs of the node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// kube-controller-manager's `--controllers`.
    pub controllers: String,
    /// Serve Service names to pods ([`dns`]) on the node's address, the
    /// kubelet's `clusterDNS`; without it pods resolve nothing.
    pub cluster_dns: bool,
    /// Two kube-apiservers on the one etcd, as production runs several: the
    /// first, the `kubernetes` Service's (the pods', the controllers'),
    /// behind etcd-fault-proxy, so its watch cache can lose an object's
    /// events ([`ControlPlane::etcd_drop_events`]); the second straight to
    /// etcd, for the kubelet, kube-proxy, kube-scheduler and the node's
    /// kube-controller-manager, which then still stop a pod whose DELETE
    /// the first lost, and for the test's view of what is true
    /// ([`RealNode::truth`]).
    pub two_api_servers: bool,
    /// kube-apiserver's `--etcd-compaction-interval` (`None`: its default).
    pub compaction_interval: Option<Duration>,
    /// API Priority and Fairness on with these in-flight limits on every
    /// API server (`None`: off).
    pub priority_and_fairness: Option<InflightLimits>,
}

impl Default for NodeOptions {
    /// Every controller but the two endpoint controllers, no DNS, one API
    /// server, the default compaction.
    fn default() -> Self {
        Self {
            controllers: "*,-endpoints-controller,-endpointslice-controller".to_string(),
            cluster_dns: false,
            two_api_servers: false,
            compaction_interval: None,
            priority_and_fairness: None,
        }
    }
}

/// A running node. [`RealNode::stop`] takes it down and returns what the
/// host comparison found; dropping it without `stop` still cleans up.
pub struct RealNode {
    pub cp: ControlPlane,
    /// The second API server ([`NodeOptions::two_api_servers`]).
    second: Option<SecondApiserver>,
    dir: PathBuf,
    before: HostSnapshot,
    kcm: Option<Process>,
    scheduler: Option<Process>,
    containerd: Option<Process>,
    kubelet: Option<Process>,
    proxy: Option<Process>,
    kubelet_root_mounted: bool,
    stopped: bool,
    options: NodeOptions,
    dns: Option<tokio::task::JoinHandle<()>>,
    logs_to: Option<PathBuf>,
}

/// What [`RealNode::stop`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Teardown {
    /// Differences between the host before and after, empty when clean.
    pub differences: Vec<String>,
    /// Steps of the clean-up that failed.
    pub cleanup_problems: Vec<String>,
    /// Packets the FORWARD guard rule dropped (pod traffic toward another
    /// interface), read before it was removed.
    pub forward_guard_drops: u64,
}

impl Teardown {
    pub fn host_clean(&self) -> bool {
        self.differences.is_empty()
    }
}

impl RealNode {
    /// Brings the node up in `dir` (its logs in `dir/logs` via the control
    /// plane's log folder) and waits until the Node is Ready.
    pub async fn start(dir: &Path, images: &NodeImages) -> Result<Self> {
        Self::start_with(dir, images, NodeOptions::default()).await
    }

    /// As [`RealNode::start`], with `options`.
    pub async fn start_with(dir: &Path, images: &NodeImages, options: NodeOptions) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if let Some(problems) = clean_leftovers() {
            eprintln!("eg-node: cleaned up after a killed node run ({problems:?})");
        }
        let before = HostSnapshot::take().context("taking the host snapshot")?;
        let marker = Marker {
            pid: std::process::id(),
            dir: dir.to_path_buf(),
            before: before.clone(),
        };
        std::fs::write(MARKER, serde_json::to_string(&marker)?)
            .with_context(|| format!("writing {MARKER}"))?;
        // The bridge exists before kube-apiserver, which listens on its address.
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        let mut node = Self {
            cp: {
                let setup = || -> Result<()> {
                    run(
                        "ip",
                        &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
                    )?;
                    run("ip", &["link", "set", BRIDGE, "up"])?;
                    run(
                        "ip",
                        &[
                            "route",
                            "add",
                            SERVICE_SUBNET,
                            "dev",
                            BRIDGE,
                            "src",
                            &NODE_IP.to_string(),
                        ],
                    )?;
                    run("iptables", &guard_rule(&["-I", "FORWARD", "1"]))?;
                    Ok(())
                };
                if let Err(err) = setup() {
                    let problems = restore_host(dir, &before);
                    bail!("setting up the bridge: {err:#} (clean-up: {problems:?})");
                }
                let mut cp_options = ControlPlaneOptions {
                    bind_address: IpAddr::V4(NODE_IP),
                    priority_and_fairness: options.priority_and_fairness,
                    ..ControlPlaneOptions::default()
                };
                if options.two_api_servers {
                    cp_options = cp_options.with_etcd_fault_proxy();
                }
                if let Some(interval) = options.compaction_interval {
                    cp_options = cp_options.etcd_compaction_interval(interval);
                }
                match ControlPlane::start(cp_options).await {
                    Ok(cp) => cp,
                    Err(err) => {
                        let problems = restore_host(dir, &before);
                        return Err(err.context(format!(
                            "starting the control plane (clean-up: {problems:?})"
                        )));
                    }
                }
            },
            second: None,
            dir: dir.to_path_buf(),
            before,
            kcm: None,
            scheduler: None,
            containerd: None,
            kubelet: None,
            proxy: None,
            kubelet_root_mounted: false,
            stopped: false,
            options,
            dns: None,
            logs_to: None,
        };
        node.start_programs(images).await?;
        Ok(node)
    }

    async fn start_programs(&mut self, images: &NodeImages) -> Result<()> {
        let pki = self.cp.pki().clone();
        if self.options.two_api_servers {
            self.second = Some(self.cp.start_second_apiserver().await?);
        }
        // The node's own programs talk to the second API server where there
        // is one.
        let kubeconfig = match &self.second {
            Some(second) => second.kubeconfig.display().to_string(),
            None => self.cp.kubeconfig_path().display().to_string(),
        };
        let logs = self.cp.log_dir().to_path_buf();
        self.kcm = Some(self.cp.start_controller_manager(
            &self.options.controllers,
            &[
                &format!(
                    "--service-account-private-key-file={}",
                    pki.sa_private_key.display()
                ),
                &format!("--root-ca-file={}", pki.ca_cert.display()),
                "--node-monitor-grace-period=20s",
                // After the harness's own: the last one given counts.
                &format!("--kubeconfig={kubeconfig}"),
            ],
        )?);
        self.scheduler = Some(Process::spawn(
            "kube-scheduler",
            &program("kube-scheduler")?,
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".to_string(),
                "--secure-port=0".to_string(),
                "--v=1".to_string(),
            ],
            &logs.join("kube-scheduler.log"),
        )?);

        // containerd, with everything under the run's folder.
        let ctrd = self.dir.join("containerd");
        std::fs::create_dir_all(&ctrd)?;
        let cni_conf = self.dir.join("cni/net.d");
        std::fs::create_dir_all(&cni_conf)?;
        std::fs::write(
            cni_conf.join("10-eg.conflist"),
            cni_config(&self.dir.join("cni/ipam")),
        )?;
        std::fs::write(
            ctrd.join("config.toml"),
            containerd_config(&ctrd, &cni_conf),
        )?;
        self.containerd = Some(Process::spawn(
            "containerd",
            &which("containerd").context("containerd not found")?,
            &[format!("--config={}", ctrd.join("config.toml").display())],
            &logs.join("containerd.log"),
        )?);
        self.wait_for("containerd to answer", Duration::from_secs(30), |n| {
            n.ctr(&["version"]).is_ok()
        })
        .await?;
        for tarball in images.tarballs()? {
            self.ctr(&["images", "import", &tarball.display().to_string()])
                .with_context(|| format!("importing {}", tarball.display()))?;
        }

        // The kubelet, in a mount namespace of its own (see kubelet_wrapper).
        let kubelet_root = self.dir.join("kubelet");
        std::fs::create_dir_all(&kubelet_root)?;
        let root = kubelet_root.display().to_string();
        run("mount", &["--bind", &root, &root])?;
        self.kubelet_root_mounted = true;
        run("mount", &["--make-rshared", &root])?;
        let resolv = self.dir.join("resolv.conf");
        // Pods resolve no name outside the cluster: no DNS server of the
        // host's is reachable from the bridge.
        std::fs::write(&resolv, "")?;
        if self.options.cluster_dns {
            self.dns = Some(dns::serve((IpAddr::V4(NODE_IP), 53).into(), self.truth()).await?);
        }
        let config = self.dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            kubelet_config(&ctrd, &pki, &self.dir, &resolv, self.options.cluster_dns),
        )?;
        let wrapper = self.dir.join("kubelet-wrapper.sh");
        std::fs::write(&wrapper, kubelet_wrapper(&self.dir))?;
        let kubelet = program("kubelet")?;
        self.kubelet = Some(Process::spawn(
            "kubelet",
            &which("unshare").context("unshare not found")?,
            &[
                "--mount".to_string(),
                "--propagation".to_string(),
                "unchanged".to_string(),
                "--".to_string(),
                "/bin/sh".to_string(),
                wrapper.display().to_string(),
                kubelet.display().to_string(),
                format!("--config={}", config.display()),
                format!("--kubeconfig={kubeconfig}"),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                format!("--root-dir={root}"),
                format!("--cert-dir={}", self.dir.join("kubelet-pki").display()),
                "--v=1".to_string(),
            ],
            &logs.join("kubelet.log"),
        )?);

        let proxy_config = self.dir.join("kube-proxy.yaml");
        std::fs::write(&proxy_config, kube_proxy_config(&kubeconfig))?;
        self.proxy = Some(Process::spawn(
            "kube-proxy",
            &program("kube-proxy")?,
            &[
                format!("--config={}", proxy_config.display()),
                "--v=1".to_string(),
            ],
            &logs.join("kube-proxy.log"),
        )?);

        let nodes: Api<Node> = Api::all(self.truth());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            for process in [
                &mut self.kubelet,
                &mut self.proxy,
                &mut self.containerd,
                &mut self.kcm,
                &mut self.scheduler,
            ]
            .into_iter()
            .flatten()
            {
                process.ensure_running()?;
            }
            if let Ok(node) = nodes.get(NODE_NAME).await
                && node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "Node {NODE_NAME} not Ready after 120 s; kubelet log:\n{}",
                    self.kubelet
                        .as_ref()
                        .map(|k| k.log_tail(30))
                        .unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !ready(self) {
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// A client of what is true: the second API server where there is one
    /// (its watch cache loses nothing), else the only one.
    pub fn truth(&self) -> kube::Client {
        match &self.second {
            Some(second) => second.client.clone(),
            None => self.cp.client(),
        }
    }

    /// The admin's kubeconfig for [`RealNode::truth`]'s API server.
    pub fn truth_kubeconfig(&self) -> PathBuf {
        match &self.second {
            Some(second) => second.kubeconfig.clone(),
            None => self.cp.kubeconfig_path().to_path_buf(),
        }
    }

    /// `ctr` against this node's containerd, namespace `k8s.io`.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let address = self
            .dir
            .join("containerd/containerd.sock")
            .display()
            .to_string();
        let mut all = vec!["--address", &address, "--namespace", "k8s.io"];
        all.extend(args);
        run("ctr", &all)
    }

    /// Kills the main process of the container named `container` in pod
    /// `pod` (SIGKILL, as the kernel's OOM killer would): the kubelet sees
    /// it die and restarts it.
    pub fn kill_container(&self, namespace: &str, pod: &str, container: &str) -> Result<()> {
        let listing = self.ctr(&["containers", "list"])?;
        let ids: Vec<String> = listing
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        for id in ids {
            let info = self.ctr(&["containers", "info", &id])?;
            let labels_match = info.contains(&format!("\"io.kubernetes.pod.name\": \"{pod}\""))
                && info.contains(&format!("\"io.kubernetes.pod.namespace\": \"{namespace}\""))
                && info.contains(&format!(
                    "\"io.kubernetes.container.name\": \"{container}\""
                ));
            if labels_match
                && self
                    .ctr(&["tasks", "kill", "--signal", "SIGKILL", &id])
                    .is_ok()
            {
                return Ok(());
            }
        }
        bail!("no running container {container} of pod {namespace}/{pod}")
    }

    /// Copies every program's log and the containers' logs into `to` when
    /// the node is taken down (the control plane's own folder goes with it).
    pub fn copy_logs_on_stop(&mut self, to: PathBuf) {
        self.logs_to = Some(to);
    }

    /// Packets the FORWARD guard rule dropped so far.
    pub fn forward_guard_drops() -> Result<u64> {
        let listing = run("iptables", &["-L", "FORWARD", "-v", "-x", "-n"])?;
        listing
            .lines()
            .find(|l| l.contains(GUARD_COMMENT))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .context("the FORWARD guard rule is missing")
    }

    /// Takes everything down and compares the host with the snapshot from
    /// before the run.
    pub async fn stop(mut self) -> Teardown {
        let forward_guard_drops = Self::forward_guard_drops().unwrap_or(0);
        let cleanup_problems = self.take_down().await;
        let differences = match HostSnapshot::take() {
            Ok(after) => self.before.differences(&after),
            Err(err) => vec![format!("taking the host snapshot after the run: {err:#}")],
        };
        Teardown {
            differences,
            cleanup_problems,
            forward_guard_drops,
        }
    }

    async fn take_down(&mut self) -> Vec<String> {
        if self.stopped {
            return Vec::new();
        }
        self.stopped = true;
        if let Some(dns) = self.dns.take() {
            dns.abort();
        }
        let mut problems = Vec::new();
        if let Some(mut proxy) = self.proxy.take() {
            let _ = proxy.stop().await;
            // kube-proxy removes its own rules.
            if let Ok(binary) = program("kube-proxy")
                && let Err(err) = run(&binary.display().to_string(), &["--cleanup"])
            {
                problems.push(format!("kube-proxy --cleanup: {err:#}"));
            }
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            let _ = kubelet.stop().await;
        }
        // The containers' logs go with the control plane's (kept when a run
        // fails); /var/log/pods itself is removed below.
        let _ = run(
            "cp",
            &[
                "-r",
                "/var/log/pods",
                &self.cp.log_dir().join("pods").display().to_string(),
            ],
        );
        // Every container process, then the shims (which outlive containerd).
        kill_containers(&self.dir, &mut problems);
        if let Some(mut containerd) = self.containerd.take() {
            let _ = containerd.stop().await;
        }
        for mut process in [self.scheduler.take(), self.kcm.take()]
            .into_iter()
            .flatten()
        {
            let _ = process.stop().await;
        }
        // Nothing talks to it any more.
        drop(self.second.take());
        self.kubelet_root_mounted = false;
        if let Some(to) = self.logs_to.take() {
            let from = format!("{}/.", self.cp.log_dir().display());
            let copied = std::fs::create_dir_all(&to)
                .map_err(anyhow::Error::from)
                .and_then(|()| run("cp", &["-r", &from, &to.display().to_string()]));
            if let Err(err) = copied {
                problems.push(format!("copying the logs to {}: {err:#}", to.display()));
            }
        }
        problems.extend(restore_host(&self.dir, &self.before));
        problems
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if !self.stopped {
            // A test that failed before stop(): clean up on a runtime of our own.
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let problems = std::thread::scope(|s| {
                    s.spawn(|| runtime.block_on(self.take_down()))
                        .join()
                        .unwrap_or_default()
                });
                if !problems.is_empty() {
                    eprintln!("eg-node: node clean-up problems: {problems:?}");
                }
            }
        }
    }
}

/// Kills every process of the pods (by their cgroups) and the shims of the
/// containerd in `dir`, which outlive it by design.
fn kill_containers(dir: &Path, problems: &mut Vec<String>) {
    let socket = dir.join("containerd/containerd.sock").display().to_string();
    kill_processes_with_arg("containerd-shim", &socket);
    for cgroup in host_cgroups("kubepods") {
        if let Err(err) = host::remove_cgroup_tree(&cgroup) {
            problems.push(format!("{err:#}"));
        }
    }
    // A killed shim lingers a moment as it exits; wait until none is left.
    for _ in 0..50 {
        if kill_processes_with_arg("containerd-shim", &socket) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    problems.push("containerd shims still running after 10 s".to_string());
}

/// Once the node's programs are gone: the mounts under `dir` (overlays,
/// network namespaces, volumes) deepest first, the guard rule, the bridge,
/// kube-proxy's rules, then everything else `before` did not have.
fn restore_host(dir: &Path, before: &HostSnapshot) -> Vec<String> {
    let mut problems = Vec::new();
    let prefix = dir.display().to_string();
    for _ in 0..3 {
        let mut points = mount_points_under(&prefix);
        if points.is_empty() {
            break;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = run("umount", &["-l", &point]);
        }
    }
    // kube-proxy removes its own rules (again, if it already did).
    if let Ok(binary) = program("kube-proxy")
        && let Err(err) = run(&binary.display().to_string(), &["--cleanup"])
    {
        problems.push(format!("kube-proxy --cleanup: {err:#}"));
    }
    while run("iptables", &guard_rule(&["-C", "FORWARD"])).is_ok() {
        if let Err(err) = run("iptables", &guard_rule(&["-D", "FORWARD"])) {
            problems.push(format!("removing the FORWARD guard rule: {err:#}"));
            break;
        }
    }
    if Path::new("/sys/class/net").join(BRIDGE).exists()
        && let Err(err) = run("ip", &["link", "del", BRIDGE])
    {
        problems.push(format!("deleting {BRIDGE}: {err:#}"));
    }
    problems.extend(host::restore(before));
    let _ = std::fs::remove_file(MARKER);
    problems
}

/// Written when a node starts, removed when it is taken down: what a run
/// that was killed (SIGKILL, a CI timeout) left, for the next run to undo.
pub const MARKER: &str = "/run/eg-e2e-node.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    /// The test process that runs the node.
    pid: u32,
    dir: PathBuf,
    before: HostSnapshot,
}

/// Undoes what a killed run left, if the marker says one was killed: its
/// pods and shims, mounts, bridge, rules, sysctls and folders. Returns what
/// it did, or `None` when no run was left.
pub fn clean_leftovers() -> Option<Vec<String>> {
    let text = std::fs::read_to_string(MARKER).ok()?;
    let Ok(marker) = serde_json::from_str::<Marker>(&text) else {
        let _ = std::fs::remove_file(MARKER);
        return Some(vec![format!("{MARKER} was unreadable; removed")]);
    };
    if Path::new(&format!("/proc/{}", marker.pid)).exists() {
        // Its run is still going: nothing was left yet.
        return None;
    }
    let mut problems = Vec::new();
    kill_processes_with_arg("kubelet", &marker.dir.display().to_string());
    kill_processes_with_arg("kube-proxy", &marker.dir.display().to_string());
    kill_processes_with_arg("containerd", &marker.dir.display().to_string());
    kill_containers(&marker.dir, &mut problems);
    problems.extend(restore_host(&marker.dir, &marker.before));
    let _ = std::fs::remove_dir_all(&marker.dir);
    Some(problems)
}

/// The FORWARD rule that drops pod traffic toward other interfaces, after
/// `command` (`-I FORWARD 1`, `-C FORWARD`, `-D FORWARD`).
fn guard_rule<'a>(command: &[&'a str]) -> Vec<&'a str> {
    let mut args = command.to_vec();
    args.extend([
        "-i",
        BRIDGE,
        "!",
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        GUARD_COMMENT,
        "-j",
        "DROP",
    ]);
    args
}

fn host_cgroups(name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        for entry in entries.flatten() {
            let path = entry.path().join(name);
            if path.exists() {
                out.push(path);
            }
        }
    }
    out
}

/// Kills (SIGKILL) processes named `comm` whose command line holds `arg`;
/// returns how many it found.
fn kill_processes_with_arg(comm: &str, arg: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut found = 0;
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if name.trim() == comm && cmdline.contains(arg) {
            found += 1;
            // SAFETY: kill(2) on a pid just read from /proc.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    found
}

fn mount_points_under(prefix: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

fn cni_config(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "eg-pods",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            // No masquerade: pod traffic never leaves the host.
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": POD_SUBNET, "gateway": NODE_IP.to_string() }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": ipam_dir.display().to_string(),
            },
        }],
    })
    .to_string()
}

fn containerd_config(dir: &Path, cni_conf: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.opt"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this host lacks.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni}"
"#,
        cni = cni_conf.display()
    )
}

fn kubelet_config(
    ctrd: &Path,
    pki: &eg_harness::certs::Pki,
    dir: &Path,
    resolv: &Path,
    cluster_dns: bool,
) -> String {
    // Pods get the node's address as their nameserver and the cluster's
    // search domains.
    let dns = if cluster_dns {
        format!("clusterDNS: [\"{NODE_IP}\"]\n")
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{sock}
imageServiceEndpoint: unix://{sock}
cgroupDriver: cgroupfs
# This host runs cgroup v1 and has swap settings the kubelet would refuse.
failCgroupV1: false
failSwapOn: false
address: {NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# Signed by the control plane's CA, which kube-apiserver checks (exec, logs).
tlsCertFile: {serving_cert}
tlsPrivateKeyFile: {serving_key}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
volumePluginDir: {dir}/volume-plugins
resolvConf: {resolv}
clusterDomain: cluster.local
{dns}# Imported images cannot be pulled back: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
serializeImagePulls: false
fileCheckFrequency: 1s
syncFrequency: 5s
nodeStatusUpdateFrequency: 2s
"#,
        sock = ctrd.join("containerd.sock").display(),
        ca = pki.ca_cert.display(),
        serving_cert = pki.kubelet_serving_cert.display(),
        serving_key = pki.kubelet_serving_key.display(),
        dir = dir.display(),
        resolv = resolv.display(),
    )
}

/// Runs the kubelet in its own mount namespace: the sysctls it insists on
/// setting at start (vm.overcommit_memory, kernel.panic,
/// kernel.panic_on_oops) are files of ours bind-mounted over /proc/sys
/// there, already holding the values it wants, so the host's stay as they
/// are. Its root folder is an rshared mount made before, so the volumes it
/// mounts reach containerd in the host's namespace.
fn kubelet_wrapper(dir: &Path) -> String {
    format!(
        r#"set -eu
mount --make-rprivate /proc
for kv in vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1; do
  name=${{kv%%=*}}
  file="{dir}/sysctl-$(echo "$name" | tr / -)"
  printf '%s\n' "${{kv#*=}}" >"$file"
  mount --bind "$file" "/proc/sys/$name"
done
exec "$@"
"#,
        dir = dir.display()
    )
}

fn kube_proxy_config(kubeconfig: &str) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
mode: iptables
bindAddress: {NODE_IP}
healthzBindAddress: {NODE_IP}:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: 10.244.0.0/16
nodePortAddresses: ["{NODE_IP}/32"]
# Touch no conntrack sysctls.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  masqueradeAll: false
  # No route_localnet.
  localhostNodePorts: false
  minSyncPeriod: 0s
  syncPeriod: 30s
"#
    )
}
