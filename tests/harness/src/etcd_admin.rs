//! What an operator does to etcd, on the local control plane: stop and start
//! it, take a backup, restore it the two ways people do (a plain copy of the
//! data folder back in place; `etcdutl snapshot restore --bump-revision
//! --mark-compacted`, the documented procedure), and, through
//! etcd-fault-proxy, make kube-apiserver's watch miss events.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::binaries;
use crate::loopback::http_json;
use crate::process::{Process, free_ports};
use crate::{ControlPlane, etcd};

/// etcd's data folder, below the control plane's root.
pub(crate) const DATA_DIR: &str = "etcd-data";
/// Where [`ControlPlane::backup_etcd`] keeps its copy.
pub(crate) const BACKUP_DIR: &str = "etcd-backup";

/// A copy of etcd's data folder taken while etcd was stopped.
#[derive(Debug, Clone)]
pub struct EtcdBackup {
    dir: PathBuf,
    /// etcd's revision when the backup was taken.
    pub revision: i64,
}

/// etcd-fault-proxy between kube-apiserver and etcd.
pub(crate) struct FaultProxy {
    process: Process,
    pub listen_port: u16,
    control_port: u16,
}

impl FaultProxy {
    pub async fn start(log_dir: &Path, etcd_client_port: u16, timeout: Duration) -> Result<Self> {
        let program = binaries::program("etcd-fault-proxy")?;
        let [listen_port, control_port] = free_ports()?;
        let args = vec![
            format!("--listen=127.0.0.1:{listen_port}"),
            format!("--upstream=127.0.0.1:{etcd_client_port}"),
            format!("--control=127.0.0.1:{control_port}"),
        ];
        let process = start_proxy(
            "etcd-fault-proxy",
            &program,
            &args,
            log_dir,
            control_port,
            timeout,
        )
        .await?;
        Ok(Self {
            process,
            listen_port,
            control_port,
        })
    }
}

/// Starts one of the control plane's proxies, `name` (etcd-fault-proxy,
/// etcd-peer-proxy), logging to `<name>.log` in `log_dir`, and waits until
/// its control API on `control_port` answers `GET /stats`.
pub(crate) async fn start_proxy(
    name: &str,
    program: &Path,
    args: &[String],
    log_dir: &Path,
    control_port: u16,
    timeout: Duration,
) -> Result<Process> {
    let mut process = Process::spawn(name, program, args, &log_dir.join(format!("{name}.log")))?;
    process
        .wait_until(timeout, Duration::from_millis(100), || async {
            http_json(control_port, "GET", "/stats", None)
                .await
                .map(drop)
        })
        .await?;
    Ok(process)
}

impl ControlPlane {
    fn etcd_data_dir(&self) -> PathBuf {
        self.root.join(DATA_DIR)
    }

    /// Stops etcd (SIGTERM, then SIGKILL after 15 s); its data stays.
    pub async fn stop_etcd(&mut self) -> Result<()> {
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop().await.context("stopping etcd")?;
        }
        Ok(())
    }

    /// Starts etcd again on the same ports and data folder, waiting until it
    /// is healthy.
    pub async fn start_etcd_again(&mut self) -> Result<()> {
        if self.etcd.is_some() {
            bail!("etcd is already running");
        }
        if self.etcd_members.len() > 1 {
            bail!("stopping and starting etcd is for a one-member cluster");
        }
        let etcd = etcd::start(
            &self.binaries.etcd,
            &self.etcd_data_dir(),
            &self.log_dir.join("etcd.log"),
            &self.etcd_args,
            &self.etcd_members[0],
            self.startup_timeout,
        )
        .await?;
        self.etcd = Some(etcd);
        Ok(())
    }

    /// Takes a backup the way a cron job with `cp -a` would: etcd is stopped
    /// for the copy (kube-apiserver sees it unavailable for a moment) and
    /// started again.
    pub async fn backup_etcd(&mut self) -> Result<EtcdBackup> {
        let revision = self.etcd_revision().await?;
        self.stop_etcd().await?;
        let dir = self.root.join(BACKUP_DIR);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        copy_dir(&self.etcd_data_dir(), &dir)?;
        self.start_etcd_again().await?;
        Ok(EtcdBackup { dir, revision })
    }

    /// A plain restore: kube-apiserver and etcd stopped, the data folder
    /// replaced by the backup, both started again. The store's revision is
    /// back at the backup's: every resourceVersion a client saw since then is
    /// in the future of the restored store.
    pub async fn restore_etcd_plain(&mut self, backup: &EtcdBackup) -> Result<()> {
        self.stop_apiserver().await?;
        self.stop_etcd().await?;
        let data = self.etcd_data_dir();
        std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
        copy_dir(&backup.dir, &data)?;
        self.start_etcd_again().await?;
        self.start_apiserver_again().await
    }

    /// The documented restore (kubernetes#118501, etcd#16028):
    /// `etcdutl snapshot restore --bump-revision <bump> --mark-compacted`
    /// from the backup's database, with kube-apiserver and etcd stopped. The
    /// revision jumps `bump` past the backup's and every older revision is
    /// compacted, so every watch gets 410 and relists; restored objects keep
    /// their old resourceVersions.
    pub async fn restore_etcd_bumped(&mut self, backup: &EtcdBackup, bump: u64) -> Result<()> {
        let etcdutl = binaries::program("etcdutl")?;
        self.stop_apiserver().await?;
        self.stop_etcd().await?;
        let data = self.etcd_data_dir();
        std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
        let snapshot = backup.dir.join("member").join("snap").join("db");
        let peer = self.etcd_members[0].ports.peer_url();
        let args = [
            "snapshot".to_string(),
            "restore".to_string(),
            snapshot.display().to_string(),
            // A database copied from a data folder carries no snapshot hash.
            "--skip-hash-check".to_string(),
            format!("--bump-revision={bump}"),
            "--mark-compacted".to_string(),
            "--name=eg".to_string(),
            format!("--initial-cluster=eg={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--data-dir={}", data.display()),
        ];
        let output = tokio::process::Command::new(&etcdutl)
            .args(&args)
            .output()
            .await
            .with_context(|| format!("running {}", etcdutl.display()))?;
        if !output.status.success() {
            bail!(
                "etcdutl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        self.start_etcd_again().await?;
        self.start_apiserver_again().await
    }

    /// Writes `count` revisions that concern no Service, pod or Endpoints:
    /// 16 ConfigMaps of `namespace` updated over and over, 16 writes in flight.
    /// After a backup, these put the store far ahead of it.
    pub async fn write_unrelated_revisions(&self, namespace: &str, count: usize) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::Api;
        use kube::api::{Patch, PatchParams, PostParams};
        let api: Api<ConfigMap> = Api::namespaced(self.client(), namespace);
        let names: Vec<String> = (0..16).map(|i| format!("eg-filler-{i}")).collect();
        for name in &names {
            let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}}))?;
            match api.create(&PostParams::default(), &cm).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => return Err(err).context("creating a filler ConfigMap"),
            }
        }
        futures::stream::iter(0..count)
            .map(|i| {
                let api = api.clone();
                let name = names[i % names.len()].clone();
                async move {
                    let patch = Patch::Merge(json!({"data": {"n": i.to_string()}}));
                    api.patch(&name, &PatchParams::default(), &patch).await
                }
            })
            .buffer_unordered(16)
            .try_for_each(|_| async { Ok(()) })
            .await
            .context("writing unrelated revisions")
    }

    fn fault_proxy(&self) -> Result<&FaultProxy> {
        self.etcd_proxy
            .as_ref()
            .ok_or_else(|| anyhow!("this control plane runs without etcd-fault-proxy (ControlPlaneOptions::with_etcd_fault_proxy)"))
    }

    /// Makes kube-apiserver's watch of etcd miss the events of `key` (e.g.
    /// `/registry/pods/<ns>/<name>`) whose type is in `types` (`PUT`,
    /// `DELETE`), until [`ControlPlane::etcd_clear_drops`]. Its watch cache
    /// then serves the object as it was, in every watch and every LIST.
    pub async fn etcd_drop_events(&self, key: &str, types: &[&str]) -> Result<Value> {
        let proxy = self.fault_proxy()?;
        http_json(
            proxy.control_port,
            "POST",
            "/drop",
            Some(json!({"key": key, "types": types, "count": 0})),
        )
        .await
    }

    /// Forgets every drop rule.
    pub async fn etcd_clear_drops(&self) -> Result<Value> {
        let proxy = self.fault_proxy()?;
        http_json(proxy.control_port, "DELETE", "/drop", None).await
    }

    /// Holds (`true`) or releases every response of kube-apiserver's
    /// watches of etcd: its watch cache stalls while its reads and writes
    /// go on, as when the member serving its watch is cut off from the
    /// others; released, the held responses arrive in order.
    pub async fn etcd_hold_watches(&self, hold: bool) -> Result<Value> {
        let proxy = self.fault_proxy()?;
        let method = if hold { "POST" } else { "DELETE" };
        http_json(proxy.control_port, method, "/hold", None).await
    }

    /// How many watch events etcd-fault-proxy dropped so far.
    pub async fn etcd_dropped_events(&self) -> Result<u64> {
        let proxy = self.fault_proxy()?;
        let stats = http_json(proxy.control_port, "GET", "/stats", None).await?;
        stats["dropped_events"]
            .as_u64()
            .ok_or_else(|| anyhow!("no dropped_events in {stats}"))
    }

    /// Whether etcd-fault-proxy still runs (for tests that check their setup).
    pub fn etcd_fault_proxy_running(&mut self) -> bool {
        self.etcd_proxy
            .as_mut()
            .is_some_and(|p| p.process.ensure_running().is_ok())
    }
}

/// `cp -a`, for the few plain files and folders of an etcd data folder.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).with_context(|| {
                format!("copying {} to {}", entry.path().display(), target.display())
            })?;
        }
    }
    Ok(())
}
