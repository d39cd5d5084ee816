//! `make bench`: endpoints-guard side by side with kube-controller-manager on
//! the local control plane, each alone in turn on the same objects, for one
//! [`Kind`] or both, and kube-controller-manager a second time with its client
//! limits raised (`--kube-api-qps` / `--kube-api-burst`, [`Controller::UpstreamFast`]):
//! Endpoints (endpoints-guard `--controllers=endpoints`
//! against `endpoints-controller`) or EndpointSlices (`--controllers=endpointslices`
//! against `endpointslice-controller`).
//!
//! One control plane per size; the workload (Nodes, Services, pods) is
//! created once (setup, timed on its own). Then, per kind and controller:
//! **cold sync** (start it with everything present; done when the
//! independent watch of the kind sees every Service's objects list exactly
//! its pods, ready, with their IPs, and for slices their Nodes and zones),
//! **churn** (flip the readiness of `rate` pods a second for `churn`; latency
//! from just before each status write to the watch event showing the pod's
//! endpoint changed readiness), **steady** (nothing changes for `steady`),
//! **ghost** (one pod's DELETE lost in kube-apiserver's watch cache while
//! the controller runs: how long until its address leaves every object; see
//! [`ghost`]), and for endpoints-guard **resync** (a fresh process with a
//! short `--resync-interval`; the first resync's duration from its metrics,
//! its requests from the audit log). Between controllers the flipped pods
//! are made Ready again and every Endpoints object and EndpointSlice is
//! deleted. CPU and peak RSS come from /proc, requests from the audit log
//! (see [`audit`]). For endpoints-guard, churn is also measured inside the
//! process, from its event-to-write histograms ([`inproc`]).
//!
//! endpoints-guard runs at its own defaults except `--workers 5`,
//! `--list-page-size 500` and `--controllers` (the kind measured):
//! `--resync-interval` and `--ghost-scan-qps` only where
//! [`BenchOptions`] sets them, and the report states the values in effect.

mod audit;
pub mod checks;
mod controllers;
pub mod ghost;
pub mod inproc;
mod kind;
mod observe;
pub mod plane;
pub mod report;
mod workload;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

pub use controllers::{Controller, GuardDefaults, guard_binary, start_guard};
pub use ghost::Ghost;
pub use kind::Kind;
pub use report::RunResult;
pub use workload::{BenchSize, BenchWorkload, PodRef, set_ready};

use eg_harness::{ControlPlane, ControlPlaneOptions, InflightLimits};
use eg_workload::procstat;
use observe::{Flip, Observer};
use plane::{PlaneSample, Spend};

/// API Priority and Fairness on, as in production, with seats enough that
/// setting the workload up is not what is measured.
pub const BENCH_INFLIGHT: InflightLimits = InflightLimits {
    readonly: 1000,
    mutating: 500,
};

/// The control plane every bench tool starts: APF on, [`BENCH_INFLIGHT`].
pub fn plane_options() -> ControlPlaneOptions {
    let mut options = ControlPlaneOptions {
        priority_and_fairness: Some(BENCH_INFLIGHT),
        ..ControlPlaneOptions::default()
    };
    // Later flags win over the harness's own.
    options
        .apiserver_args
        .extend(plane::APISERVER_ARGS.iter().map(|a| a.to_string()));
    options
        .etcd_args
        .extend(plane::ETCD_ARGS.iter().map(|a| a.to_string()));
    options
}

/// The command line of a tool whose every flag takes a value: (flag, value)
/// pairs in order; an error names a flag given last without its value.
pub fn flag_values() -> Result<Vec<(String, String)>> {
    let mut args = std::env::args().skip(1);
    let mut pairs = Vec::new();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        pairs.push((flag, value));
    }
    Ok(pairs)
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub size: BenchSize,
    /// Pods flipped per second during churn.
    pub churn_rate: u32,
    pub churn: Duration,
    pub steady: Duration,
    /// How long after making kube-apiserver and etcd collect their garbage
    /// ([`plane::collect_garbage`]) the windows at rest (steady and the
    /// baseline) start: half of Go's forced period keeps every forced
    /// collection away from their ends.
    pub collection_offset: Duration,
    /// How long the control plane's window with no controller runs at
    /// least: long enough to hold one of kube-apiserver's consistency checks
    /// of every resource ([`checks`]). Zero: as long as steady, and the
    /// checks' cost not measured.
    pub check_window: Duration,
    /// endpoints-guard's `--resync-interval` in the resync phase (a fresh
    /// process whose first resync is measured).
    pub resync_phase_interval: Duration,
    /// endpoints-guard's `--resync-interval` in its measured run; `None`:
    /// the binary's default.
    pub guard_resync_interval: Option<Duration>,
    /// endpoints-guard's `--full-resync-interval` in its measured run;
    /// `None`: the binary's default.
    pub guard_full_resync_interval: Option<Duration>,
    /// endpoints-guard's `--ghost-scan-qps` in every phase (the reads it
    /// makes at rest, reported on their own in steady); `None`: the binary's
    /// default.
    pub ghost_scan_qps: Option<f64>,
    /// The controllers whose run has a ghost phase; the others report it as
    /// not measured.
    pub ghost_controllers: Vec<Controller>,
    /// The kinds whose runs have a ghost phase.
    pub ghost_kinds: Vec<Kind>,
    /// How long the ghost phase waits for the ghost's address to go.
    pub ghost_timeout: Duration,
    /// kube-apiserver's `--etcd-compaction-interval`; `None`: its default
    /// (5 minutes).
    pub etcd_compaction_interval: Option<Duration>,
    /// Where report.json, report.md and the CDF plot go.
    pub out_dir: PathBuf,
    /// The endpoints-guard binary.
    pub guard_binary: PathBuf,
    pub controllers: Vec<Controller>,
    /// The kinds measured, in turn, on the same control plane and workload.
    pub kinds: Vec<Kind>,
    /// Extra kube-controller-manager flags (e.g. `--kube-api-qps=100`), for
    /// both of its runs.
    pub upstream_args: Vec<String>,
    /// Extra kube-apiserver flags (e.g.
    /// `--feature-gates=DetectCacheInconsistency=false`).
    pub apiserver_args: Vec<String>,
    /// `--kube-api-qps` and `--kube-api-burst` of [`Controller::UpstreamFast`]
    /// (its default client limits are QPS 20, burst 30).
    pub fast_upstream_qps: u32,
    /// Requests in flight while creating the workload.
    pub setup_parallelism: usize,
    /// How long cold sync may take before the run fails.
    pub cold_sync_timeout: Duration,
    /// Rounds of every controller on one control plane and workload (the
    /// spread between runs without paying the setup again). With more than
    /// one, round `i`'s reports go to `out_dir/run-<i>/`.
    pub repeat: usize,
    /// endpoints-guard replicas in its measured run (default 2, the chart's
    /// `replicaCount`). With more than one, every replica elects a leader on a
    /// Lease; the measured process starts first and leads, the followers
    /// start after churn, and steady holds them all: its requests (one
    /// ServiceAccount, as in the chart) and the control plane's spend are
    /// the deployment's, the followers' own CPU is reported beside.
    pub guard_replicas: u32,
}

impl BenchOptions {
    pub fn new(size: BenchSize, guard_binary: PathBuf, out_dir: PathBuf) -> Self {
        Self {
            size,
            churn_rate: 10,
            churn: Duration::from_secs(60),
            // Four default resync intervals and three of Go's forced
            // collections: a window of a whole number of intervals holds the
            // same number of resyncs wherever it starts, and, started half a
            // period after a collection, as many collections.
            steady: Duration::from_secs(360),
            collection_offset: plane::COLLECTION_PERIOD / 2,
            // The longest wait for a resource's check, and half a minute for
            // the checks themselves.
            check_window: checks::LONGEST_GAP + Duration::from_secs(30),
            resync_phase_interval: Duration::from_secs(10),
            guard_resync_interval: None,
            guard_full_resync_interval: None,
            ghost_scan_qps: None,
            // kube-controller-manager with raised client limits has the same
            // informers as at its defaults, so the same answer.
            ghost_controllers: vec![Controller::Guard, Controller::Upstream],
            ghost_kinds: Kind::ALL.to_vec(),
            // The 10 minutes within which a ghost's address must go (at
            // endpoints-guard's defaults: the check's 7.5 minutes plus a
            // 2-minute resync), and a minute.
            ghost_timeout: Duration::from_secs(660),
            etcd_compaction_interval: None,
            out_dir,
            guard_binary,
            controllers: Controller::ALL.to_vec(),
            kinds: vec![Kind::Endpoints],
            upstream_args: Vec::new(),
            apiserver_args: Vec::new(),
            fast_upstream_qps: 1000,
            setup_parallelism: 32,
            cold_sync_timeout: Duration::from_secs(1800),
            repeat: 1,
            guard_replicas: 2,
        }
    }

    /// Whether `controller`'s run of `kind` has a ghost phase.
    pub fn measures_ghost(&self, controller: Controller, kind: Kind) -> bool {
        self.ghost_controllers.contains(&controller) && self.ghost_kinds.contains(&kind)
    }

    /// Whether any run has a ghost phase (the control plane then runs with
    /// etcd-fault-proxy between kube-apiserver and etcd).
    fn any_ghost(&self) -> bool {
        self.controllers
            .iter()
            .any(|&c| self.kinds.iter().any(|&k| self.measures_ghost(c, k)))
    }
}

/// One phase of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Phase {
    pub wall_s: f64,
    pub cpu_s: f64,
    /// `cpu_s` is whole clock ticks rather than the threads' nanoseconds
    /// (a thread exited during the phase; see `procstat`).
    #[serde(default)]
    pub cpu_from_ticks: bool,
    /// Watch events (ADDED, MODIFIED, DELETED) of the measured kind in the phase.
    pub writes: u64,
    pub requests: BTreeMap<String, u64>,
    pub requests_by_resource: BTreeMap<String, u64>,
    /// What kube-apiserver and etcd spent in the phase (all clients).
    #[serde(default)]
    pub control_plane: Option<Spend>,
}

/// The cost of one full resync diff (endpoints-guard only).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Resync {
    /// `endpoints_guard_resync_duration_seconds` of the first resync.
    pub duration_s: f64,
    pub cpu_s: f64,
    /// As [`Phase::cpu_from_ticks`].
    #[serde(default)]
    pub cpu_from_ticks: bool,
    pub requests: BTreeMap<String, u64>,
    pub requests_by_resource: BTreeMap<String, u64>,
    /// VmHWM of the process that ran it (it also did a cold start).
    pub peak_rss_mb: f64,
    /// Pod flips through more resyncs of the same process.
    #[serde(default)]
    pub churn: Option<ResyncChurn>,
    /// What the control plane spent from the process's readiness to the
    /// first resync's end (the resync, and rest before it).
    #[serde(default)]
    pub control_plane: Option<Spend>,
}

/// Resyncs the resync phase runs under churn, after the first.
pub const RESYNCS_UNDER_CHURN: usize = 9;

/// Pod flips while a resync ran against those while none did, in the same
/// process (see `Bench::churn_through_resyncs`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResyncChurn {
    pub resyncs: usize,
    pub during_flips: usize,
    pub during_p99_ms: Option<f64>,
    pub outside_flips: usize,
    pub outside_p99_ms: Option<f64>,
    /// Flips never seen, or whose write failed.
    pub missed: u64,
    /// The bench's own status writes of the flips (sent → answer read),
    /// p99 during resyncs and outside them: kube-apiserver's answer time
    /// while the resync lists, beside what endpoints-guard adds.
    #[serde(default)]
    pub during_flip_write_p99_ms: Option<f64>,
    #[serde(default)]
    pub outside_flip_write_p99_ms: Option<f64>,
    /// endpoints-guard's event → write histograms over the resync windows
    /// alone (scraped at their edges).
    #[serde(default)]
    pub during_in_process: Option<inproc::InProcess>,
}

/// What one run of pod flips sent.
#[derive(Debug, Default)]
struct Flipped {
    sent: u64,
    /// Status writes that failed.
    failed: u64,
    /// Each answered status write: when it was sent, and its round trip (ms).
    writes: Vec<(Instant, f64)>,
}

/// A resync's window in time, with endpoints-guard's metrics scraped at
/// or before its start and at its end.
struct ResyncWindow {
    from: Instant,
    to: Instant,
    metrics_before: String,
    metrics_after: String,
}

impl ResyncWindow {
    fn holds(&self, at: Instant) -> bool {
        (self.from..=self.to).contains(&at)
    }
}

/// Of samples taken in time order, the last taken at or before `at`, else
/// the first.
fn at_or_before<'a, T: PartialOrd + 'a, V: 'a>(
    samples: impl DoubleEndedIterator<Item = &'a (T, V)> + Clone,
    at: &T,
) -> Option<&'a V> {
    samples
        .clone()
        .rev()
        .find(|(t, _)| t <= at)
        .or_else(|| samples.into_iter().next())
        .map(|(_, v)| v)
}

/// The time windows of the next `RESYNCS_UNDER_CHURN` resyncs of the fresh
/// endpoints-guard `r`, from its metrics (see `Bench::churn_through_resyncs`).
async fn resync_windows(r: &controllers::Running, interval: Duration) -> Result<Vec<ResyncWindow>> {
    const SCRAPE: Duration = Duration::from_millis(100);
    let read = |text: &str| {
        (
            procstat::metric(text, "endpoints_guard_resync_duration_seconds_count").unwrap_or(0.0),
            procstat::metric(text, "endpoints_guard_resync_duration_seconds_sum").unwrap_or(0.0),
        )
    };
    let first = r.metrics().await?;
    let (mut count, mut sum) = read(&first);
    // The scrapes since the last resync ended, oldest first, ten minutes of
    // them at most (a paced full resync lasts minutes at 100,000 pods), each
    // cut to the in-process histograms: one of them opens the next window
    // (a resync that lasts longer is measured from the oldest kept).
    const KEPT: usize = 6000;
    let histograms = |text: &str| -> String {
        text.lines()
            .filter(|l| l.starts_with(inproc::SENT) || l.starts_with(inproc::ANSWERED))
            .flat_map(|l| [l, "\n"])
            .collect()
    };
    let mut recent: VecDeque<(Instant, String)> =
        VecDeque::from([(Instant::now(), histograms(&first))]);
    // A paced full resync lasts about 20 times its pages' time: 2 minutes
    // at 100,000 pods.
    let deadline =
        Instant::now() + (interval + Duration::from_secs(300)) * (RESYNCS_UNDER_CHURN as u32 + 1);
    let mut windows = Vec::new();
    while windows.len() < RESYNCS_UNDER_CHURN {
        if Instant::now() > deadline {
            anyhow::bail!("{RESYNCS_UNDER_CHURN} resyncs did not finish in time");
        }
        tokio::time::sleep(SCRAPE).await;
        let text = r.metrics().await?;
        let now = Instant::now();
        let (now_count, now_sum) = read(&text);
        if now_count > count {
            let took = Duration::from_secs_f64((now_sum - sum).max(0.0)) + SCRAPE;
            let from = now.checked_sub(took).unwrap_or(now);
            let metrics_before = at_or_before(recent.iter(), &from)
                .cloned()
                .unwrap_or_default();
            windows.push(ResyncWindow {
                from,
                to: now,
                metrics_before,
                metrics_after: histograms(&text),
            });
            (count, sum) = (now_count, now_sum);
            recent.clear();
        }
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back((now, histograms(&text)));
    }
    Ok(windows)
}

/// Fields drop in order: the observer's watch stops before the control plane.
struct Bench {
    /// The watch of the kind being measured.
    observer: Option<Arc<Observer>>,
    kind: Kind,
    cp: ControlPlane,
    client: Client,
    opts: BenchOptions,
    workload: BenchWorkload,
    audit_log: PathBuf,
    kubeconfigs: BTreeMap<&'static str, PathBuf>,
    /// endpoints-guard's resync interval and ghost-scan QPS in effect (the
    /// options', else the binary's defaults); `None` when it is not measured.
    guard: Option<GuardDefaults>,
    setup_s: f64,
    /// What the control plane spends at rest with no controller running,
    /// in the window after the workload's setup.
    setup_baseline: Spend,
    /// The same in the current round's window, once taken.
    round_baseline: Option<Spend>,
    /// What kube-apiserver's consistency checks cost in the same window;
    /// `None` when not measured (`check_window` zero).
    consistency_check: Option<checks::CheckCost>,
    _dir: tempfile::TempDir,
}

fn log(text: &str) {
    eprintln!("eg-bench: {text}");
}

/// Runs the bench and, per kind, writes its report (`report.json`,
/// `report.md` for Endpoints; `report-endpointslices.json`, `.md` for
/// slices; merged with runs of other sizes already there) and latency CDF
/// plot into `out_dir`. Returns the runs of every kind.
pub async fn run(opts: BenchOptions) -> Result<Vec<RunResult>> {
    let mut bench = Bench::setup(opts).await?;
    let mut all_runs = Vec::new();
    let mut measured = false;
    let repeat = bench.opts.repeat.max(1);
    for kind in bench.opts.kinds.clone() {
        for round in 1..=repeat {
            let out_dir = if repeat > 1 {
                log(&format!("round {round} of {repeat}"));
                bench.opts.out_dir.join(format!("run-{round}"))
            } else {
                bench.opts.out_dir.clone()
            };
            let mut runs: Vec<RunResult> = Vec::new();
            let mut latencies = Vec::new();
            bench.round_baseline = None;
            for &controller in &bench.opts.controllers.clone() {
                if measured {
                    bench.reset().await?;
                }
                if bench.observer.is_none() || bench.kind != kind {
                    bench.watch(kind).await?;
                }
                measured = true;
                let (run, lat) = bench.measure(controller).await?;
                runs.push(run);
                latencies.push((controller, lat));
                if bench.round_baseline.is_none() {
                    // Beside the round's controllers rather than minutes
                    // after the workload's creation, which leaves the
                    // control plane busier for a while.
                    let window = bench.round_window().await?;
                    for run in &mut runs {
                        run.measure_at_rest(window);
                    }
                    bench.round_baseline = Some(window);
                }
                // After every run, so a long run stopped part way keeps what it measured.
                report::write_all(&out_dir, kind, &bench.opts.size.name, &runs, &latencies)?;
            }
            all_runs.extend(runs);
        }
    }
    Ok(all_runs)
}

impl Bench {
    /// Replaces the observer with a watch of `kind`'s objects (none left).
    async fn watch(&mut self, kind: Kind) -> Result<()> {
        self.observer = None;
        self.kind = kind;
        let observer = Observer::start(self.client.clone(), &self.workload, kind).await?;
        observer
            .wait_for(
                &format!("no {} left", kind.objects()),
                Duration::from_secs(120),
                |o| o.existing() == 0,
            )
            .await?;
        self.observer = Some(Arc::new(observer));
        Ok(())
    }

    fn obs(&self) -> Result<&Arc<Observer>> {
        self.observer
            .as_ref()
            .context("no observer: it starts before any measurement")
    }

    /// One controller's phases on the current kind, logged.
    async fn measure(&mut self, controller: Controller) -> Result<(RunResult, Vec<f64>)> {
        let (run, lat) = self.measure_phases(controller).await?;
        log(&format!(
            "{} {}: cold sync {:.2} s, churn p50/p90/p99 {:.1}/{:.1}/{:.1} ms, cpu {:.2} s, peak RSS {:.1} MiB, writes {} / changes {}",
            self.kind.objects(),
            controller.name(),
            run.cold_sync_s,
            run.churn_p50_ms,
            run.churn_p90_ms,
            run.churn_p99_ms,
            run.cpu_s,
            run.peak_rss_mb,
            run.writes,
            run.changes
        ));
        log(&format!(
            "{} {}: API requests at rest {}/s; ghost {}",
            self.kind.objects(),
            controller.name(),
            run.api_requests_per_s_at_rest
                .map_or("n/a".to_string(), |r| format!("{r:.2}")),
            report::ghost_text(&run)
        ));
        if let Some(p) = &run.in_process {
            log(&format!(
                "{} {}: in the process, event → write sent p50/p99/p99.9 {:.3}/{:.3}/{:.3} ms (slowest ≤ {:.3} ms), → answered p50/p99/p99.9 {:.3}/{:.3}/{:.3} ms, {} writes",
                self.kind.objects(),
                controller.name(),
                p.sent_p50_ms,
                p.sent_p99_ms,
                p.sent_p999_ms,
                p.sent_max_ms,
                p.answered_p50_ms,
                p.answered_p99_ms,
                p.answered_p999_ms,
                p.samples
            ));
        }
        Ok((run, lat))
    }

    async fn setup(opts: BenchOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("eg-bench-")
            .tempdir()
            .context("creating the bench's temporary folder")?;
        let users: Vec<String> = Controller::ALL.iter().map(|c| c.user()).collect();
        let policy = dir.path().join("audit-policy.yaml");
        std::fs::write(&policy, audit::policy(&users)).context("writing the audit policy")?;
        let audit_log = dir.path().join("audit.log");
        let mut cp_opts = plane_options();
        if opts.any_ghost() {
            cp_opts = cp_opts.with_etcd_fault_proxy();
        }
        if let Some(interval) = opts.etcd_compaction_interval {
            cp_opts = cp_opts.etcd_compaction_interval(interval);
        }
        for arg in checks::APISERVER_ARGS
            .iter()
            .map(|a| a.to_string())
            .chain(opts.apiserver_args.iter().cloned())
        {
            cp_opts = cp_opts.apiserver_arg(arg);
        }
        let guard = if opts.controllers.contains(&Controller::Guard) {
            let defaults = GuardDefaults::of_binary(&opts.guard_binary).await?;
            let in_effect = GuardDefaults {
                resync_interval: opts
                    .guard_resync_interval
                    .unwrap_or(defaults.resync_interval),
                ghost_scan_qps: opts.ghost_scan_qps.unwrap_or(defaults.ghost_scan_qps),
                full_resync_interval: opts
                    .guard_full_resync_interval
                    .or(defaults.full_resync_interval),
                ghost_scan_period: defaults.ghost_scan_period,
                lease_renewal_every: defaults.lease_renewal_every,
            };
            log(&format!(
                "endpoints-guard: --resync-interval {:?}, --ghost-scan-qps {} (its defaults: {:?}, {})",
                in_effect.resync_interval,
                in_effect.ghost_scan_qps,
                defaults.resync_interval,
                defaults.ghost_scan_qps
            ));
            Some(in_effect)
        } else {
            None
        };
        cp_opts
            .apiserver_args
            .extend(audit::apiserver_args(&policy, &audit_log));
        log(&format!(
            "size {}: {} Services × {} pods in {} namespaces; starting the control plane",
            opts.size.name,
            opts.size.services,
            opts.size.pods(),
            opts.size.namespaces()
        ));
        let cp = ControlPlane::start(cp_opts).await?;
        let client = cp.client();
        let mut kubeconfigs = BTreeMap::new();
        for c in Controller::ALL {
            kubeconfigs.insert(c.name(), controllers::credentials(&cp, c).await?);
        }
        let workload = BenchWorkload::generate(&opts.size);
        let setup = workload.create(&client, opts.setup_parallelism).await?;
        log(&format!("workload created in {:.1} s", setup.as_secs_f64()));
        compact_setup(&cp, &client).await?;
        let window = opts.steady.max(opts.check_window);
        log(&format!(
            "control plane at rest with no controller, after the workload's setup: {} s",
            window.as_secs()
        ));
        let (setup_baseline, consistency_check) = window_at_rest(
            &cp,
            &client,
            window,
            opts.collection_offset,
            Checks::Trace(!opts.check_window.is_zero()),
        )
        .await?;
        Ok(Self {
            cp,
            client,
            opts,
            workload,
            observer: None,
            kind: Kind::Endpoints,
            audit_log,
            kubeconfigs,
            guard,
            setup_s: setup.as_secs_f64(),
            setup_baseline,
            round_baseline: None,
            consistency_check,
            _dir: dir,
        })
    }

    /// The current round's window with no controller, as long as steady:
    /// taken after its first controller stopped, its objects still stored
    /// as in steady, and its checks left out at the cost measured after
    /// setup.
    async fn round_window(&self) -> Result<Spend> {
        log(&format!(
            "control plane at rest with no controller, this round's window: {} s",
            self.opts.steady.as_secs()
        ));
        let (spend, _) = window_at_rest(
            &self.cp,
            &self.client,
            self.opts.steady,
            self.opts.collection_offset,
            Checks::Known(self.consistency_check.as_ref()),
        )
        .await?;
        Ok(spend)
    }

    /// Between controllers: every pod Ready again, no Endpoints or
    /// EndpointSlices left. Churn flips the pods in order, so only the first
    /// `rate × churn` of them can be not ready (at XL, 600 of 100,000).
    async fn reset(&self) -> Result<()> {
        let client = &self.client;
        let flipped = self.workload.pods.len().min(self.churn_total() as usize);
        let results: Vec<Result<()>> = stream::iter(&self.workload.pods[..flipped])
            .map(|pod| set_ready(client, pod, true))
            .buffer_unordered(self.opts.setup_parallelism)
            .collect()
            .await;
        results.into_iter().collect::<Result<()>>()?;
        self.workload.delete_outputs(client).await?;
        self.obs()?
            .wait_for(
                &format!("{} deleted", self.kind.objects()),
                Duration::from_secs(120),
                |o| o.existing() == 0,
            )
            .await?;
        Ok(())
    }

    fn kubeconfig(&self, c: Controller) -> Result<&PathBuf> {
        self.kubeconfigs
            .get(c.name())
            .context("no kubeconfig for the controller")
    }

    /// Starts endpoints-guard's followers ([`BenchOptions::guard_replicas`]
    /// less the measured one, which leads), each ready (caches synced).
    async fn start_followers(&self, log_name: &str) -> Result<Vec<controllers::Running>> {
        let mut followers = Vec::new();
        for i in 1..self.opts.guard_replicas {
            let mut follower = self.start(
                Controller::Guard,
                None,
                true,
                &format!("{log_name}-follower-{i}"),
            )?;
            follower.wait_ready(self.opts.cold_sync_timeout).await?;
            followers.push(follower);
        }
        Ok(followers)
    }

    /// Starts controller `c` on the current kind; endpoints-guard with
    /// `--resync-interval` `resync` if given, else the options', else its
    /// default. With `elect`, endpoints-guard elects a leader on a Lease, as
    /// each of several replicas does.
    fn start(
        &self,
        c: Controller,
        resync: Option<Duration>,
        elect: bool,
        log_name: &str,
    ) -> Result<controllers::Running> {
        match c {
            Controller::Guard => {
                // Like for like: upstream runs that kind's controller alone.
                let mut args = vec![format!("--controllers={}", self.kind.name())];
                if elect {
                    args.push("--leader-elect".to_string());
                    args.push(format!("--leader-election-namespace={LEASE_NAMESPACE}"));
                }
                if let Some(interval) = resync.or(self.opts.guard_resync_interval) {
                    args.push(format!("--resync-interval={}ms", interval.as_millis()));
                }
                // The resync phase measures full resyncs: every one in full.
                let counts = self.guard.is_some_and(|g| g.full_resync_interval.is_some());
                match (resync, counts) {
                    (Some(interval), true) => {
                        args.push(format!("--full-resync-interval={}ms", interval.as_millis()));
                    }
                    (None, _) => {
                        if let Some(full) = self.opts.guard_full_resync_interval {
                            args.push(format!("--full-resync-interval={}ms", full.as_millis()));
                        }
                    }
                    _ => {}
                }
                if let Some(qps) = self.opts.ghost_scan_qps {
                    args.push(format!("--ghost-scan-qps={qps}"));
                }
                controllers::start_guard(
                    &self.cp,
                    &self.opts.guard_binary,
                    self.kubeconfig(c)?,
                    &args,
                    log_name,
                )
            }
            Controller::Upstream => controllers::start_upstream(
                &self.cp,
                self.kubeconfig(c)?,
                self.kind,
                &self.opts.upstream_args,
                log_name,
            ),
            Controller::UpstreamFast => {
                // Last, so they win over the same flags in `upstream_args`.
                let mut args = self.opts.upstream_args.clone();
                args.push(format!("--kube-api-qps={}", self.opts.fast_upstream_qps));
                args.push(format!("--kube-api-burst={}", self.opts.fast_upstream_qps));
                controllers::start_upstream(
                    &self.cp,
                    self.kubeconfig(c)?,
                    self.kind,
                    &args,
                    log_name,
                )
            }
        }
    }

    /// Flips in one churn phase.
    fn churn_total(&self) -> u64 {
        (u64::from(self.opts.churn_rate.max(1)) * self.opts.churn.as_secs()).max(1)
    }

    async fn measure_phases(&mut self, c: Controller) -> Result<(RunResult, Vec<f64>)> {
        let services = self.workload.services.len();
        let obs = self.obs()?.clone();
        let kind = self.kind;
        log(&format!("{} {}: cold sync", kind.objects(), c.name()));
        let t_cold = SystemTime::now();
        let started = Instant::now();
        let ev0 = obs.events();
        let log_name = format!("{}-{}", c.name(), kind.name());
        let replicated = c == Controller::Guard && self.opts.guard_replicas > 1;
        let mut running = self.start(c, None, replicated, &log_name)?;
        let done = obs
            .wait_for("cold sync", self.opts.cold_sync_timeout, |o| {
                o.correct() == services
            })
            .await?;
        let cold_sync_s = done.duration_since(started).as_secs_f64();
        // Stray writes right after the last correct object belong to cold sync.
        tokio::time::sleep(Duration::from_secs(2)).await;
        running.process.ensure_running()?;
        let mut phases = Vec::new();
        let mut mark = Mark {
            at: t_cold,
            instant: started,
            cpu: procstat::CpuSample::default(),
            events: ev0,
            plane: None,
        };
        mark = self.close(&mut phases, "cold", mark, &running).await?;

        log(&format!("{} {}: churn", kind.objects(), c.name()));
        // endpoints-guard's histograms before and after churn: their
        // difference is churn's writes alone.
        let scrape_before = match c {
            Controller::Guard => Some(running.metrics().await?),
            _ => None,
        };
        let Flipped {
            sent: flips,
            failed,
            ..
        } = self.churn().await?;
        let _ = obs
            .wait_for("churn drained", Duration::from_secs(30), |o| {
                o.pending() == 0
            })
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (flips_seen, missed) = obs.take_flips();
        let mut latencies: Vec<f64> = flips_seen.iter().map(|f| f.ms).collect();
        let in_process = match scrape_before {
            Some(before) => {
                let after = running.metrics().await?;
                let figures = inproc::InProcess::between(kind, &before, &after);
                if figures.is_none() {
                    log(
                        "endpoints-guard exports no event-to-write histograms: no in-process figures",
                    );
                }
                figures
            }
            None => None,
        };
        mark = self.close(&mut phases, "churn", mark, &running).await?;

        let mut followers = Vec::new();
        if replicated {
            log(&format!("{} {}: followers", kind.objects(), c.name()));
            followers = self.start_followers(&log_name).await?;
            mark = self
                .close(&mut phases, report::FOLLOWERS_PHASE, mark, &running)
                .await?;
        }
        plane::collect_garbage(&self.cp, &self.client).await?;
        tokio::time::sleep(self.opts.collection_offset).await;
        mark = self
            .close(&mut phases, report::SETTLE_PHASE, mark, &running)
            .await?;
        let followers_before = followers
            .iter()
            .map(controllers::Running::cpu)
            .collect::<Result<Vec<_>>>()?;
        log(&format!("{} {}: steady", kind.objects(), c.name()));
        let steady_started = Instant::now();
        tokio::time::sleep(self.opts.steady).await;
        running.process.ensure_running()?;
        let followers_cpu_s_per_min_at_rest =
            followers_cpu_per_min(&followers, &followers_before, steady_started.elapsed())?;
        self.close(&mut phases, "steady", mark, &running).await?;
        for follower in &mut followers {
            follower.process.stop().await?;
        }
        // Before the ghost phase, so the figure stays that of cold sync,
        // churn and steady.
        let peak_rss_main_mb = running.peak_rss_mb()?;
        let mut ghost = None;
        if self.opts.measures_ghost(c, kind) {
            log(&format!("{} {}: ghost", kind.objects(), c.name()));
            ghost = Some(self.ghost(c, &mut running).await?);
        }
        running.process.stop().await?;

        let mut resync = None;
        let mut resync_window = None;
        if c == Controller::Guard {
            log(&format!("{} endpoints-guard: resync", kind.objects()));
            let (r, window) = self.resync().await?;
            resync = Some(r);
            resync_window = Some(window);
        }
        // Blocking audit mode writes before answering; a moment for the last lines.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let requests = audit::read(&self.audit_log)?;
        let user = c.user();
        let checks_done =
            checks::read_checks(&self.cp.apiserver_log(), checks::epoch_s(SystemTime::now()))?;
        let without_checks = |spend: Option<Spend>, from: SystemTime, to: SystemTime| match (
            spend,
            &self.consistency_check,
        ) {
            (Some(spend), Some(cost)) => Some(spend.with_checks(
                &checks::between(&checks_done, checks::epoch_s(from), checks::epoch_s(to)),
                cost,
            )),
            (spend, _) => spend,
        };
        let phases: BTreeMap<String, Phase> = phases
            .into_iter()
            .map(|(name, mut phase, from, to)| {
                phase.requests = audit::by_verb(&requests, &user, from, to);
                phase.requests_by_resource =
                    audit::by_verb_and_resource(&requests, &user, from, to);
                phase.control_plane = without_checks(phase.control_plane, from, to);
                (name, phase)
            })
            .collect();
        if let (Some(r), Some((from, to))) = (resync.as_mut(), resync_window) {
            r.requests = audit::by_verb(&requests, &user, from, to);
            r.requests_by_resource = audit::by_verb_and_resource(&requests, &user, from, to);
            r.control_plane = without_checks(r.control_plane, from, to);
        }
        let ghost = ghost.map(|(mut g, (from, to))| {
            g.requests_by_resource = audit::by_verb_and_resource(&requests, &user, from, to);
            g
        });
        latencies.sort_by(f64::total_cmp);
        let run = report::assemble(report::Parts {
            size: &self.opts,
            kind,
            controller: c,
            setup_s: self.setup_s,
            cold_sync_s,
            latencies: &latencies,
            flips,
            failed,
            missed,
            peak_rss_main_mb,
            phases,
            resync,
            ghost_scan_qps: self
                .guard
                .filter(|_| c == Controller::Guard)
                .map(|g| g.ghost_scan_qps),
            resync_interval: self
                .guard
                .filter(|_| c == Controller::Guard)
                .map(|g| g.resync_interval),
            full_resync_interval: self
                .guard
                .filter(|_| c == Controller::Guard)
                .and_then(|g| g.full_resync_interval),
            ghost,
            in_process,
            baseline: self.round_baseline.unwrap_or(self.setup_baseline),
            setup_baseline: self.setup_baseline,
            consistency_check: self.consistency_check.clone(),
            guard_replicas: (c == Controller::Guard).then_some(self.opts.guard_replicas),
            followers_cpu_s_per_min_at_rest,
            client_qps: match c {
                Controller::Guard => None,
                Controller::Upstream => Some(upstream_qps(&self.opts.upstream_args)),
                Controller::UpstreamFast => Some(self.opts.fast_upstream_qps),
            },
        });
        Ok((run, latencies))
    }

    /// Ends the phase begun at `mark`, storing it with its time window.
    async fn close(
        &self,
        phases: &mut Vec<PhaseWindow>,
        name: &str,
        mark: Mark,
        running: &controllers::Running,
    ) -> Result<Mark> {
        let now = Mark {
            at: SystemTime::now(),
            instant: Instant::now(),
            cpu: running.cpu()?,
            events: self.obs()?.events(),
            plane: Some(PlaneSample::read(&self.cp, &self.client).await?),
        };
        let (cpu_s, precise) = now.cpu.since(&mark.cpu);
        let wall_s = now.instant.duration_since(mark.instant).as_secs_f64();
        let control_plane = match (&now.plane, &mark.plane) {
            (Some(end), Some(start)) => Some(end.since(start, wall_s)),
            _ => None,
        };
        let phase = Phase {
            wall_s,
            cpu_s,
            cpu_from_ticks: !precise,
            writes: now.events - mark.events,
            control_plane,
            ..Phase::default()
        };
        phases.push((name.to_string(), phase, mark.at, now.at));
        Ok(now)
    }

    /// Flips `rate` pods a second for the churn duration.
    async fn churn(&self) -> Result<Flipped> {
        self.flip_pods(
            self.churn_total(),
            false,
            &AtomicBool::new(false),
            f64::from(self.opts.churn_rate.max(1)),
        )
        .await
    }

    /// Flips `rate` pods a second, `total` at most, fewer if `stop` turns
    /// true first: pod `k` in turn, to not ready (`to_ready` false: churn)
    /// or back to Ready (`to_ready` true, the pods churn left not ready);
    /// past the last pod the other way.
    async fn flip_pods(
        &self,
        total: u64,
        to_ready: bool,
        stop: &AtomicBool,
        rate: f64,
    ) -> Result<Flipped> {
        let pods = &self.workload.pods;
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
        let limit = Arc::new(Semaphore::new(32));
        let mut tasks = JoinSet::new();
        let mut sent = 0;
        for k in 0..total {
            ticker.tick().await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
            sent += 1;
            let i = (k as usize) % pods.len();
            let want_ready = ((k as usize / pods.len()) % 2 == 1) != to_ready;
            let pod = pods[i].clone();
            let (client, obs, limit) = (self.client.clone(), self.obs()?.clone(), limit.clone());
            let at = Instant::now();
            obs.expect_flip(pod.key(), want_ready, at);
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let result = set_ready(&client, &pod, want_ready).await;
                if result.is_err() {
                    obs.cancel_flip(&pod.key());
                }
                result
                    .is_ok()
                    .then(|| (at, at.elapsed().as_secs_f64() * 1000.0))
            });
        }
        let mut flipped = Flipped {
            sent,
            ..Flipped::default()
        };
        while let Some(res) = tasks.join_next().await {
            match res.ok().flatten() {
                Some(write) => flipped.writes.push(write),
                None => flipped.failed += 1,
            }
        }
        Ok(flipped)
    }

    /// Pods flipped while the fresh endpoints-guard `r` (its first resync
    /// already measured) runs [`RESYNCS_UNDER_CHURN`] more resyncs, each
    /// flip's latency filed by whether it was sent while a resync ran. A
    /// resync's window ends at the metrics scrape that counted it (scraped
    /// every 100 ms) and starts its duration earlier, less one scrape
    /// period: a flip sent just after a resync may count as during it.
    ///
    /// The flips are spread over the resyncs expected (each about as long
    /// as the first, `first_s`, then the interval): a paced full resync
    /// lasts minutes at 100,000 pods, and flips at the churn rate would all
    /// fall into the first.
    async fn churn_through_resyncs(
        &self,
        r: &controllers::Running,
        interval: Duration,
        first_s: f64,
    ) -> Result<ResyncChurn> {
        let obs = self.obs()?.clone();
        drop(obs.take_flips());
        let stop = AtomicBool::new(false);
        let windows = async {
            let windows = resync_windows(r, interval).await;
            stop.store(true, Ordering::Relaxed);
            windows
        };
        let expected_s = RESYNCS_UNDER_CHURN as f64 * (first_s + interval.as_secs_f64());
        let rate =
            (self.churn_total() as f64 / expected_s).min(f64::from(self.opts.churn_rate.max(1)));
        let (flipped, windows) = tokio::join!(
            self.flip_pods(self.churn_total(), true, &stop, rate),
            windows
        );
        let Flipped { failed, writes, .. } = flipped?;
        let windows = windows?;
        let _ = obs
            .wait_for("flips drained", Duration::from_secs(30), |o| {
                o.pending() == 0
            })
            .await;
        let (flips, missed) = obs.take_flips();
        let during = |at: Instant| windows.iter().any(|w| w.holds(at));
        let p99 = |mut ms: Vec<f64>| {
            ms.sort_by(f64::total_cmp);
            (!ms.is_empty()).then(|| report::percentile(&ms, 99.0))
        };
        let (flips_during, flips_outside): (Vec<Flip>, Vec<Flip>) =
            flips.into_iter().partition(|f| during(f.sent));
        let (writes_during, writes_outside): (Vec<_>, Vec<_>) =
            writes.into_iter().partition(|(at, _)| during(*at));
        let ms = |flips: &[Flip]| flips.iter().map(|f| f.ms).collect::<Vec<_>>();
        let write_ms = |writes: Vec<(Instant, f64)>| writes.into_iter().map(|(_, ms)| ms).collect();
        let spans: Vec<(&str, &str)> = windows
            .iter()
            .map(|w| (w.metrics_before.as_str(), w.metrics_after.as_str()))
            .collect();
        Ok(ResyncChurn {
            resyncs: windows.len(),
            during_flips: flips_during.len(),
            during_p99_ms: p99(ms(&flips_during)),
            outside_flips: flips_outside.len(),
            outside_p99_ms: p99(ms(&flips_outside)),
            missed: missed as u64 + failed,
            during_flip_write_p99_ms: p99(write_ms(writes_during)),
            outside_flip_write_p99_ms: p99(write_ms(writes_outside)),
            during_in_process: inproc::InProcess::over(self.kind, &spans),
        })
    }

    /// A fresh endpoints-guard with a short resync interval: the first
    /// resync's cost, and the time window it ran in.
    async fn resync(&self) -> Result<(Resync, (SystemTime, SystemTime))> {
        let interval = self.opts.resync_phase_interval.max(Duration::from_secs(1));
        let log_name = format!("endpoints-guard-resync-{}", self.kind.name());
        let mut r = self.start(Controller::Guard, Some(interval), false, &log_name)?;
        r.wait_ready(Duration::from_secs(600)).await?;
        let plane_start = PlaneSample::read(&self.cp, &self.client).await?;
        let start = Instant::now();
        let mut samples: Vec<(SystemTime, procstat::CpuSample)> = Vec::new();
        let (duration_s, end) = loop {
            r.process.ensure_running()?;
            let text = r.metrics().await?;
            samples.push((SystemTime::now(), r.cpu()?));
            let count = procstat::metric(&text, "endpoints_guard_resync_duration_seconds_count");
            if count.unwrap_or(0.0) >= 1.0 {
                let sum = procstat::metric(&text, "endpoints_guard_resync_duration_seconds_sum");
                break (sum.unwrap_or(0.0), SystemTime::now());
            }
            if start.elapsed() > interval + Duration::from_secs(600) {
                anyhow::bail!("no resync finished within its interval plus 600 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let from = end - Duration::from_secs_f64(duration_s + 0.25);
        let cpu_end = r.cpu()?;
        let cpu_start = at_or_before(samples.iter(), &from)
            .cloned()
            .unwrap_or_default();
        let (cpu_s, precise) = cpu_end.since(&cpu_start);
        // From ready to the first resync's end: the resync, and the rest
        // of a process at rest, which the baseline takes away again.
        let control_plane = PlaneSample::read(&self.cp, &self.client)
            .await?
            .since(&plane_start, start.elapsed().as_secs_f64());
        let peak_rss_mb = r.peak_rss_mb()?;
        log(&format!(
            "{} endpoints-guard: pods flipped through {RESYNCS_UNDER_CHURN} resyncs",
            self.kind.objects()
        ));
        let churn = self.churn_through_resyncs(&r, interval, duration_s).await?;
        let shown = |v: Option<f64>| v.map_or("—".into(), |v| format!("{v:.1}"));
        log(&format!(
            "{} endpoints-guard: churn p99 during a resync {} ms ({} flips), outside {} ms ({} flips); \
             the flips' own status writes p99 {} ms during, {} ms outside; in the process during, event → write answered p99 {} ms",
            self.kind.objects(),
            shown(churn.during_p99_ms),
            churn.during_flips,
            shown(churn.outside_p99_ms),
            churn.outside_flips,
            shown(churn.during_flip_write_p99_ms),
            shown(churn.outside_flip_write_p99_ms),
            shown(churn.during_in_process.as_ref().map(|p| p.answered_p99_ms)),
        ));
        let resync = Resync {
            duration_s,
            cpu_s,
            cpu_from_ticks: !precise,
            peak_rss_mb,
            churn: Some(churn),
            control_plane: Some(control_plane),
            ..Resync::default()
        };
        r.process.stop().await?;
        Ok((resync, (from, end)))
    }
}

impl Bench {
    /// The ghost phase of controller `c`, which runs: one pod's DELETE lost
    /// between etcd and kube-apiserver's watch cache, the wait for its
    /// address to leave every object of the kind, then the workload restored
    /// (see [`ghost`]). Returns the figures and the wait's time window.
    async fn ghost(
        &mut self,
        c: Controller,
        running: &mut controllers::Running,
    ) -> Result<(Ghost, (SystemTime, SystemTime))> {
        let obs = self.obs()?.clone();
        let index = ghost::pod_index(self.workload.pods.len(), self.churn_total())
            .context("no pod of the workload is ready after churn")?;
        let pod = self.workload.pods[index].clone();
        let key = pod.key();
        obs.wait_for(
            &format!("{key} listed, ready, before its delete"),
            Duration::from_secs(60),
            |o| {
                let listed = o.listings(&key);
                listed.all > 0 && listed.ready == listed.all
            },
        )
        .await?;
        // What "restored" means afterwards: churn leaves some pods not
        // ready, so some Services are not correct, until the next reset.
        let correct_before = obs.correct();
        let before = match c {
            Controller::Guard => Some(running.metrics().await?),
            _ => None,
        };
        let dropped_before = self.cp.etcd_dropped_events().await?;
        self.cp
            .etcd_drop_events(
                &format!("/registry/pods/{}/{}", pod.namespace, pod.name),
                &["PUT", "DELETE"],
            )
            .await?;
        let deleted_at = SystemTime::now();
        let deleted = Instant::now();
        self.cp.force_delete_pod(&pod.namespace, &pod.name).await?;
        self.confirm_ghost(&pod, dropped_before).await?;
        let timeout = self.opts.ghost_timeout;
        log(&format!(
            "{} {}: {key} deleted, its DELETE lost in kube-apiserver's watch cache; waiting up to {} s for its address to go",
            self.kind.objects(),
            c.name(),
            timeout.as_secs()
        ));
        let gone = obs
            .wait_until(&format!("{key}'s address gone"), timeout, |o| {
                o.listings(&key).all == 0
            })
            .await?;
        let ended_at = SystemTime::now();
        // A controller that died while the bench waited found nothing: that
        // is a failed run, not a measurement.
        running.process.ensure_running()?;
        let after = match c {
            Controller::Guard => Some(running.metrics().await?),
            _ => None,
        };
        let counted = |name: &str| -> Option<u64> {
            let of = |text: &String| procstat::metric(text, name).unwrap_or(0.0);
            Some((of(after.as_ref()?) - of(before.as_ref()?)).max(0.0) as u64)
        };
        let apiserver_check_failures = match ghost::apiserver_check_failures(&self.client).await {
            Ok(failures) => Some(failures),
            Err(err) => {
                log(&format!(
                    "kube-apiserver's consistency checks not read: {err:#}"
                ));
                None
            }
        };
        let found_s = gone.map(|at| at.duration_since(deleted).as_secs_f64());
        log(&format!(
            "{} {}: {key}'s address {}; restoring the workload",
            self.kind.objects(),
            c.name(),
            found_s.map_or(format!("still listed after {} s", timeout.as_secs()), |s| {
                format!("gone after {s:.1} s")
            })
        ));
        let mut found = Ghost {
            pod: key.clone(),
            timeout_s: timeout.as_secs_f64(),
            found_s,
            apiserver_check_failures,
            resyncs: counted("endpoints_guard_resync_duration_seconds_count"),
            ghost_scan_reads: counted("endpoints_guard_ghost_scan_reads_total"),
            ..Ghost::default()
        };
        let restoring = Instant::now();
        self.restore_ghost(&pod, index, correct_before).await?;
        found.restore_s = restoring.elapsed().as_secs_f64();
        Ok((found, (deleted_at, ended_at)))
    }

    /// Fails unless the fault took: etcd-fault-proxy dropped the pod's
    /// event, etcd no longer has the pod and kube-apiserver's watch cache
    /// still serves it.
    async fn confirm_ghost(&self, pod: &PodRef, dropped_before: u64) -> Result<()> {
        let key = pod.key();
        // The event reaches the proxy on etcd's watch, a moment after the
        // delete is answered.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cp.etcd_dropped_events().await? <= dropped_before {
            if Instant::now() > deadline {
                anyhow::bail!("etcd-fault-proxy dropped no event of {key}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        if pods.get_opt(&pod.name).await?.is_some() {
            anyhow::bail!("etcd still has {key} after its delete");
        }
        let by_name = ListParams::default().fields(&format!("metadata.name={}", pod.name));
        if pods.list(&by_name).await?.items.is_empty() {
            anyhow::bail!("kube-apiserver's watch cache no longer serves {key}: no ghost");
        }
        Ok(())
    }

    /// After the ghost phase: the fault cleared, kube-apiserver restarted
    /// (its new watch cache, listed from etcd, has no ghost), pod `index`
    /// created again, and back where the phase began: the pod listed, ready,
    /// and `correct_before` Services' objects correct.
    async fn restore_ghost(
        &mut self,
        pod: &PodRef,
        index: usize,
        correct_before: usize,
    ) -> Result<()> {
        self.cp.etcd_clear_drops().await?;
        self.cp.restart_apiserver().await?;
        self.workload.create_pod_again(&self.client, index).await?;
        let key = pod.key();
        let obs = self.obs()?;
        let restored = obs
            .wait_until(
                "the workload restored after the ghost",
                self.opts.cold_sync_timeout,
                |o| {
                    let listed = o.listings(&key);
                    listed.all > 0 && listed.ready == listed.all && o.correct() == correct_before
                },
            )
            .await?;
        if restored.is_none() {
            anyhow::bail!(
                "the workload was not restored after the ghost within {:?}: {} Services correct ({correct_before} before the delete), {key} listed {:?}",
                self.opts.cold_sync_timeout,
                obs.correct(),
                obs.listings(&key)
            );
        }
        Ok(())
    }
}

/// kube-controller-manager's client QPS under `args` (its default is 20).
fn upstream_qps(args: &[String]) -> u32 {
    args.iter()
        .rev()
        .find_map(|a| a.strip_prefix("--kube-api-qps=")?.parse::<f64>().ok())
        .map_or(20, |q| q as u32)
}

/// A phase's name, figures and time window `[from, to)`.
type PhaseWindow = (String, Phase, SystemTime, SystemTime);

/// Where the replicas of a replicated endpoints-guard keep their Lease.
const LEASE_NAMESPACE: &str = "kube-system";

/// The followers' CPU seconds a minute over `window`, summed, from their
/// samples at its start; `None` without followers.
fn followers_cpu_per_min(
    followers: &[controllers::Running],
    before: &[procstat::CpuSample],
    window: Duration,
) -> Result<Option<f64>> {
    if followers.is_empty() || window.is_zero() {
        return Ok(None);
    }
    let mut cpu_s = 0.0;
    for (follower, start) in followers.iter().zip(before) {
        cpu_s += follower.cpu()?.since(start).0;
    }
    Ok(Some(cpu_s * 60.0 / window.as_secs_f64()))
}

struct Mark {
    at: SystemTime,
    instant: Instant,
    cpu: procstat::CpuSample,
    events: u64,
    /// The control plane's counters; none at the start of cold sync, whose
    /// spend includes the controller's start.
    plane: Option<PlaneSample>,
}

/// Compacts etcd at its current revision once the workload is created.
/// kube-apiserver compacts every 5 minutes to the revision it noted at the
/// tick before, so the creation's history would go at its second tick after
/// it started: inside the window with no controller when the creation takes
/// about 5 minutes (XL), else inside the first controller's run, each
/// charged with what the setup left. Logs what the compaction cost.
async fn compact_setup(cp: &ControlPlane, client: &Client) -> Result<()> {
    let before = PlaneSample::read(cp, client).await?;
    let started = Instant::now();
    let revision = cp.compact_etcd().await?;
    let took = started.elapsed().as_secs_f64();
    let spend = PlaneSample::read(cp, client).await?.since(&before, took);
    log(&format!(
        "etcd compacted at revision {revision} after the workload's creation in {took:.1} s: kube-apiserver {:.2} CPU-s, etcd {:.2} CPU-s",
        spend.apiserver_cpu_s, spend.etcd_cpu_s
    ));
    Ok(())
}

/// How a window at rest leaves kube-apiserver's consistency checks out.
#[derive(Clone, Copy)]
enum Checks<'a> {
    /// Measures what each costs in the window (with `true`; with `false`
    /// they stay in).
    Trace(bool),
    /// At this cost each.
    Known(Option<&'a checks::CheckCost>),
}

/// What the control plane spends at rest with no controller over `window`,
/// which starts `collection_offset` (at least 10 s: a settling pause) after
/// kube-apiserver and etcd were made to collect their garbage, with the
/// consistency checks that ended in it left out, and their cost when
/// measured here.
async fn window_at_rest(
    cp: &ControlPlane,
    client: &Client,
    window: Duration,
    collection_offset: Duration,
    left_out: Checks<'_>,
) -> Result<(Spend, Option<checks::CheckCost>)> {
    plane::collect_garbage(cp, client).await?;
    tokio::time::sleep(collection_offset.max(Duration::from_secs(10))).await;
    let trace = match left_out {
        Checks::Trace(true) => Some(checks::Trace::start(cp)?),
        _ => None,
    };
    let start = PlaneSample::read(cp, client).await?;
    let (started, from) = (Instant::now(), SystemTime::now());
    tokio::time::sleep(window).await;
    let end = PlaneSample::read(cp, client).await?;
    let window_s = started.elapsed().as_secs_f64();
    let spend = end.since(&start, window_s);
    let cost = match (trace, left_out) {
        (Some(trace), _) => Some(trace.finish(&cp.apiserver_log(), window_s).await?),
        (None, Checks::Known(cost)) => cost.cloned(),
        (None, Checks::Trace(_)) => None,
    };
    let spend = match &cost {
        Some(cost) => {
            let ended = checks::ended_between(
                &cp.apiserver_log(),
                checks::epoch_s(from),
                checks::epoch_s(SystemTime::now()),
            )?;
            spend.with_checks(&ended, cost)
        }
        None => spend,
    };
    let per_min = spend.per_minute();
    log(&format!(
        "control plane at rest with no controller, a minute, its {} consistency checks left out: kube-apiserver {:.3} CPU-s, etcd {:.3} CPU-s, {:.0} response bytes",
        spend.checks_in_window, per_min.apiserver_cpu_s, per_min.etcd_cpu_s, per_min.response_bytes
    ));
    if let (Checks::Trace(true), Some(cost)) = (left_out, &cost) {
        log(report::checks_text(cost).trim_end());
    }
    Ok((spend, cost))
}
