//! The soak (issue 15): the real local control plane, endpoints-guard (the
//! real binary, both controllers, enforce mode) behind watch-chaos, a
//! workload that never stops and a fault schedule that rotates through
//! everything the project can inject, judged by an oracle independent of the
//! controller; resource use sampled every 10 s must stay flat.
//!
//! `EG_SOAK_DURATION` (`make soak DURATION=30m`) sets the length; unset it is
//! 3 minutes (what `make test` runs). `EG_SOAK_FAULTS=a,b` runs only those
//! faults (for debugging). Reports: `target/soak/` (runs of 10 minutes or
//! more) or `target/soak/short/`. See docs/soak.md.

mod faults;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::endpoints_guard;
use anyhow::{Context as _, Result};
use eg_chaos::{ChaosProxy, Observer, Published};
use eg_harness::binaries::workspace_root;
use eg_harness::{ControlPlane, ControlPlaneOptions};
use eg_soak::guard::GuardProcess;
use eg_soak::oracle;
use eg_soak::report::{Episode, Report};
use eg_soak::stats::{self, Sample};
use eg_soak::workload::{self, Workload, WorkloadSize};
use eg_workload::parse_duration;
use serde_json::json;
use tokio::sync::{Mutex, RwLock};

pub const NS: &str = "soak";

/// The guard's `--resync-interval`: convergence is judged against it.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Slack on top of one resync interval: the resync's own list of a few
/// thousand pods through the proxy, the write, and the oracle's 1 s polling.
pub const SLACK: Duration = Duration::from_secs(15);

/// Everything a fault episode acts on.
pub struct Ctx {
    pub cp: Arc<RwLock<ControlPlane>>,
    pub proxy: Arc<ChaosProxy>,
    pub observer: Observer,
    /// The same for EndpointSlices: endpoints removed while their Service
    /// selected a live pod with that address.
    pub slice_observer: Observer,
    /// The addresses of `ghosts` (their removal is right, though the
    /// watch cache still lists the pod).
    pub ghost_ips: BTreeSet<String>,
    pub workload: Arc<Mutex<Workload>>,
    /// Pods whose DELETE kube-apiserver's watch cache missed.
    pub ghosts: BTreeSet<String>,
    pub client: kube::Client,
    pub t0: Instant,
    /// How long most faults stay on.
    pub window: Duration,
    /// How long Endpoints writes are denied.
    pub deny: Duration,
    /// Restores done so far (they alternate plain / bumped).
    pub restores: u32,
    /// The usual convergence budget: one resync interval + slack.
    pub budget: Duration,
}

impl Ctx {
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

struct Settings {
    duration: Duration,
    size: WorkloadSize,
    window: Duration,
    deny: Duration,
    gap: Duration,
    restart_every: Duration,
}

fn settings() -> Settings {
    let duration = std::env::var("EG_SOAK_DURATION")
        .ok()
        .filter(|d| !d.is_empty())
        .map(|d| {
            parse_duration(&d).unwrap_or_else(|| panic!("EG_SOAK_DURATION={d}: use 30m, 3m, 90s"))
        })
        .unwrap_or(Duration::from_secs(180));
    let short = duration < Duration::from_secs(600);
    Settings {
        duration,
        size: WorkloadSize {
            apps: 8,
            pods_per_app: 6,
            services: 12,
            big_services: if short { 2 } else { 3 },
            big_pods: if short { 1030 } else { 1100 },
            ops_per_second: 4.0,
        },
        window: Duration::from_secs(if short { 8 } else { 20 }),
        deny: Duration::from_secs(if short { 20 } else { 60 }),
        gap: Duration::from_secs(if short { 3 } else { 15 }),
        restart_every: (duration / 2).min(Duration::from_secs(300)),
    }
}

fn uptime() -> String {
    std::process::Command::new("uptime")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Polls the oracle every second from the end of a fault: the time to the
/// first pass that finds nothing wrong, or `None` (and the last problem)
/// when none comes within `2 × budget`.
async fn converge(ctx: &Ctx, ended: Instant, budget: Duration) -> (Option<f64>, Option<String>) {
    let mut last = None;
    while ended.elapsed() < budget * 2 {
        match oracle::check(&ctx.client, NS, &ctx.ghosts).await {
            Ok(check) if check.ok() => return (Some(ended.elapsed().as_secs_f64()), None),
            Ok(check) => last = Some(check.summary()),
            Err(err) => last = Some(format!("{err:#}")),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (None, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotating_faults_under_a_steady_workload() {
    let report = run().await.expect("soak");
    let dir = report_dir(report.duration_seconds).expect("workspace root");
    report.write(&dir).expect("report written");
    println!("{}", report.markdown());
    eprintln!("soak report: {}", dir.display());
    assert!(report.passed, "soak failed: {:#?}", report.failures);
}

async fn run() -> Result<Report> {
    let s = settings();
    let budget = RESYNC + SLACK;
    let load_start = uptime();
    let cp = ControlPlane::start(ControlPlaneOptions::default().with_etcd_fault_proxy()).await?;
    let proxy = ChaosProxy::in_front_of(&cp).await?;
    cp.create_namespace(NS).await?;
    let client = cp.client();
    let observer = Observer::start(&client, NS);
    let slice_observer = Observer::start_for(&client, NS, Published::EndpointSlices);

    let mut wl = Workload::new(client.clone(), NS, s.size, 0x5eed_50a4);
    let setup = Instant::now();
    wl.create_initial().await.context("creating the workload")?;
    eprintln!(
        "soak: workload created in {:.1}s",
        setup.elapsed().as_secs_f64()
    );

    let binary = endpoints_guard();
    let resync = format!("{}s", RESYNC.as_secs());
    let mut guard = GuardProcess::start(
        &binary,
        &proxy.kubeconfig,
        // The ghost scan at a fixed rate (no pass period): at the default
        // 6-hour period a pass over this workload reads one object every two
        // seconds (the floor), too slow for the ghost fault to converge
        // within its budget; `faults::ghost_scan_bound` assumes this rate.
        &[
            "--resync-interval",
            &resync,
            "--ghost-scan-period",
            "0",
            "--ghost-scan-qps",
            &faults::GHOST_SCAN_QPS.to_string(),
        ],
        &cp.log_dir().join("endpoints-guard.log"),
    )?;
    let started = Instant::now();
    guard.wait_ready(Duration::from_secs(180)).await?;
    let mut ctx = Ctx {
        cp: Arc::new(RwLock::new(cp)),
        proxy: Arc::new(proxy),
        observer,
        slice_observer,
        ghost_ips: BTreeSet::new(),
        workload: Arc::new(Mutex::new(wl)),
        ghosts: BTreeSet::new(),
        client: client.clone(),
        t0: Instant::now(),
        window: s.window,
        deny: s.deny,
        restores: 0,
        budget,
    };
    let (initial, problem) = converge(&ctx, started, Duration::from_secs(120)).await;
    let initial_sync_seconds = initial.with_context(|| {
        format!(
            "the initial state never converged: {problem:?}\n{}",
            guard.process.log_tail(30)
        )
    })?;
    eprintln!(
        "soak: initial sync {initial_sync_seconds:.1}s; running for {:?}",
        s.duration
    );

    // The clock starts: workload, sampler, background faults.
    ctx.t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let workload_task = workload::spawn(ctx.workload.clone(), stop.clone());
    let samples: Arc<std::sync::Mutex<Vec<Sample>>> = Arc::default();
    let guard = Arc::new(Mutex::new(guard));
    let sampler = {
        let (stop, samples, guard, t0) = (stop.clone(), samples.clone(), guard.clone(), ctx.t0);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            let mut died = None;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let mut g = guard.lock().await;
                if let Err(err) = g.process.ensure_running() {
                    died = Some(format!("{err:#}"));
                    break;
                }
                let metrics = g.get("/metrics").await.unwrap_or_default();
                let Ok(pid) = g.pid() else { continue };
                drop(g);
                let mut all = samples.lock().unwrap_or_else(|e| e.into_inner());
                match stats::sample(pid, t0.elapsed().as_secs_f64(), &metrics, all.last()) {
                    Ok(sample) => all.push(sample),
                    Err(err) => eprintln!("soak: sample: {err:#}"),
                }
            }
            died
        })
    };
    let compactions = Arc::new(AtomicU64::new(0));
    let cuts = Arc::new(AtomicU64::new(0));
    let background = {
        let (stop, cp, proxy) = (stop.clone(), ctx.cp.clone(), ctx.proxy.clone());
        let (compactions, cuts) = (compactions.clone(), cuts.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                if cp.read().await.compact_etcd().await.is_ok() {
                    compactions.fetch_add(1, Ordering::Relaxed);
                }
                if n.is_multiple_of(3)
                    && proxy.post("/actions/cut-streams", json!({})).await.is_ok()
                {
                    cuts.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // The fault schedule.
    let rotation: Vec<String> = match std::env::var("EG_SOAK_FAULTS") {
        Ok(list) if !list.is_empty() => list.split(',').map(str::to_string).collect(),
        _ => faults::ROTATION.iter().map(|s| s.to_string()).collect(),
    };
    let mut episodes: Vec<Episode> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut last_restart = Instant::now();
    // Time the workload stood still at quiet points.
    let mut paused = Duration::ZERO;
    let mut i = 0;
    while ctx.t0.elapsed() < s.duration {
        let left = s.duration.saturating_sub(ctx.t0.elapsed());
        let fault = if last_restart.elapsed() >= s.restart_every {
            last_restart = Instant::now();
            "apiserver-restart".to_string()
        } else {
            // The next fault of the rotation that fits in the time left.
            let next = (0..rotation.len())
                .map(|k| rotation[(i + k) % rotation.len()].clone())
                .position(|f| faults::expected(&ctx, &f) <= left);
            let Some(k) = next else { break };
            i += k + 1;
            rotation[(i - 1) % rotation.len()].clone()
        };
        let spurious_before = ctx.observer.spurious_deletions().len();
        let started = ctx.now();
        eprintln!("soak: {started:>6.0}s {fault}");
        let budget = match faults::apply(&mut ctx, &fault).await {
            Ok(special) => special.unwrap_or(budget),
            Err(err) => {
                failures.push(format!(
                    "{fault} at {started:.0}s could not be applied: {err:#}"
                ));
                budget
            }
        };
        let ended_at = Instant::now();
        let ended = ctx.now();
        // Quiet point: the workload pauses while the oracle looks.
        let mut w = ctx.workload.lock().await;
        let (seconds, problem) = converge(&ctx, ended_at, budget).await;
        if let Err(err) = w.refresh().await {
            eprintln!("soak: workload refresh: {err:#}");
        }
        drop(w);
        paused += ended_at.elapsed();
        let converged = seconds.is_some_and(|s| s <= budget.as_secs_f64());
        let spurious = ctx.observer.spurious_deletions().len() - spurious_before;
        eprintln!(
            "soak: {:>6.0}s {fault}: converged {converged} in {seconds:?}s, spurious {spurious} {}",
            ctx.now(),
            problem.clone().unwrap_or_default()
        );
        if !converged {
            failures.push(format!(
                "{fault} at {started:.0}s: not converged within {budget:?} ({seconds:?}): {}",
                problem.clone().unwrap_or_default()
            ));
        }
        episodes.push(Episode {
            budget_seconds: budget.as_secs_f64(),
            fault,
            started,
            ended,
            converged,
            converge_seconds: seconds.map(|s| (s * 10.0).round() / 10.0),
            spurious,
            problem,
        });
        tokio::time::sleep(s.gap).await;
    }
    let run_seconds = ctx.now();
    stop.store(true, Ordering::Relaxed);
    let _ = workload_task.await;
    background.abort();
    if let Ok(Some(died)) = sampler.await {
        failures.push(format!("endpoints-guard died: {died}"));
    }
    let samples = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (last, problem) = converge(&ctx, Instant::now(), budget).await;
    if last.is_none() {
        failures.push(format!("final state not converged: {problem:?}"));
    }
    let spurious_deletions = ctx.observer.spurious_deletions();
    if !spurious_deletions.is_empty() {
        failures.push(format!(
            "{} spurious Endpoints deletions",
            spurious_deletions.len()
        ));
    }
    let trends = stats::trends(&samples, run_seconds);
    for t in trends.iter().filter(|t| !t.flat) {
        failures.push(format!(
            "{} grew {:+.1} {} over the last two thirds (allowed {:.1})",
            t.series, t.growth, t.unit, t.allowed
        ));
    }
    let operations = ctx.workload.lock().await.counts.clone();
    // Not trivial: the workload really ran, and faults really came.
    let running = (run_seconds - paused.as_secs_f64()).max(0.0);
    let want_ops = (running * s.size.ops_per_second * 0.4) as u64;
    if operations.total() < want_ops {
        failures.push(format!(
            "the workload made {} operations, fewer than {want_ops}",
            operations.total()
        ));
    }
    let kinds: BTreeSet<&str> = episodes.iter().map(|e| e.fault.as_str()).collect();
    if kinds.len() < 4.min(rotation.len()) {
        failures.push(format!("only {} kinds of fault ran", kinds.len()));
    }
    if samples.len() < 6 {
        failures.push(format!("only {} samples", samples.len()));
    }
    // endpoints-guard asks for pods in protobuf and watch-chaos answers on it:
    // the soak's faults reach the decoder production runs.
    let stats = ctx.proxy.get("/stats").await.unwrap_or_default();
    let protobuf_pod_watches = ChaosProxy::protobuf_watches(&stats, "pods");
    if protobuf_pod_watches == 0 {
        failures.push(format!(
            "no pod watch went through watch-chaos in protobuf: {}",
            stats["resources"]["pods"]
        ));
    }
    let guard = guard.lock().await;
    if !failures.is_empty() {
        eprintln!(
            "soak: endpoints-guard log tail:\n{}",
            guard.process.log_tail(40)
        );
    }
    drop(guard);
    let mut report = Report {
        passed: false,
        failures,
        duration_seconds: run_seconds,
        resync_interval_seconds: RESYNC.as_secs_f64(),
        convergence_budget_seconds: budget.as_secs_f64(),
        guard_binary: binary
            .strip_prefix(workspace_root()?)
            .unwrap_or(&binary)
            .display()
            .to_string(),
        workload: s.size,
        operations,
        etcd_compactions: compactions.load(Ordering::Relaxed),
        stream_cuts: cuts.load(Ordering::Relaxed),
        protobuf_pod_watches,
        load: vec![load_start, uptime()],
        initial_sync_seconds: (initial_sync_seconds * 10.0).round() / 10.0,
        episodes,
        spurious_deletions,
        spurious_slice_removals: Vec::new(),
        trends,
        samples,
    };
    // Judging the slice history takes a while after a long run (it replays
    // every slice event): a report is written before, in case it is cut short.
    let mut provisional = report.clone();
    provisional
        .failures
        .push("EndpointSlice removals not judged yet".to_string());
    provisional.write(&report_dir(run_seconds)?)?;
    let judged = Instant::now();
    let spurious_slice_removals: Vec<String> = ctx
        .slice_observer
        .spurious_deletions()
        .into_iter()
        .filter(|r| {
            !ctx.ghost_ips
                .iter()
                .any(|ip| r.starts_with(&format!("{ip} ")))
        })
        .collect();
    eprintln!(
        "soak: slice removals judged in {:.1}s",
        judged.elapsed().as_secs_f64()
    );
    let named: BTreeSet<&str> = spurious_slice_removals
        .iter()
        .filter_map(|r| r.split(" left the slices of ").nth(1)?.split(' ').next())
        .collect();
    for service in named.iter().take(5) {
        eprintln!(
            "soak: what the observer saw of Service {service}:\n{}",
            ctx.slice_observer.service_versions(service)
        );
    }
    if !spurious_slice_removals.is_empty() {
        report.failures.push(format!(
            "{} endpoints removed from EndpointSlices while their Service selected a live pod",
            spurious_slice_removals.len()
        ));
    }
    report.spurious_slice_removals = spurious_slice_removals;
    report.passed = report.failures.is_empty();
    if !report.passed {
        // The logs of every process (the guard's included) are what a failed
        // soak needs; the control plane is dropped before the assertion.
        ctx.cp.write().await.keep_logs();
    }
    Ok(report)
}

/// target/soak/ for runs of 10 minutes or more, else target/soak/short/.
fn report_dir(run_seconds: f64) -> Result<std::path::PathBuf> {
    Ok(workspace_root()?.join(if run_seconds < 600.0 {
        "target/soak/short"
    } else {
        "target/soak"
    }))
}
