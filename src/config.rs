//! Command-line flags (each also settable through an `EG_*` environment variable).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Keep Endpoints in sync with Services and Pods.
    Enforce,
    /// Write nothing: compute desired Endpoints, report divergences and deletions
    /// made by others while their Service existed.
    Audit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A Kubernetes endpoints controller that never deletes Endpoints on a stale cache.
#[derive(Debug, Clone, Parser)]
#[command(name = "endpoints-guard", version, about, long_about = None)]
pub struct Config {
    /// Path to a kubeconfig file. Without it: $KUBECONFIG, then the in-cluster
    /// service account, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// kubeconfig context to use (default: the current context).
    #[arg(long, env = "EG_CONTEXT")]
    pub context: Option<String>,

    /// enforce: keep Endpoints in sync. audit: only watch and report.
    #[arg(long, env = "EG_MODE", value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,

    /// Reconciles running at once (upstream's --concurrent-endpoint-syncs is 5).
    #[arg(long, env = "EG_WORKERS", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,

    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "EG_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "EG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Only handle Services, Pods and Endpoints of this namespace (default: all).
    #[arg(long, env = "EG_NAMESPACE")]
    pub namespace: Option<String>,

    /// How often to list everything from the API and repair what the watch missed
    /// (e.g. 300s, 5m, 1h; 0 turns it off).
    #[arg(long, env = "EG_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// How long to keep trying to reach the API server at start-up before giving up.
    #[arg(long, env = "EG_STARTUP_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub startup_timeout: Duration,

    /// Page size of every consistent LIST.
    #[arg(long, env = "EG_LIST_PAGE_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub list_page_size: u32,

    /// Elect a leader on a coordination.k8s.io Lease: only the leader writes, the
    /// others keep their caches warm. Turn on when running more than one replica.
    #[arg(long, env = "EG_LEADER_ELECT")]
    pub leader_elect: bool,

    /// Namespace of the Lease (default: $POD_NAMESPACE, else the service
    /// account's namespace, else "default").
    #[arg(long, env = "EG_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(
        long,
        env = "EG_LEADER_ELECTION_LEASE_NAME",
        default_value = "endpoints-guard"
    )]
    pub leader_election_lease_name: String,

    /// How long a Lease stays valid after its last renewal: a replica that dies
    /// is replaced after at most this long (whole seconds).
    #[arg(long, env = "EG_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// The leader renews this long before the Lease expires; it is also the
    /// clock skew between replicas that is tolerated (whole seconds, shorter than
    /// the lease duration).
    #[arg(long, env = "EG_LEADER_ELECTION_RENEW_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub leader_election_renew_grace: Duration,
}

/// Parses `300`, `300s`, `5m`, `1h` or `250ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 30s, 5m, 1h)"))?;
    let seconds = match unit {
        "ms" => return Ok(Duration::from_millis(value)),
        "" | "s" => value,
        "m" => value * 60,
        "h" => value * 3600,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn defaults_match_upstream_where_it_has_one() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.workers, 5);
        assert_eq!(cfg.mode, Mode::Enforce);
        assert_eq!(cfg.resync_interval, Duration::from_secs(300));
    }

    #[test]
    fn leader_election_flags() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert!(!cfg.leader_elect);
        assert_eq!(cfg.leader_election_lease_name, "endpoints-guard");
        assert_eq!(cfg.leader_election_lease_duration, Duration::from_secs(15));
        let cfg = Config::try_parse_from(["endpoints-guard", "--leader-elect"]).expect("parse");
        assert!(cfg.leader_elect);
    }

    #[test]
    fn bad_mode_is_rejected() {
        assert!(Config::try_parse_from(["endpoints-guard", "--mode", "yolo"]).is_err());
    }
}
