//! Command-line flags (each also settable through an `EG_*` environment variable).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::desired::scope::Scope;
use crate::desired::{FeatureGates, KubeRelease, ManagedBy};
pub use crate::settings::{Controller, Controllers, Mode};

/// How objects come off the wire (`--wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Wire {
    /// Pods as protobuf, where the API server serves it (JSON otherwise,
    /// answer by answer); every other kind as JSON.
    Protobuf,
    /// Everything as JSON.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A Kubernetes endpoints controller that never deletes Endpoints on a stale cache.
#[derive(Debug, Clone, Parser)]
// A flag given twice takes its last value: the chart's extraArgs come after
// the flags it sets and override them.
#[command(name = "endpoints-guard", version, about, long_about = None, args_override_self = true)]
pub struct Config {
    /// Path to a kubeconfig file. Without it: $KUBECONFIG, then the in-cluster
    /// service account, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// kubeconfig context to use (default: the current context).
    #[arg(long, env = "EG_CONTEXT")]
    pub context: Option<String>,

    /// Which controllers run, comma-separated: endpoints, endpointslices.
    /// Turn off kube-controller-manager's counterpart of each
    /// (`--controllers=*,-endpoints-controller,-endpointslice-controller`).
    #[arg(long, env = "EG_CONTROLLERS", value_enum, value_delimiter = ',', default_values_t = Controller::ALL)]
    pub controllers: Vec<Controller>,

    /// Most endpoints in one EndpointSlice (upstream's default is 100).
    #[arg(long, env = "EG_MAX_ENDPOINTS_PER_SLICE", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub max_endpoints_per_slice: u16,

    /// Which Services are handled: all (every Service with a selector, in
    /// place of kube-controller-manager's Endpoints and EndpointSlice
    /// controllers, which must be turned off) or opt-in (only Services
    /// labelled endpoints-guard/opt-in=true, with their selector in the
    /// annotation endpoints-guard/selector, beside upstream's controllers;
    /// docs/opt-in.md).
    #[arg(long, env = "EG_SCOPE", value_enum, default_value_t = Scope::All)]
    pub scope: Scope,

    /// In opt-in scope, how long the objects of a Service that opted out
    /// stay when upstream's controllers do not publish the same ready
    /// endpoints (the Service got no selector back, say); they go at once
    /// when upstream's do.
    #[arg(long, env = "EG_OPT_OUT_GRACE", default_value = "5m", value_parser = parse_duration)]
    pub opt_out_grace: Duration,

    /// The managed-by labels written: upstream (`endpoint-controller` on
    /// Endpoints, `endpointslice-controller.k8s.io` on EndpointSlices, as
    /// conformance requires; the default in all scope) or own
    /// (`endpoints-guard` on both; always in opt-in scope, where upstream's
    /// controllers would take objects with their values as theirs). In all
    /// scope objects with either value are taken as this controller's.
    #[arg(long, env = "EG_MANAGED_BY", value_enum)]
    pub managed_by: Option<crate::desired::ManagedBy>,

    /// Whose kube-controller-manager to write as: 1.34, 1.35, 1.36 or 1.37.
    /// Unset: the API server's own minor, read at start-up (a server outside
    /// 1.34–1.37 is then an error). Set it when kube-controller-manager runs
    /// another minor than the API server (version skew allows one behind).
    #[arg(long, env = "EG_KUBE_RULES", value_enum)]
    pub kube_rules: Option<KubeRelease>,

    /// kube-controller-manager's feature gates that change what it writes
    /// and that its version does not tell, as its own flag writes them:
    /// PreferSameTrafficDistribution=false when the 1.34 cluster turned that
    /// beta gate off (no hints for PreferSameZone and PreferSameNode then;
    /// locked on from 1.35).
    #[arg(long, env = "EG_FEATURE_GATES", default_value = "", value_parser = FeatureGates::parse)]
    pub feature_gates: FeatureGates,

    /// enforce: keep Endpoints and EndpointSlices in sync. audit: only watch
    /// and report.
    #[arg(long, env = "EG_MODE", value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,

    /// Reconciles running at once (upstream's --concurrent-endpoint-syncs is 5).
    #[arg(long, env = "EG_WORKERS", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,

    /// Address of the plain-HTTP server: /healthz and /readyz, and /metrics
    /// unless --secure-metrics-addr is set.
    #[arg(long, env = "EG_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Serve /metrics over HTTPS on this address instead, only to callers
    /// whose bearer token a TokenReview authenticates and who may `get` the
    /// non-resource URL /metrics (SubjectAccessReview); answers are cached for
    /// 10s. Unset: /metrics is plain and open on --metrics-addr (local
    /// development).
    #[arg(long, env = "EG_SECURE_METRICS_ADDR")]
    pub secure_metrics_addr: Option<SocketAddr>,

    /// PEM certificate (chain) of the HTTPS metrics server, e.g. a mounted
    /// kubernetes.io/tls Secret's tls.crt; read again every 10s and used when
    /// it changed. Without it and --tls-private-key-file: a self-signed
    /// certificate made at start-up.
    #[arg(long, env = "EG_TLS_CERT_FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "EG_TLS_PRIVATE_KEY_FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "EG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Only handle Services, Pods and Endpoints of this namespace (default: all).
    #[arg(long, env = "EG_NAMESPACE")]
    pub namespace: Option<String>,

    /// How often to list everything from the API and repair what the watch
    /// missed (e.g. 90s, 2m, 1h; 0 turns it off). Each list asks for exactly
    /// the store's current resourceVersion, which kube-apiserver
    /// (v1.34+) serves from etcd once its own check (every 5 to 7.5 minutes)
    /// found its watch cache inconsistent: an object that cache kept after
    /// etcd deleted it is found within this long of that check. Only the
    /// leader resyncs; a replica that becomes leader resyncs at once.
    #[arg(long, env = "EG_RESYNC_INTERVAL", default_value = "90s", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// How often a resync lists everything in full. The resyncs between
    /// compare counts only: per resource, a one-item LIST for the store's
    /// current resourceVersion and one at exactly it for the count it holds
    /// there (served from etcd where a full list would be), and a full list of that
    /// resource only where the count differs (a lost DELETE or ADD, a
    /// ghost once kube-apiserver serves the list from etcd) or gives no
    /// answer, or where deletion candidates or drift from the last list wait
    /// to be settled. What a count cannot see (an object changed in place that the
    /// watch missed) waits for the full list. At or below --resync-interval
    /// every resync lists in full.
    #[arg(long, env = "EG_FULL_RESYNC_INTERVAL", default_value = "20m", value_parser = parse_duration)]
    pub full_resync_interval: Duration,

    /// The share of the time a scheduled listing keeps kube-apiserver
    /// serving its pages, 0.01 to 1: the full resync every
    /// --full-resync-interval (its kinds listed one after another), and the
    /// compaction audit's listing every
    /// --compaction-audit-full-every revisions. After each page the list
    /// waits as long as the page took × (1/share − 1), the watches applying
    /// events meanwhile, so that a change made during it is answered as
    /// fast as outside one (kube-apiserver answers every client slower while
    /// it serves pages back to back); the pauses shrink so that a list ends
    /// within 4 minutes, before etcd compacts the revision it lists. 1: no
    /// pause. Lists that a count
    /// check, deletion candidates, an election or counts that differ call
    /// for are never paced.
    #[arg(long, env = "EG_PACED_LIST_SHARE", default_value_t = 0.05, value_parser = |text: &str| SHARE.parse(text))]
    pub paced_list_share: f64,

    /// How long to keep trying to reach the API server at start-up before giving up.
    #[arg(long, env = "EG_STARTUP_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub startup_timeout: Duration,

    /// Page size of every consistent LIST.
    #[arg(long, env = "EG_LIST_PAGE_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub list_page_size: u32,

    /// How pods are read: protobuf (kube-apiserver's
    /// application/vnd.kubernetes.protobuf, the cheaper decode; an API server
    /// or proxy that answers JSON is read as JSON) or json.
    #[arg(long, env = "EG_WIRE", value_enum, default_value_t = Wire::Protobuf)]
    pub wire: Wire,

    /// Retries of a failing reconcile (per-key backoff from 5 ms, doubling)
    /// before its key is dropped until the next change or resync (upstream: 15).
    #[arg(long, env = "EG_MAX_RETRIES", default_value_t = crate::reconcile::queue::MAX_RETRIES, value_parser = clap::value_parser!(u32).range(0..=30))]
    pub max_retries: u32,

    /// The most reads a second spent on finding ghosts: objects the API
    /// server's watch cache keeps after etcd deleted them, or in an older
    /// state than etcd's. Every pod named by an address of our Endpoints or
    /// slices, and every Service with either, is read (its metadata, from
    /// etcd) in turn, pods behind ready addresses first. 0 turns the scan's
    /// passes off (what the compaction audit finds is still read). The resync finds such ghosts within minutes where kube-apiserver
    /// checks its watch cache (--resync-interval); the scan also finds them
    /// where it does not, and before it does (docs/ghosts.md).
    #[arg(long, env = "EG_GHOST_SCAN_QPS", default_value_t = 5.0, value_parser = |text: &str| READS_QPS.parse(text))]
    pub ghost_scan_qps: f64,

    /// One ghost-scan pass over all those objects is spread over this long
    /// (at least one read every two seconds, at most --ghost-scan-qps): the
    /// scan alone finds a ghost within about this long where the cap does
    /// not bind (up to 108,000 pods and Services at the defaults), else
    /// within objects / qps. It is the backstop: the resync and the
    /// compaction audit find a ghost within minutes (docs/ghosts.md). 0:
    /// read as fast as --ghost-scan-qps allows. A shorter period finds a
    /// ghost sooner for more reads (docs/bench-runs.md).
    #[arg(long, env = "EG_GHOST_SCAN_PERIOD", default_value = "6h", value_parser = parse_duration)]
    pub ghost_scan_period: Duration,

    /// How often to ask whether etcd was compacted since the last audit (one
    /// one-item LIST per resource). After each compaction, etcd's count of
    /// pods and of Services at the compaction revision (kube-apiserver
    /// serves a LIST there from etcd) is set against the cache's count at
    /// that revision; when they differ, the metadata of every one is listed
    /// there and what the ghost scan would read is compared with it: a
    /// ghost is found within about two compaction intervals
    /// (kube-apiserver's --etcd-compaction-interval, 5 minutes by default)
    /// plus this, whether or not kube-apiserver checks its watch cache
    /// (docs/ghosts.md). 0 turns the audit off.
    #[arg(long, env = "EG_COMPACTION_AUDIT_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub compaction_audit_interval: Duration,

    /// Every how many compaction revisions the audit lists pods and
    /// Services in full even when the counts agree: what a lost update, or
    /// a lost creation and a lost deletion that cancel out, waits for
    /// (6: about 30 minutes at kube-apiserver's default compaction). 1 lists
    /// at every compaction revision.
    #[arg(long, env = "EG_COMPACTION_AUDIT_FULL_EVERY", default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub compaction_audit_full_every: u32,

    /// Client-side limit of requests a second to the API server (as
    /// kube-controller-manager's flag of the same name); 0, the default: no
    /// client-side limit, the API server's priority and fairness decides.
    #[arg(long, env = "EG_KUBE_API_QPS", default_value_t = 0.0, value_parser = |text: &str| API_QPS.parse(text))]
    pub kube_api_qps: f64,

    /// Requests allowed at once above --kube-api-qps before the limit holds
    /// them back (used only when --kube-api-qps is above 0).
    #[arg(long, env = "EG_KUBE_API_BURST", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub kube_api_burst: u32,

    /// Ask the API server for uncompressed answers. By default large answers
    /// (kube-apiserver gzips those over 128 KiB: list pages, not watches or
    /// single objects) come gzipped: the compaction audit's lists, mostly
    /// managedFields, in a fourteenth of their bytes, with no measured rise
    /// in kube-apiserver's CPU (docs/bench-runs.md, "Compressed answers"). A
    /// kubeconfig's `disable-compression` does the same.
    #[arg(long, env = "EG_DISABLE_COMPRESSION")]
    pub disable_compression: bool,

    /// Threads that run the controller. 1, the default, runs every task on
    /// the main thread (a current-thread runtime): the work is waiting on the
    /// API server and reconciles of microseconds, and a second thread mostly
    /// adds wake-ups, which are most of the CPU of a read made at rest
    /// (docs/bench-runs.md, "One thread or two"). More threads let CPU-heavy
    /// phases (a cold list of 100,000 pods) run beside the watches. The
    /// periodic resync's diff runs on a thread of its own either way.
    #[arg(long, env = "EG_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub worker_threads: u16,

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

    /// The leader renews this long before the Lease expires, and stops writing
    /// once half of it is left without a renewal; that half is the clock skew
    /// tolerated between replicas (whole seconds, shorter than the lease
    /// duration). With the defaults: a renewal every 5 s, tried again until
    /// 10 s after the last one went through (kube-controller-manager's renew
    /// deadline), a replacement after 15 s.
    #[arg(long, env = "EG_LEADER_ELECTION_RENEW_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_grace: Duration,

    /// Without a subcommand, the controller runs.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What the binary does instead of running the controller.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Waits until the Endpoints and EndpointSlices of a Service list ready
    /// addresses written by endpoints-guard (its field manager), then exits 0;
    /// exits 1 when --timeout passes first. The chart's `helm test` Pod runs it
    /// on the metrics Service. Uses the global connection flags (--kubeconfig).
    VerifyEndpoints(VerifyArgs),
    /// Exits 1 while any Service (of --namespace, else any) is opted in
    /// (label endpoints-guard/opt-in), listing them: endpoints-guard is the
    /// only writer of their endpoints, so they opt out before it is
    /// uninstalled. The chart's pre-delete hook runs it in opt-in scope.
    CheckUninstall,
    /// Opts a Service in, with the waits between the steps: its selector
    /// into the annotation and the labels on; once endpoints-guard's slices
    /// list every ready address kube-controller-manager's do, its
    /// spec.selector removed; returns once endpoints-guard alone publishes.
    /// Patches the Service with your credentials.
    OptIn(ServiceArgs),
    /// Opts a Service out, with the waits between the steps: its selector
    /// back; once kube-controller-manager's slices list every ready address
    /// endpoints-guard's do, the opt-in label and annotations removed;
    /// returns once endpoints-guard's slices are gone.
    OptOut(ServiceArgs),
    /// Every Service (of --namespace, else any) that carries an opt-in or
    /// still has endpoints-guard's slices: its state, who publishes its
    /// ready endpoints, the last Warning endpoints-guard reported on it.
    Status,
    /// The emergency path: every opted-in Service (of --namespace, else
    /// any) back to kube-controller-manager as `opt-out` does it, all at
    /// once, without a gap; works with endpoints-guard down.
    HandBack(HandBackArgs),
}

/// A Service to opt in or out.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// The Service, NAMESPACE/NAME.
    pub service: crate::settings::ServiceName,
    #[command(flatten)]
    pub steps: StepArgs,
}

/// `hand-back --all`.
#[derive(Debug, Clone, clap::Args)]
pub struct HandBackArgs {
    /// Every opted-in Service (the only form; it says what is meant).
    #[arg(long, required = true)]
    pub all: bool,
    #[command(flatten)]
    pub steps: StepArgs,
}

/// How the opt-in subcommands go about it.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct StepArgs {
    /// Print the patches and waits, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// How long each wait may take.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// Namespace of the Service.
    #[arg(long)]
    pub namespace: String,
    /// Name of the Service.
    #[arg(long)]
    pub service: String,
    /// Which objects to check: those of the controllers that run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Controller::ALL)]
    pub controllers: Vec<Controller>,
    /// Accept objects written by anyone (audit mode: upstream's controllers
    /// write them).
    #[arg(long)]
    pub any_writer: bool,
    /// Opt-in scope: check a Service of its own instead, an opted-in copy
    /// of --service (its selector in the annotation, no spec.selector)
    /// created here and deleted afterwards: passes once its Endpoints and
    /// EndpointSlices are endpoints-guard's (managed-by endpoints-guard,
    /// written by it) and list the ready pods.
    #[arg(long, conflicts_with = "any_writer")]
    pub opt_in_copy: bool,
    /// How long to wait.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
}

impl Config {
    /// The controllers to run.
    pub fn controller_set(&self) -> Controllers {
        Controllers::of(&self.controllers)
    }

    /// The leader election `--leader-elect` asks for; `None` without it.
    pub fn leader_settings(&self) -> Result<Option<crate::leader::Settings>, String> {
        if !self.leader_elect {
            return Ok(None);
        }
        self.validate()?;
        Ok(Some(crate::leader::Settings::new(
            self.leader_election_namespace.as_deref(),
            &self.leader_election_lease_name,
            self.leader_election_lease_duration,
            self.leader_election_renew_grace,
        )))
    }

    /// The managed-by values written: `--managed-by`, else upstream's in all
    /// scope and ours in opt-in scope.
    pub fn managed_by(&self) -> ManagedBy {
        match (self.scope, self.managed_by) {
            (_, Some(given)) => given,
            (Scope::All, None) => ManagedBy::Upstream,
            (Scope::OptIn, None) => ManagedBy::Own,
        }
    }

    /// Checks what clap cannot check flag by flag: called before anything
    /// touches the network, so a bad combination is one clear line at once.
    pub fn validate(&self) -> Result<(), String> {
        if self.controllers.is_empty() {
            return Err(
                "--controllers names no controller (use endpoints, endpointslices or both)".into(),
            );
        }
        if self.scope == Scope::OptIn {
            if self.managed_by() != ManagedBy::Own {
                return Err("--scope opt-in writes its own managed-by value: upstream's controllers, still running, would take objects labelled with theirs (drop --managed-by upstream)".into());
            }
            if self.controller_set() != Controllers::ALL {
                return Err("--scope opt-in runs both controllers: an opted-in Service's Endpoints that nobody rewrites stay frozen and are mirrored into slices (drop --controllers)".into());
            }
        }
        if let Some(release) = self.kube_rules {
            crate::desired::Rules::with_gates(release, self.feature_gates)?;
        }
        if self.leader_elect {
            let duration = self.leader_election_lease_duration;
            let grace = self.leader_election_renew_grace;
            if duration.subsec_nanos() != 0 || grace.subsec_nanos() != 0 {
                return Err("--leader-election-lease-duration and --leader-election-renew-grace are whole seconds".into());
            }
            if grace.as_secs() < 1 || duration <= grace || duration.as_secs() < 2 {
                return Err(format!(
                    "leader election needs 1s <= renew grace ({grace:?}) < lease duration ({duration:?})"
                ));
            }
        }
        Ok(())
    }
}

/// A number flag's allowed values: its range, what it is (for text that is
/// no number) and what to use instead of a number out of range.
struct Bounded(std::ops::RangeInclusive<f64>, &'static str, &'static str);

impl Bounded {
    fn parse(&self, text: &str) -> Result<f64, String> {
        let Bounded(range, what, usage) = self;
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not {what}"))?;
        if !range.contains(&value) {
            return Err(format!("{value}: {usage}"));
        }
        Ok(value)
    }
}

/// The API client's requests a second: 0 (no limit) to 10,000.
const API_QPS: Bounded = Bounded(
    0.0..=10_000.0,
    "a number of requests per second",
    "requests per second, use 0 (no limit) to 10000",
);
/// A reads-per-second budget: 0 to 1000.
const READS_QPS: Bounded = Bounded(
    0.0..=1000.0,
    "a number of reads per second",
    "reads per second, use 0 (off) to 1000",
);
/// A share of the time: 0.01 to 1 (below a hundredth a full resync at
/// 100,000 pods would outlast the compaction of the revision it lists at).
const SHARE: Bounded = Bounded(
    0.01..=1.0,
    "a share of the time (e.g. 0.05)",
    "use a share from 0.01 to 1 (1: no pause)",
);

/// Parses a Go duration, as kube-controller-manager's flags take them: a
/// sequence of decimal numbers, each with an optional fraction and a unit
/// (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `1m30s`, `500ms`, `1.5h`,
/// `0`; no sign. A bare number of seconds (`300`) is accepted too, as before.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad =
        |why: &str| format!("{text:?} is not a duration ({why}; examples: 30s, 1m30s, 500ms, 1h)");
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| bad("too large"));
    }
    let mut rest = text;
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("a number without a unit"))?;
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("a number without a unit")),
            _ => {
                return Err(bad(&format!(
                    "unknown unit {unit:?}: use ns, us, ms, s, m or h"
                )));
            }
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(bad(&format!("{number:?} is not a number")));
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad("too large"))?
        };
        // Digits beyond nanosecond precision cannot change the result.
        let mut part = whole
            .checked_mul(per_unit)
            .ok_or_else(|| bad("too large"))?;
        let mut scale = per_unit;
        for digit in fraction.bytes() {
            scale /= 10;
            part += u128::from(digit - b'0') * scale;
        }
        nanos = nanos.checked_add(part).ok_or_else(|| bad("too large"))?;
        rest = tail;
    }
    let seconds = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad("too large"))?;
    // The remainder is below 10^9 and fits a u32.
    let subsec = u32::try_from(nanos % 1_000_000_000).map_err(|_| bad("too large"))?;
    Ok(Duration::new(seconds, subsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--managed-by`: upstream's values by default (what conformance specs
    /// check), `own` writes endpoints-guard's; nothing else is accepted.
    #[test]
    fn managed_by_flag_picks_the_written_values() {
        let parse = |args: &[&str]| {
            let argv = std::iter::once("endpoints-guard").chain(args.iter().copied());
            Config::try_parse_from(argv).map(|c| c.managed_by())
        };
        assert_eq!(parse(&[]).ok(), Some(ManagedBy::Upstream));
        assert_eq!(parse(&["--managed-by", "own"]).ok(), Some(ManagedBy::Own));
        assert_eq!(
            parse(&["--managed-by=upstream"]).ok(),
            Some(ManagedBy::Upstream)
        );
        assert!(parse(&["--managed-by", "endpoints-guard"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
    }

    /// What Go's time.ParseDuration accepts (and kube-controller-manager's
    /// duration flags with it), and what it refuses.
    #[test]
    fn go_durations() {
        let ok = |text: &str, want: Duration| assert_eq!(parse_duration(text), Ok(want), "{text}");
        ok("1m30s", Duration::from_secs(90));
        ok("500ms", Duration::from_millis(500));
        ok("1h", Duration::from_secs(3600));
        ok("1h2m3s4ms5us6ns", Duration::new(3723, 4_005_006));
        ok("1.5h", Duration::from_secs(5400));
        ok(".5s", Duration::from_millis(500));
        ok("1.s", Duration::from_secs(1));
        ok("2µs", Duration::from_micros(2));
        ok("0", Duration::ZERO);
        ok("0s", Duration::ZERO);
        ok("1.0000000001s", Duration::from_secs(1));
        for bad in [
            "", "s", "-1s", "+1s", "1d", "1m30", "1..5s", ".s", "1 s", "1s 2s", "1h-2m",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let cfg = Config::try_parse_from([
            "endpoints-guard",
            "--managed-by=upstream",
            "--workers=3",
            "--managed-by=own",
        ])
        .expect("parse");
        assert_eq!(cfg.managed_by(), ManagedBy::Own);
        assert_eq!(cfg.workers, 3);
    }

    #[test]
    fn secure_metrics_flags() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.secure_metrics_addr, None, "plain /metrics by default");
        let cfg = Config::try_parse_from([
            "endpoints-guard",
            "--secure-metrics-addr=0.0.0.0:8443",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-private-key-file=/tls/tls.key",
        ])
        .expect("parse");
        assert_eq!(cfg.secure_metrics_addr.map(|a| a.port()), Some(8443));
        assert!(
            Config::try_parse_from(["endpoints-guard", "--tls-cert-file=/tls/tls.crt"]).is_err(),
            "a certificate without its key"
        );
    }

    #[test]
    fn api_rate_limit_flags() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.kube_api_qps, 0.0, "no client-side limit by default");
        assert_eq!(cfg.kube_api_burst, 30);
        let cfg = Config::try_parse_from([
            "endpoints-guard",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
        ])
        .expect("parse");
        assert_eq!((cfg.kube_api_qps, cfg.kube_api_burst), (50.0, 100));
        assert!(Config::try_parse_from(["endpoints-guard", "--kube-api-qps=-1"]).is_err());
        assert!(Config::try_parse_from(["endpoints-guard", "--kube-api-burst=0"]).is_err());
    }

    #[test]
    fn compressed_unless_disabled() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert!(!cfg.disable_compression);
        let cfg =
            Config::try_parse_from(["endpoints-guard", "--disable-compression"]).expect("parse");
        assert!(cfg.disable_compression);
    }

    #[test]
    fn one_thread_unless_asked() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.worker_threads, 1);
        let cfg = Config::try_parse_from(["endpoints-guard", "--worker-threads=4"]).expect("parse");
        assert_eq!(cfg.worker_threads, 4);
        assert!(Config::try_parse_from(["endpoints-guard", "--worker-threads=0"]).is_err());
    }

    #[test]
    fn verify_endpoints_subcommand() {
        let cfg = Config::try_parse_from([
            "endpoints-guard",
            "verify-endpoints",
            "--namespace=eg",
            "--service=eg-metrics",
            "--timeout=1m30s",
        ])
        .expect("parse");
        let Some(Command::VerifyEndpoints(args)) = cfg.command else {
            panic!("no subcommand: {cfg:?}");
        };
        assert_eq!(args.namespace, "eg");
        assert_eq!(args.service, "eg-metrics");
        assert_eq!(args.timeout, Duration::from_secs(90));
        assert_eq!(args.controllers, Controller::ALL);
        assert!(!args.any_writer);
        assert!(Config::try_parse_from(["endpoints-guard", "verify-endpoints"]).is_err());
    }

    #[test]
    fn defaults_match_upstream_where_it_has_one() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.workers, 5);
        assert_eq!(cfg.mode, Mode::Enforce);
        assert_eq!(cfg.resync_interval, Duration::from_secs(90));
        assert_eq!(cfg.paced_list_share, 0.05);
        assert_eq!(cfg.ghost_scan_qps, 5.0);
        assert_eq!(cfg.controllers, Controller::ALL);
        assert_eq!(cfg.max_endpoints_per_slice, 100);
    }

    #[test]
    fn controllers_are_a_comma_separated_list() {
        let parse = |v: &str| Config::try_parse_from(["endpoints-guard", "--controllers", v]);
        let cfg = parse("endpointslices").expect("parse");
        assert_eq!(cfg.controllers, [Controller::Endpointslices]);
        let cfg = parse("endpointslices,endpoints").expect("parse");
        assert_eq!(
            cfg.controllers,
            [Controller::Endpointslices, Controller::Endpoints]
        );
        assert!(parse("endpoint").is_err(), "unknown name");
        assert!(
            Config::try_parse_from(["endpoints-guard", "--max-endpoints-per-slice", "1001"])
                .is_err()
        );
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
    fn scope_flags() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.scope, Scope::All);
        assert_eq!(cfg.managed_by(), ManagedBy::Upstream);
        assert_eq!(cfg.opt_out_grace, Duration::from_secs(300));
        let cfg = Config::try_parse_from(["endpoints-guard", "--scope=opt-in"]).expect("parse");
        assert_eq!(cfg.scope, Scope::OptIn);
        assert_eq!(cfg.managed_by(), ManagedBy::Own, "opt-in writes its own");
        assert_eq!(cfg.validate(), Ok(()));
        let upstream =
            Config::try_parse_from(["endpoints-guard", "--scope=opt-in", "--managed-by=upstream"])
                .expect("parse");
        assert!(
            upstream.validate().is_err(),
            "upstream's labels in opt-in scope"
        );
        let one = Config::try_parse_from([
            "endpoints-guard",
            "--scope=opt-in",
            "--controllers=endpointslices",
        ])
        .expect("parse");
        assert!(one.validate().is_err(), "opt-in runs both controllers");
        assert!(Config::try_parse_from(["endpoints-guard", "--scope=some"]).is_err());
    }

    #[test]
    fn kube_rules_and_feature_gates() {
        let cfg = Config::try_parse_from(["endpoints-guard"]).expect("defaults parse");
        assert_eq!(cfg.kube_rules, None, "the server's version decides");
        assert_eq!(cfg.feature_gates, FeatureGates::default());
        for (text, release) in [("1.34", KubeRelease::V1_34), ("1.37", KubeRelease::V1_37)] {
            let cfg =
                Config::try_parse_from(["endpoints-guard", "--kube-rules", text]).expect("parse");
            assert_eq!(cfg.kube_rules, Some(release), "{text}");
        }
        for bad in ["1.33", "1.38", "v1.34", "latest"] {
            assert!(
                Config::try_parse_from(["endpoints-guard", "--kube-rules", bad]).is_err(),
                "{bad}"
            );
        }
        let gate_off = |rules: &str| {
            Config::try_parse_from([
                "endpoints-guard",
                "--feature-gates=PreferSameTrafficDistribution=false",
                rules,
            ])
            .expect("parse")
        };
        let cfg = gate_off("--kube-rules=1.34");
        assert_eq!(
            cfg.feature_gates.prefer_same_traffic_distribution,
            Some(false)
        );
        assert_eq!(cfg.validate(), Ok(()));
        let locked = gate_off("--kube-rules=1.35").validate();
        assert!(
            locked.as_ref().is_err_and(|e| e.contains("locked on")),
            "{locked:?}"
        );
        assert!(
            Config::try_parse_from(["endpoints-guard", "--feature-gates=WatchListClient=false"])
                .is_err(),
            "a gate this controller does not know"
        );
    }

    #[test]
    fn a_full_resyncs_list_share_is_a_share_of_the_time() {
        let parse = |v: &str| {
            Config::try_parse_from(["endpoints-guard", "--paced-list-share", v])
                .map(|c| c.paced_list_share)
        };
        assert_eq!(parse("1").ok(), Some(1.0));
        assert_eq!(parse("0.01").ok(), Some(0.01));
        for bad in ["0", "0.001", "1.5", "-0.1", "half", "NaN"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_mode_is_rejected() {
        assert!(Config::try_parse_from(["endpoints-guard", "--mode", "yolo"]).is_err());
    }

    #[test]
    fn leader_settings_are_checked() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["endpoints-guard"];
            argv.extend_from_slice(args);
            Config::try_parse_from(argv).map(|c| c.leader_settings())
        };
        assert!(matches!(parse(&[]), Ok(Ok(None))));
        let ok = parse(&[
            "--leader-elect",
            "--leader-election-namespace",
            "eg",
            "--leader-election-lease-duration",
            "4s",
            "--leader-election-renew-grace",
            "2s",
        ]);
        let Ok(Ok(Some(s))) = ok else {
            panic!("expected settings, got {ok:?}");
        };
        assert_eq!(s.namespace, "eg");
        assert_eq!(s.lease_name, "endpoints-guard");
        assert_eq!(s.poll_interval(), Duration::from_millis(500));
        for bad in [["5s", "5s"], ["1500ms", "1s"], ["10s", "0s"]] {
            let r = parse(&[
                "--leader-elect",
                "--leader-election-lease-duration",
                bad[0],
                "--leader-election-renew-grace",
                bad[1],
            ]);
            assert!(matches!(r, Ok(Err(_))), "{bad:?} accepted");
        }
    }
}
