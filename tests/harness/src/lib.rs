//! A real local Kubernetes control plane for endpoints-guard's end-to-end
//! tests: etcd, kube-apiserver and, on demand, kube-controller-manager, run
//! as plain processes listening only on 127.0.0.1.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
//! let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
//! cp.create_namespace("demo").await?;
//! cp.create_pod(PodBuilder::new("demo", "web-0").label("app", "web").container_port("http", 8080, "TCP"))
//!     .await?;
//! cp.set_pod_status("demo", "web-0", PodStatusSpec::ready(["10.0.0.5"])).await?;
//! let _kcm = cp.start_controller_manager("endpoints-controller", &[])?;
//! # Ok(()) }
//! ```
//!
//! Every child process gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the
//! test process even on abort, and is killed when its handle drops. The
//! temporary folder (certificates, etcd data, logs) is removed on drop, except
//! while the thread is panicking: then the logs are kept, their paths and last
//! lines printed to stderr. Set `EG_KEEP_CONTROLPLANE_DIR=1` to always keep it.

mod admission;
mod apiserver;
mod balancer;
pub mod binaries;
pub mod certs;
mod etcd;
mod etcd_admin;
mod etcd_members;
mod kubeconfig;
pub mod loopback;
mod objects;
pub mod process;
mod shortcuts;
pub mod sockets;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

pub use binaries::Binaries;
pub use certs::{ADMIN_USER, Pki};
pub use etcd_admin::EtcdBackup;
pub use objects::{PodBuilder, PodStatusSpec, ServiceBuilder, ready_ips};
pub use process::Process;

use crate::apiserver::{apiserver_args, wait_ready};
use crate::kubeconfig::Credentials;
use crate::process::free_port;

/// Environment variable that, when set (to anything but empty or `0`), keeps
/// the control plane's temporary folder after the test.
pub const KEEP_DIR_ENV: &str = "EG_KEEP_CONTROLPLANE_DIR";

/// The Service CIDRs given to kube-apiserver: IPv4 first, IPv6 second, so
/// single-stack Services get IPv4 and dual-stack Services work.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16,fd00:10:96::/112";

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// `--etcd-compaction-interval` for kube-apiserver; `None` keeps
    /// upstream's default (5 minutes), `Some(Duration::ZERO)` disables
    /// kube-apiserver's own compaction.
    pub etcd_compaction_interval: Option<Duration>,
    /// Extra kube-apiserver flags (`--name=value`), after ours, so they win.
    pub apiserver_args: Vec<String>,
    /// Extra etcd flags.
    pub etcd_args: Vec<String>,
    /// How long etcd and kube-apiserver each get to become ready.
    pub startup_timeout: Duration,
    /// Runs etcd-fault-proxy between kube-apiserver and etcd, so watch events
    /// can be dropped on their way to kube-apiserver's watch cache (see
    /// [`ControlPlane::etcd_drop_events`]).
    pub etcd_fault_proxy: bool,
    /// With [`Self::etcd_fault_proxy`] and several kube-apiservers: every
    /// one reaches etcd through the proxy, so a dropped event is lost to
    /// every watch cache, not only the first one's.
    pub etcd_fault_proxy_for_every_apiserver: bool,
    /// Where kube-apiserver listens and what it advertises: loopback, or
    /// (for a real node, see [`node`]) an address its pods can reach, which
    /// also turns on the lease endpoint reconciler and ServiceAccount
    /// admission.
    pub bind_address: IpAddr,
    /// etcd members (1: one etcd, as before; 3 or 5: a cluster, every
    /// kube-apiserver given all of them, as production runs, their raft
    /// traffic through etcd-peer-proxy so a member can be partitioned).
    pub etcd_members: usize,
    /// kube-apiservers (2 or more: behind HAProxy, a TCP load balancer,
    /// and [`ControlPlane::client`] and the kubeconfig go through it).
    pub apiservers: usize,
    /// API Priority and Fairness: `None` turns it off (the default: only
    /// slower to start where nothing is measured under load).
    pub priority_and_fairness: Option<InflightLimits>,
}

/// `--max-requests-inflight` and `--max-mutating-requests-inflight`: with
/// API Priority and Fairness on, their sum is the seats the priority levels
/// share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightLimits {
    pub readonly: u32,
    pub mutating: u32,
}

impl InflightLimits {
    /// 20 and 10: few enough seats for a bounded flood on two cores to fill.
    pub const SMALL: InflightLimits = InflightLimits {
        readonly: 20,
        mutating: 10,
    };
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            etcd_compaction_interval: None,
            apiserver_args: Vec::new(),
            etcd_args: Vec::new(),
            startup_timeout: Duration::from_secs(90),
            etcd_fault_proxy: false,
            etcd_fault_proxy_for_every_apiserver: false,
            bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            etcd_members: 1,
            apiservers: 1,
            priority_and_fairness: None,
        }
    }
}

impl ControlPlaneOptions {
    /// Adds one kube-apiserver flag, e.g. `--watch-cache=false`.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Sets `--etcd-compaction-interval` (zero disables it).
    pub fn etcd_compaction_interval(mut self, interval: Duration) -> Self {
        self.etcd_compaction_interval = Some(interval);
        self
    }

    /// Puts etcd-fault-proxy between kube-apiserver and etcd.
    pub fn with_etcd_fault_proxy(mut self) -> Self {
        self.etcd_fault_proxy = true;
        self
    }

    /// Puts etcd-fault-proxy between etcd and every kube-apiserver (see
    /// [`Self::etcd_fault_proxy_for_every_apiserver`]).
    pub fn with_etcd_fault_proxy_for_every_apiserver(mut self) -> Self {
        self.etcd_fault_proxy = true;
        self.etcd_fault_proxy_for_every_apiserver = true;
        self
    }

    /// A production-shaped control plane: three etcd members, two
    /// kube-apiservers behind a load balancer, API Priority and Fairness on
    /// with [`InflightLimits::SMALL`].
    pub fn highly_available() -> Self {
        Self {
            etcd_members: 3,
            apiservers: 2,
            priority_and_fairness: Some(InflightLimits::SMALL),
            ..Self::default()
        }
    }
}

/// A second kube-apiserver on the control plane's etcd
/// ([`ControlPlane::start_second_apiserver`]); stopped when dropped.
pub struct SecondApiserver {
    _process: Process,
    /// Its secure port.
    pub port: u16,
    /// A client of the admin, through this API server.
    pub client: kube::Client,
    /// The admin's kubeconfig for this API server.
    pub kubeconfig: PathBuf,
}

/// A running etcd + kube-apiserver. Dropping it stops both and removes its
/// temporary folder (see the crate documentation for what a panic keeps).
pub struct ControlPlane {
    apiserver: Option<Process>,
    etcd: Option<Process>,
    etcd_proxy: Option<etcd_admin::FaultProxy>,
    etcd_peer_proxy: Option<etcd_members::PeerProxy>,
    etcd_args: Vec<String>,
    etcd_ports: etcd::EtcdPorts,
    /// Every etcd member; the first is `etcd` (and `etcd_ports`), the others
    /// run in `etcd_others`.
    etcd_members: Vec<etcd::Member>,
    etcd_others: Vec<Option<Process>>,
    /// The kube-apiservers besides the first, and the load balancer in
    /// front of all of them.
    extra_apiservers: Vec<SecondApiserver>,
    /// Their `--etcd-servers`: every member, or etcd-fault-proxy.
    extra_apiserver_etcd_servers: String,
    balancer: Option<balancer::Balancer>,
    /// The first kube-apiserver's own client, once `client` goes through
    /// the load balancer.
    direct_client: Option<kube::Client>,
    apiserver_args: Vec<String>,
    binaries: Binaries,
    startup_timeout: Duration,
    pki: Pki,
    secure_port: u16,
    bind_address: IpAddr,
    kubeconfig: PathBuf,
    root: PathBuf,
    log_dir: PathBuf,
    client: kube::Client,
    controller_managers: AtomicUsize,
    keep_logs: bool,
    dir: Option<TempDir>,
}

/// Spawns every etcd member, then waits for each: the first, and the others.
async fn start_etcd(
    binaries: &Binaries,
    root: &Path,
    log_dir: &Path,
    options: &ControlPlaneOptions,
    members: &[etcd::Member],
) -> Result<(Process, Vec<Option<Process>>)> {
    let cluster = etcd::initial_cluster(members);
    let mut spawned = Vec::new();
    for (index, member) in members.iter().enumerate() {
        let data = match index {
            0 => root.join(etcd_admin::DATA_DIR),
            i => root.join(format!("{}-{i}", etcd_admin::DATA_DIR)),
        };
        let log = match index {
            0 => log_dir.join("etcd.log"),
            i => log_dir.join(format!("etcd-{i}.log")),
        };
        spawned.push(etcd::spawn(
            &binaries.etcd,
            &data,
            &log,
            &options.etcd_args,
            member,
            &cluster,
        )?);
    }
    for (process, member) in spawned.iter_mut().zip(members) {
        etcd::wait_healthy(process, member.client_addr(), options.startup_timeout).await?;
    }
    let mut spawned = spawned.into_iter();
    let first = spawned.next().context("no etcd member")?;
    Ok((first, spawned.map(Some).collect()))
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until kube-apiserver is ready
    /// (`/readyz`) and the `default` namespace exists.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self> {
        let binaries = Binaries::locate()?;
        let dir = tempfile::Builder::new()
            .prefix("eg-controlplane-")
            .tempdir()
            .context("creating the control plane's temporary folder")?;
        let root = dir.path().to_path_buf();
        let log_dir = root.join("logs");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let pki = Pki::generate_for(&root.join("pki"), options.bind_address)?;

        let etcd_members = etcd::Member::free(options.etcd_members)?;
        let etcd_ports = etcd_members[0].ports;
        let etcd_peer_proxy =
            etcd_members::PeerProxy::start(&log_dir, &etcd_members, options.startup_timeout)
                .await?;
        let (etcd, etcd_others) =
            match start_etcd(&binaries, &root, &log_dir, &options, &etcd_members).await {
                Ok(started) => started,
                Err(err) => {
                    let kept = dir.keep();
                    return Err(
                        err.context(format!("starting etcd (files kept in {})", kept.display()))
                    );
                }
            };
        let etcd_proxy = if options.etcd_fault_proxy {
            Some(
                etcd_admin::FaultProxy::start(&log_dir, etcd_ports.client, options.startup_timeout)
                    .await?,
            )
        } else {
            None
        };
        // Through etcd-fault-proxy (one member), or every member.
        let every_member = etcd_members
            .iter()
            .map(etcd::Member::client_url)
            .collect::<Vec<_>>()
            .join(",");
        let etcd_servers = match &etcd_proxy {
            Some(proxy) => format!("http://127.0.0.1:{}", proxy.listen_port),
            None => every_member.clone(),
        };
        let extra_apiserver_etcd_servers = if options.etcd_fault_proxy_for_every_apiserver {
            etcd_servers.clone()
        } else {
            every_member
        };

        let secure_port = free_port()?;
        let server = format!(
            "https://{}",
            SocketAddr::new(options.bind_address, secure_port)
        );
        let kubeconfig_text = kubeconfig::render(
            "eg-admin",
            &server,
            &pki.ca_cert,
            Credentials::ClientCert {
                cert: &pki.admin_cert,
                key: &pki.admin_key,
            },
        )?;
        let kubeconfig = root.join("kubeconfig-admin.yaml");
        kubeconfig::write(&kubeconfig, &kubeconfig_text)?;
        let client = kubeconfig::client(&kubeconfig_text).await?;

        let mut cp = Self {
            apiserver: None,
            etcd: Some(etcd),
            etcd_proxy,
            etcd_peer_proxy,
            etcd_args: options.etcd_args.clone(),
            etcd_ports,
            etcd_members,
            etcd_others,
            extra_apiservers: Vec::new(),
            extra_apiserver_etcd_servers,
            balancer: None,
            direct_client: None,
            apiserver_args: apiserver_args(&options, &pki, secure_port, &etcd_servers),
            binaries,
            startup_timeout: options.startup_timeout,
            pki,
            secure_port,
            bind_address: options.bind_address,
            kubeconfig,
            root,
            log_dir,
            client,
            controller_managers: AtomicUsize::new(0),
            keep_logs: false,
            dir: Some(dir),
        };
        cp.start_apiserver().await?;
        if options.apiservers > 1 {
            cp.behind_a_balancer(options.apiservers).await?;
        }
        Ok(cp)
    }

    /// Starts `count - 1` more kube-apiservers, HAProxy in front of all of
    /// them, and points the admin client and kubeconfig at it.
    async fn behind_a_balancer(&mut self, count: usize) -> Result<()> {
        for _ in 1..count {
            let extra = self.start_second_apiserver().await?;
            self.extra_apiservers.push(extra);
        }
        let mut ports = vec![self.secure_port];
        ports.extend(self.extra_apiservers.iter().map(|a| a.port));
        let balancer = balancer::Balancer::start(
            &self.log_dir,
            self.bind_address,
            &ports,
            self.startup_timeout,
        )
        .await?;
        let server = format!(
            "https://{}",
            SocketAddr::new(self.bind_address, balancer.port)
        );
        let kubeconfig_text = kubeconfig::render(
            "eg-admin",
            &server,
            &self.pki.ca_cert,
            Credentials::ClientCert {
                cert: &self.pki.admin_cert,
                key: &self.pki.admin_key,
            },
        )?;
        let path = self.root.join("kubeconfig-admin-balanced.yaml");
        kubeconfig::write(&path, &kubeconfig_text)?;
        self.direct_client = Some(std::mem::replace(
            &mut self.client,
            kubeconfig::client(&kubeconfig_text).await?,
        ));
        self.kubeconfig = path;
        self.balancer = Some(balancer);
        Ok(())
    }

    /// A client authenticated as the admin (CN=eg-admin, O=system:masters).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin kubeconfig, for kube-controller-manager and for our own
    /// binary's `--kubeconfig`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://<bind address>:<port>` (127.0.0.1 unless
    /// [`ControlPlaneOptions::bind_address`] says otherwise): the load
    /// balancer's where there is one, else the kube-apiserver's.
    pub fn server_url(&self) -> String {
        let port = self.balancer.as_ref().map_or(self.secure_port, |b| b.port);
        format!("https://{}", SocketAddr::new(self.bind_address, port))
    }

    /// An admin client of each kube-apiserver on its own, not through the
    /// load balancer: what each one's `/metrics` says is its own.
    pub fn apiserver_clients(&self) -> Vec<kube::Client> {
        std::iter::once(self.direct_client.as_ref().unwrap_or(&self.client).clone())
            .chain(self.extra_apiservers.iter().map(|a| a.client.clone()))
            .collect()
    }

    /// The kube-apiservers behind the load balancer besides the first.
    pub fn extra_apiservers(&self) -> &[SecondApiserver] {
        &self.extra_apiservers
    }

    /// How many etcd members run (or are paused).
    pub fn etcd_member_count(&self) -> usize {
        self.etcd_members.len()
    }

    /// kube-apiserver's secure port.
    pub fn secure_port(&self) -> u16 {
        self.secure_port
    }

    /// `http://127.0.0.1:<port>`: etcd's client URL.
    pub fn etcd_client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_ports.client)
    }

    /// The folder holding one log file per started program.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Keeps the logs when this control plane is dropped (as a panic does):
    /// for a test that fails after it is done with the control plane.
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }

    /// The CA certificate (PEM) that signed the serving and client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// All key and certificate files.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The programs this control plane runs.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// Process ids of the running etcd and kube-apiserver.
    pub fn pids(&self) -> Vec<u32> {
        [&self.etcd, &self.apiserver]
            .into_iter()
            .flatten()
            .filter_map(Process::pid)
            .collect()
    }

    /// Process id of the (first) kube-apiserver, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().and_then(Process::pid)
    }

    /// The log of the (first) kube-apiserver: every start appends to it.
    pub fn apiserver_log(&self) -> PathBuf {
        self.log_dir.join("kube-apiserver.log")
    }

    /// Process ids of every running etcd member.
    pub fn etcd_pids(&self) -> Vec<u32> {
        std::iter::once(&self.etcd)
            .chain(&self.etcd_others)
            .flatten()
            .filter_map(Process::pid)
            .collect()
    }

    /// Writes a kubeconfig that authenticates with a bearer `token` (e.g. a
    /// ServiceAccount token) and returns its path; `name` names the file and
    /// the kubeconfig's context and must be a plain file-name part.
    pub fn kubeconfig_for_token(&self, name: &str, token: &str) -> Result<PathBuf> {
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            bail!("kubeconfig name {name:?} must be a plain file-name part");
        }
        let text = kubeconfig::render(
            name,
            &self.server_url(),
            &self.pki.ca_cert,
            Credentials::Token(token),
        )?;
        let path = self.root.join(format!("kubeconfig-{name}.yaml"));
        kubeconfig::write(&path, &text)?;
        Ok(path)
    }

    /// A client that authenticates with a bearer `token`.
    pub async fn client_for_token(&self, token: &str) -> Result<kube::Client> {
        let text = kubeconfig::render(
            "token",
            &self.server_url(),
            &self.pki.ca_cert,
            Credentials::Token(token),
        )?;
        kubeconfig::client(&text).await
    }

    /// The flags that make kube-controller-manager run as a kubeadm cluster
    /// runs it (after [`start_controller_manager`](Self::start_controller_manager)'s
    /// own, so they win): as its own user, each controller with the
    /// credentials of its ServiceAccount in kube-system. API Priority and
    /// Fairness then serves it as production does (`workload-high`, its
    /// Lease in `leader-election`), not as the exempt admin.
    pub fn kube_controller_manager_identity(&self) -> Result<Vec<String>> {
        let kubeconfig_text = kubeconfig::render(
            "kube-controller-manager",
            &self.server_url(),
            &self.pki.ca_cert,
            Credentials::ClientCert {
                cert: &self.pki.kube_controller_manager_cert,
                key: &self.pki.kube_controller_manager_key,
            },
        )?;
        let path = self.root.join("kubeconfig-kube-controller-manager.yaml");
        kubeconfig::write(&path, &kubeconfig_text)?;
        Ok(vec![
            format!("--kubeconfig={}", path.display()),
            "--use-service-account-credentials=true".to_string(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_private_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
        ])
    }

    /// Starts kube-controller-manager against this control plane with only
    /// `controllers` enabled (e.g. `"endpoints-controller"`, comma-separated
    /// like `--controllers`) and `extra_args` appended. It serves nothing
    /// (`--secure-port=0`). The returned handle kills it on drop.
    pub fn start_controller_manager(
        &self,
        controllers: &str,
        extra_args: &[&str],
    ) -> Result<Process> {
        let n = self.controller_managers.fetch_add(1, Ordering::Relaxed);
        let log = self
            .log_dir
            .join(format!("kube-controller-manager-{n}.log"));
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--controllers={controllers}"),
            "--leader-elect=false".to_string(),
            // No HTTPS endpoint at all (and so nothing listening anywhere);
            // --bind-address would only matter for a non-zero port.
            "--secure-port=0".to_string(),
            "--bind-address=127.0.0.1".to_string(),
            "--use-service-account-credentials=false".to_string(),
            "--v=2".to_string(),
        ];
        args.extend(extra_args.iter().map(|arg| arg.to_string()));
        Process::spawn(
            "kube-controller-manager",
            &self.binaries.kube_controller_manager,
            &args,
            &log,
        )
    }

    /// etcd's current revision.
    pub async fn etcd_revision(&self) -> Result<i64> {
        etcd::current_revision(self.etcd_addr()).await
    }

    /// Compacts etcd at its current revision and returns that revision: every
    /// older revision is gone, so watches from older resourceVersions that
    /// reach etcd fail with 410 Gone.
    pub async fn compact_etcd(&self) -> Result<i64> {
        etcd::compact(self.etcd_addr()).await
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 15 s) and starts it
    /// again on the same port with the same certificates and etcd, waiting
    /// until it is ready. etcd and its data are untouched.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop().await.context("stopping kube-apiserver")?;
        }
        self.start_apiserver().await
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 15 s) and leaves it
    /// stopped until [`ControlPlane::start_apiserver_again`]: clients see their
    /// connections refused meanwhile.
    pub async fn stop_apiserver(&mut self) -> Result<()> {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop().await.context("stopping kube-apiserver")?;
        }
        Ok(())
    }

    /// Starts kube-apiserver after [`ControlPlane::stop_apiserver`], same port,
    /// certificates and etcd; waits until it is ready.
    pub async fn start_apiserver_again(&mut self) -> Result<()> {
        if self.apiserver.is_some() {
            bail!("kube-apiserver is already running");
        }
        self.start_apiserver().await
    }

    /// Deletes one key straight from etcd, behind kube-apiserver's back: e.g.
    /// `/registry/services/specs/<ns>/<name>`. With kube-apiserver stopped, no
    /// watcher ever sees that DELETE — a lost delete, as in
    /// docs/watch-failures.md (C). Returns how many keys were deleted.
    pub async fn etcd_delete_key(&self, key: &str) -> Result<i64> {
        etcd::delete_key(self.etcd_addr(), key).await
    }

    fn etcd_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.etcd_ports.client))
    }

    /// Starts a second kube-apiserver on the same etcd, straight to it (not
    /// through etcd-fault-proxy, when the first goes through it, unless
    /// [`ControlPlaneOptions::etcd_fault_proxy_for_every_apiserver`]), and
    /// waits until it is ready: what production runs, several API servers
    /// each with its own watch cache. It stops when the result is dropped.
    pub async fn start_second_apiserver(&self) -> Result<SecondApiserver> {
        let port = free_port()?;
        let etcd = format!("--etcd-servers={}", self.extra_apiserver_etcd_servers);
        let mut args: Vec<String> = self
            .apiserver_args
            .iter()
            .filter(|a| {
                !a.starts_with("--secure-port=")
                    && !a.starts_with("--etcd-servers=")
                    && !a.starts_with("--endpoint-reconciler-type=")
            })
            .cloned()
            .collect();
        // The first one publishes the `kubernetes` Service's endpoints.
        args.extend([
            format!("--secure-port={port}"),
            etcd,
            "--endpoint-reconciler-type=none".to_string(),
        ]);
        let server = format!("https://{}", SocketAddr::new(self.bind_address, port));
        let kubeconfig_text = kubeconfig::render(
            "eg-admin",
            &server,
            &self.pki.ca_cert,
            Credentials::ClientCert {
                cert: &self.pki.admin_cert,
                key: &self.pki.admin_key,
            },
        )?;
        let kubeconfig = self.root.join(format!(
            "kubeconfig-admin-{}.yaml",
            self.extra_apiservers.len() + 2
        ));
        kubeconfig::write(&kubeconfig, &kubeconfig_text)?;
        let client = kubeconfig::client(&kubeconfig_text).await?;
        let log = self.log_dir.join(format!(
            "kube-apiserver-{}.log",
            self.extra_apiservers.len() + 2
        ));
        let mut process = Process::spawn(
            "kube-apiserver-second",
            &self.binaries.kube_apiserver,
            &args,
            &log,
        )?;
        wait_ready(&client, &mut process, self.startup_timeout)
            .await
            .with_context(|| format!("the second kube-apiserver (log {})", log.display()))?;
        Ok(SecondApiserver {
            _process: process,
            port,
            client,
            kubeconfig,
        })
    }

    /// Starts kube-apiserver and waits for it; on failure the logs are kept.
    async fn start_apiserver(&mut self) -> Result<()> {
        let log = self.apiserver_log();
        let mut process = Process::spawn(
            "kube-apiserver",
            &self.binaries.kube_apiserver,
            &self.apiserver_args,
            &log,
        )?;
        let ready = wait_ready(&self.client, &mut process, self.startup_timeout).await;
        self.apiserver = Some(process);
        ready.map_err(|err| {
            self.keep_logs = true;
            err.context(format!(
                "kube-apiserver did not become ready (logs kept in {})",
                self.log_dir.display()
            ))
        })
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server_url", &self.server_url())
            .field("etcd_client_url", &self.etcd_client_url())
            .field("dir", &self.root)
            .field("apiserver", &self.apiserver)
            .field("etcd", &self.etcd)
            .finish_non_exhaustive()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // kube-apiserver first, so it does not log etcd errors on the way out.
        drop(self.apiserver.take());
        drop(self.balancer.take());
        self.extra_apiservers.clear();
        drop(self.etcd_proxy.take());
        drop(self.etcd.take());
        self.etcd_others.clear();
        let Some(dir) = self.dir.take() else { return };
        let keep_asked = std::env::var(KEEP_DIR_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        if keep_asked || self.keep_logs || std::thread::panicking() {
            let root = dir.keep();
            if !keep_asked {
                // The logs are what a failed test needs; etcd's data is large.
                let _ = std::fs::remove_dir_all(root.join(etcd_admin::DATA_DIR));
                let _ = std::fs::remove_dir_all(root.join(etcd_admin::BACKUP_DIR));
            }
            eprintln!(
                "--- eg-harness: control-plane files kept in {} (logs in {})",
                root.display(),
                self.log_dir.display()
            );
        }
    }
}
