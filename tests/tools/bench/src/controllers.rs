//! The controllers under test, each with its own ServiceAccount (bound to
//! cluster-admin) so the audit log tells their requests apart: endpoints-guard,
//! kube-controller-manager with its default client limits (QPS 20, burst 30)
//! and kube-controller-manager again with raised limits, so that its cold sync
//! shows the controller rather than its client's rate limiter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Kind;
use eg_harness::ControlPlane;
use eg_harness::loopback;
use eg_harness::process::{Process, free_port};
use eg_workload::procstat;

/// Which controller a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Controller {
    #[serde(rename = "endpoints-guard")]
    Guard,
    #[serde(rename = "kube-controller-manager")]
    Upstream,
    /// kube-controller-manager with `--kube-api-qps` / `--kube-api-burst`
    /// raised (`BenchOptions::fast_upstream_qps`).
    #[serde(rename = "kube-controller-manager-fast")]
    UpstreamFast,
}

impl Controller {
    /// Every controller, in the order a run measures them.
    pub const ALL: [Controller; 3] = [
        Controller::Guard,
        Controller::Upstream,
        Controller::UpstreamFast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Guard => "endpoints-guard",
            Controller::Upstream => "kube-controller-manager",
            Controller::UpstreamFast => "kube-controller-manager-fast",
        }
    }

    /// `name()` back to the controller (`--only`).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether it is kube-controller-manager (either client limit).
    pub fn is_upstream(self) -> bool {
        self != Controller::Guard
    }

    fn account(self) -> &'static str {
        match self {
            Controller::Guard => "eg-bench-guard",
            Controller::Upstream => "eg-bench-kcm",
            Controller::UpstreamFast => "eg-bench-kcm-fast",
        }
    }

    /// The user name its requests carry in the audit log.
    pub fn user(self) -> String {
        format!("system:serviceaccount:kube-system:{}", self.account())
    }
}

/// Creates the controller's ServiceAccount, binds it to cluster-admin and
/// writes a kubeconfig with a token for it.
pub async fn credentials(cp: &ControlPlane, controller: Controller) -> Result<PathBuf> {
    let name = controller.account();
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(cp.client(), "kube-system");
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    accounts
        .create(&pp, &account)
        .await
        .with_context(|| format!("creating ServiceAccount {name}"))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
    }))?;
    Api::<ClusterRoleBinding>::all(cp.client())
        .create(&pp, &binding)
        .await
        .with_context(|| format!("binding {name} to cluster-admin"))?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(48 * 3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &pp, &request)
        .await
        .with_context(|| format!("requesting a token for {name}"))?
        .status
        .and_then(|s| s.token)
        .context("the token request returned no token")?;
    cp.kubeconfig_for_token(name, &token)
}

/// The endpoints-guard binary a tool measures: `EG_BINARY`, else the
/// workspace's release build.
pub fn guard_binary(workspace_root: &Path) -> PathBuf {
    std::env::var_os("EG_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root.join("target/release/endpoints-guard"))
}

/// What endpoints-guard runs with where the bench passes no flag, read from
/// the binary's own `--help`: a report then states the values of the binary
/// it measured, whichever build that was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuardDefaults {
    /// `--resync-interval` (zero: no periodic resync).
    pub resync_interval: Duration,
    /// `--ghost-scan-qps`.
    pub ghost_scan_qps: f64,
    /// `--full-resync-interval`; `None` for a build without it, whose
    /// every resync lists in full.
    pub full_resync_interval: Option<Duration>,
    /// `--ghost-scan-period`; `None` for a build without it.
    pub ghost_scan_period: Option<Duration>,
    /// How often the leader renews its Lease: `--leader-election-lease-duration`
    /// less `--leader-election-renew-grace`; `None` for a build without them.
    pub lease_renewal_every: Option<Duration>,
}

impl GuardDefaults {
    /// Runs `binary --help` and reads the defaults from it.
    pub async fn of_binary(binary: &Path) -> Result<Self> {
        let output = tokio::process::Command::new(binary)
            .arg("--help")
            .output()
            .await
            .with_context(|| format!("running {} --help", binary.display()))?;
        if !output.status.success() {
            bail!("{} --help exited with {}", binary.display(), output.status);
        }
        Self::from_help(&String::from_utf8_lossy(&output.stdout))
            .with_context(|| format!("reading the defaults of {}", binary.display()))
    }

    fn from_help(help: &str) -> Result<Self> {
        let value = |flag: &str| {
            flag_default(help, flag).with_context(|| format!("--help shows no default of {flag}"))
        };
        let duration = |flag: &str, text: &str| -> Result<Duration> {
            if text.trim_end_matches(char::is_alphabetic) == "0" {
                return Ok(Duration::ZERO);
            }
            eg_workload::parse_duration(text).with_context(|| format!("{flag}'s default {text:?}"))
        };
        let resync_interval = duration("--resync-interval", value("--resync-interval")?)?;
        // A flag an older build lacks: `None`.
        let optional = |flag: &str| {
            flag_default(help, flag)
                .map(|text| duration(flag, text))
                .transpose()
        };
        let full_resync_interval = optional("--full-resync-interval")?;
        let ghost_scan_period = optional("--ghost-scan-period")?;
        let lease_renewal_every = match (
            optional("--leader-election-lease-duration")?,
            optional("--leader-election-renew-grace")?,
        ) {
            (Some(lease), Some(grace)) => lease.checked_sub(grace),
            _ => None,
        };
        let qps = value("--ghost-scan-qps")?;
        let ghost_scan_qps = qps
            .parse()
            .with_context(|| format!("--ghost-scan-qps's default {qps:?}"))?;
        Ok(Self {
            resync_interval,
            ghost_scan_qps,
            full_resync_interval,
            ghost_scan_period,
            lease_renewal_every,
        })
    }
}

/// The `[default: …]` clap's long help shows for `flag`: the first one after
/// the flag's own line and before the next option's.
fn flag_default<'a>(help: &'a str, flag: &str) -> Option<&'a str> {
    let names_flag = |line: &str| {
        line.strip_prefix(flag)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '=']))
    };
    let mut lines = help
        .lines()
        .map(str::trim)
        .skip_while(|line| !names_flag(line));
    lines.next()?;
    for line in lines {
        if line.starts_with('-') {
            return None;
        }
        if let Some(value) = line
            .strip_prefix("[default: ")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            return Some(value);
        }
    }
    None
}

/// A running controller process.
pub struct Running {
    pub process: Process,
    /// endpoints-guard's metrics port (none for kube-controller-manager).
    pub metrics_port: Option<u16>,
}

impl Running {
    pub fn pid(&self) -> Result<u32> {
        self.process.pid().context("the controller is not running")
    }

    pub fn cpu(&self) -> Result<procstat::CpuSample> {
        procstat::CpuSample::read(self.pid()?)
    }

    pub fn peak_rss_mb(&self) -> Result<f64> {
        procstat::peak_rss_mb(self.pid()?)
    }

    /// Scrapes endpoints-guard's /metrics.
    pub async fn metrics(&self) -> Result<String> {
        let port = self.metrics_port.context("no metrics server")?;
        loopback::get(port, "/metrics").await
    }

    /// Waits until endpoints-guard answers /readyz (caches synced).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let Some(port) = self.metrics_port else {
            return Ok(());
        };
        self.process
            .wait_until(timeout, Duration::from_millis(100), || async move {
                loopback::get(port, "/readyz").await.map(drop)
            })
            .await
    }
}

/// Starts endpoints-guard with 5 workers, page size 500 and `extra_args`
/// (e.g. `--resync-interval=5m`).
pub fn start_guard(
    cp: &ControlPlane,
    binary: &Path,
    kubeconfig: &Path,
    extra_args: &[String],
    log_name: &str,
) -> Result<Running> {
    let port = free_port()?;
    let mut args: Vec<String> = [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--workers",
        "5",
        "--list-page-size",
        "500",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra_args.iter().cloned());
    let process = Process::spawn(
        "endpoints-guard",
        binary,
        &args,
        &cp.log_dir().join(format!("{log_name}.log")),
    )?;
    Ok(Running {
        process,
        metrics_port: Some(port),
    })
}

/// Starts kube-controller-manager with only its controller of `kind`
/// (`endpoints-controller` or `endpointslice-controller`), with upstream's
/// defaults (5 workers, client QPS 20 / burst 30) unless `extra_args` says
/// otherwise.
pub fn start_upstream(
    cp: &ControlPlane,
    kubeconfig: &Path,
    kind: Kind,
    extra_args: &[String],
    log_name: &str,
) -> Result<Running> {
    let (controller, workers_flag) = kind.upstream_controller();
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--controllers={controller}"),
        "--leader-elect=false".to_string(),
        "--secure-port=0".to_string(),
        "--bind-address=127.0.0.1".to_string(),
        "--use-service-account-credentials=false".to_string(),
        format!("{workers_flag}=5"),
        "--v=1".to_string(),
    ];
    args.extend(extra_args.iter().cloned());
    let process = Process::spawn(
        "kube-controller-manager",
        &cp.binaries().kube_controller_manager,
        &args,
        &cp.log_dir().join(format!("{log_name}.log")),
    )?;
    Ok(Running {
        process,
        metrics_port: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of clap's long help, as endpoints-guard prints it.
    const HELP: &str = "Usage: endpoints-guard [OPTIONS]

Options:
      --resync-interval <RESYNC_INTERVAL>
          How often to list everything from the API (e.g. 90s, 2m, 1h; 0 turns it off)
          
          [env: EG_RESYNC_INTERVAL=]
          [default: 2m]

      --list-page-size <LIST_PAGE_SIZE>
          Page size of every consistent LIST
          
          [default: 500]

      --ghost-scan-qps <GHOST_SCAN_QPS>
          The most reads a second spent on finding ghosts
          
          [env: EG_GHOST_SCAN_QPS=]
          [default: 5]

      --ghost-scan-period <GHOST_SCAN_PERIOD>
          [default: 6h]

      --leader-election-lease-duration <LEADER_ELECTION_LEASE_DURATION>
          [default: 15s]

      --leader-election-renew-grace <LEADER_ELECTION_RENEW_GRACE>
          [default: 10s]

  -h, --help
          Print help (see a summary with '-h')
";

    #[test]
    fn defaults_come_from_each_flags_own_entry() {
        assert_eq!(
            GuardDefaults::from_help(HELP).ok(),
            Some(GuardDefaults {
                resync_interval: Duration::from_secs(120),
                ghost_scan_qps: 5.0,
                full_resync_interval: None,
                ghost_scan_period: Some(Duration::from_secs(6 * 3600)),
                lease_renewal_every: Some(Duration::from_secs(5)),
            })
        );
        let counted = HELP.replace(
            "      --list-page-size",
            "      --full-resync-interval <FULL_RESYNC_INTERVAL>\n          [default: 20m]\n\n      --list-page-size",
        );
        assert_eq!(
            GuardDefaults::from_help(&counted)
                .ok()
                .and_then(|d| d.full_resync_interval),
            Some(Duration::from_secs(1200))
        );
        assert_eq!(flag_default(HELP, "--ghost-scan-period"), Some("6h"));
        // A flag without a default of its own does not take the next flag's.
        let without = HELP.replace("          [default: 2m]\n", "");
        assert_eq!(flag_default(&without, "--resync-interval"), None);
        assert!(GuardDefaults::from_help(&without).is_err());
        assert_eq!(flag_default(HELP, "--resync"), None);
    }

    #[test]
    fn a_zero_resync_interval_is_off() {
        let off = HELP.replace("[default: 2m]", "[default: 0s]");
        assert_eq!(
            GuardDefaults::from_help(&off)
                .map(|d| d.resync_interval)
                .ok(),
            Some(Duration::ZERO)
        );
    }
}
