//! The bench's outputs, per kind: `report.json` (runs of every size measured
//! so far), `report.md` (figures and target ratios) and
//! `latency-cdf-<size>.svg` for Endpoints; `report-endpointslices.json`,
//! `report-endpointslices.md` and `latency-cdf-endpointslices-<size>.svg` for
//! EndpointSlices.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::checks::CheckCost;
use super::inproc::InProcess;
use super::plane::Spend;
use super::{BenchOptions, Controller, Ghost, Kind, Phase, Resync, ResyncChurn};

/// One controller at one size. The first fields are the ones issue 7 names;
/// `cpu_s`, `writes`, `requests` cover cold sync, churn and steady (not the
/// separate resync process); `changes` = Services (cold sync) + flips seen.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub size: String,
    /// What both controllers wrote: Endpoints or EndpointSlices.
    #[serde(default)]
    pub kind: Kind,
    pub controller: Controller,
    pub cold_sync_s: f64,
    pub churn_p50_ms: f64,
    pub churn_p90_ms: f64,
    pub churn_p99_ms: f64,
    pub cpu_s: f64,
    pub peak_rss_mb: f64,
    pub writes: u64,
    pub changes: u64,
    pub requests: BTreeMap<String, u64>,
    /// VmHWM of the process that ran cold sync, churn and steady (for
    /// endpoints-guard `peak_rss_mb` also covers the resync process).
    #[serde(default)]
    pub peak_rss_main_mb: f64,
    pub services: usize,
    pub pods: usize,
    pub setup_s: f64,
    pub churn_rate_per_s: u32,
    pub churn_flips: u64,
    pub churn_failed_writes: u64,
    /// Flips never seen in the Endpoints (slices) within 30 s of the churn's end.
    pub churn_missed: u64,
    pub churn_writes: u64,
    pub phases: BTreeMap<String, Phase>,
    pub resync: Option<Resync>,
    /// endpoints-guard's `--ghost-scan-qps` in this run (the bench's, else
    /// the binary's default).
    #[serde(default)]
    pub ghost_scan_qps: Option<f64>,
    /// endpoints-guard's `--resync-interval` in this run, seconds (the
    /// bench's, else the binary's default; 0: no resync). None for
    /// kube-controller-manager, and in reports written before it was recorded.
    #[serde(default)]
    pub resync_interval_s: Option<f64>,
    /// Seconds from a ghost pod's delete, lost in kube-apiserver's watch
    /// cache, until its address had left every Endpoints (EndpointSlice) of
    /// the run. None: not within the ghost phase's timeout, or no ghost phase
    /// ran (`ghost` tells which).
    #[serde(default)]
    pub ghost_found_s: Option<f64>,
    /// The ghost phase; None: not measured for this run.
    #[serde(default)]
    pub ghost: Option<Ghost>,
    /// API requests a second at rest, every verb but watch
    /// ([`requests_per_s_at_rest`]).
    #[serde(default)]
    pub api_requests_per_s_at_rest: Option<f64>,
    /// endpoints-guard's `--full-resync-interval` in this run, seconds
    /// (None: kube-controller-manager, or a build whose every resync is full).
    #[serde(default)]
    pub full_resync_interval_s: Option<f64>,
    /// kube-controller-manager's `--kube-api-qps` in this run (none for
    /// endpoints-guard; reports written before it was recorded: 20).
    #[serde(default)]
    pub client_qps: Option<u32>,
    /// endpoints-guard's own time in churn, from its event-to-write
    /// histograms (none for kube-controller-manager, and for reports
    /// written before they were scraped).
    #[serde(default)]
    pub in_process: Option<InProcess>,
    /// What the controller added to kube-apiserver's CPU at rest: seconds a
    /// minute in steady less a minute of the same control plane with no
    /// controller (`control_plane_baseline`), both without kube-apiserver's
    /// consistency checks that ended in them ([`Spend::with_checks`]).
    /// Noise can make it negative.
    /// None in reports written before it was measured.
    #[serde(default)]
    pub apiserver_cpu_s_per_min_at_rest: Option<f64>,
    /// The same for etcd (every member).
    #[serde(default)]
    pub etcd_cpu_s_per_min_at_rest: Option<f64>,
    /// The same for the bytes of kube-apiserver's answers (every request
    /// but watches).
    #[serde(default)]
    pub response_bytes_per_min_at_rest: Option<f64>,
    /// The seats API Priority and Fairness charged the controller's requests
    /// a minute at rest (counted as the figures above).
    #[serde(default)]
    pub apf_seats_per_min_at_rest: Option<f64>,
    /// The control plane at rest with no controller, the figures above
    /// are measured against: the window of the run's round, taken after
    /// its first controller stopped (its objects still stored), else the
    /// one after the workload's setup.
    #[serde(default)]
    pub control_plane_baseline: Option<Spend>,
    /// The window with no controller after the workload's setup, which also
    /// measured kube-apiserver's consistency checks; before each round had
    /// its own window, the baseline (None in reports written before then).
    #[serde(default)]
    pub control_plane_after_setup: Option<Spend>,
    /// endpoints-guard: p99 of the pod flips sent while a resync ran, from
    /// the flip to the watch event showing it (beside it, `resync.churn`
    /// holds the p99 outside resyncs in the same process).
    #[serde(default)]
    pub churn_p99_during_resync_ms: Option<f64>,
    /// What kube-apiserver's own consistency checks of pods, Services,
    /// Endpoints, EndpointSlices and Nodes cost it and etcd, CPU seconds a
    /// minute, in the window with no controller ([`crate::checks`]): the
    /// floor that what a controller adds at rest is held against. The same
    /// for every run of a bench.
    #[serde(default)]
    pub consistency_check_cpu_s_per_min: Option<f64>,
    /// Those checks one by one: each resource's count and CPU in the window.
    #[serde(default)]
    pub consistency_check: Option<CheckCost>,
    /// endpoints-guard's replicas in the run (none for upstream, and for
    /// reports written before replicas were measured: one).
    #[serde(default)]
    pub guard_replicas: Option<u32>,
    /// With more than one replica, the followers' own CPU seconds a minute
    /// in steady, together (the leader's is `phases["steady"]`).
    #[serde(default)]
    pub followers_cpu_s_per_min_at_rest: Option<f64>,
}

impl RunResult {
    /// What the controller added to kube-apiserver's and etcd's CPU at rest
    /// over what kube-apiserver's consistency checks of the same resources
    /// cost them (issue target: at most 1).
    pub fn plane_cpu_over_checks(&self) -> Option<f64> {
        let added = self.apiserver_cpu_s_per_min_at_rest? + self.etcd_cpu_s_per_min_at_rest?;
        let checks = self.consistency_check_cpu_s_per_min?;
        (checks > 0.0).then(|| added / checks)
    }

    /// What this run added to kube-apiserver's and etcd's CPU at rest less
    /// what `other`, a run of the same round (measured against the same
    /// window with no controller, which cancels out), added, over the
    /// consistency checks: read with kube-controller-manager, which sends
    /// no request at rest, as `other`, it needs no window with no
    /// controller to be steady.
    pub fn plane_cpu_over_checks_beside(&self, other: &RunResult) -> Option<f64> {
        let added = |r: &RunResult| {
            Some(r.apiserver_cpu_s_per_min_at_rest? + r.etcd_cpu_s_per_min_at_rest?)
        };
        let checks = self.consistency_check_cpu_s_per_min?;
        (checks > 0.0).then_some((added(self)? - added(other)?) / checks)
    }

    /// Sets the figures at rest (`*_per_min_at_rest`) to what steady
    /// spent less a minute of `baseline`, the control plane with no
    /// controller; with full resyncs rarer than steady's resyncs, plus each
    /// one's cost as the resync phase measured it, spread over the full
    /// interval. None without a steady window on the control plane.
    pub fn measure_at_rest(&mut self, baseline: Spend) {
        let spread_full = match (self.full_resync_interval_s, self.resync_interval_s) {
            (Some(full), Some(every)) if full > every && every > 0.0 => self
                .resync
                .as_ref()
                .and_then(|r| r.control_plane)
                .map(|spend| (spend.added_over(&baseline), full)),
            _ => None,
        };
        let at_rest = self
            .phases
            .get("steady")
            .and_then(|p| p.control_plane)
            .map(|spend| {
                let steady = spend.attributable_per_min(&baseline);
                match spread_full {
                    Some((full, interval_s)) => steady.plus_spread(full, interval_s),
                    None => steady,
                }
            });
        self.apiserver_cpu_s_per_min_at_rest = at_rest.map(|m| m.apiserver_cpu_s);
        self.etcd_cpu_s_per_min_at_rest = at_rest.map(|m| m.etcd_cpu_s);
        self.response_bytes_per_min_at_rest = at_rest.map(|m| m.response_bytes);
        self.apf_seats_per_min_at_rest = at_rest.map(|m| m.apf_seats);
        self.control_plane_baseline = at_rest.map(|_| baseline);
    }

    /// The pod flips of the resync phase, filed by whether a resync ran.
    pub fn resync_churn(&self) -> Option<&ResyncChurn> {
        self.resync.as_ref()?.churn.as_ref()
    }

    /// Peak RSS over the pods of the workload, in bytes.
    pub fn rss_bytes_per_pod(&self) -> f64 {
        if self.pods == 0 {
            0.0
        } else {
            self.peak_rss_mb * 1024.0 * 1024.0 / self.pods as f64
        }
    }

    /// API requests a second in the cold phase: against the client's QPS it
    /// shows whether the rate limiter set the cold sync's pace.
    pub fn cold_requests_per_s(&self) -> f64 {
        let Some(cold) = self.phases.get("cold") else {
            return 0.0;
        };
        let n: u64 = cold.requests.values().sum();
        if self.cold_sync_s > 0.0 {
            n as f64 / self.cold_sync_s
        } else {
            0.0
        }
    }

    /// The column heading of its controller.
    pub fn label(&self) -> String {
        match self.controller {
            Controller::Guard => "endpoints-guard".into(),
            Controller::Upstream | Controller::UpstreamFast => format!(
                "kube-controller-manager, QPS {}",
                self.client_qps.unwrap_or(20)
            ),
        }
    }

    /// The ghost scan in the steady phase, where it makes every request:
    /// (reads, reads a second, CPU µs per read). `None` for upstream.
    pub fn ghost_scan_cost(&self) -> Option<(u64, f64, f64)> {
        self.ghost_scan_qps?;
        let steady = self.phases.get("steady")?;
        let reads = steady.requests.get("get").copied().unwrap_or(0);
        let per_s = if steady.wall_s > 0.0 {
            reads as f64 / steady.wall_s
        } else {
            0.0
        };
        let cpu_us = if reads > 0 {
            steady.cpu_s * 1e6 / reads as f64
        } else {
            0.0
        };
        Some((reads, per_s, cpu_us))
    }

    /// CPU of cold sync, churn and steady less an estimate of what the ghost
    /// scan's reads cost (every GET of the three phases at steady's CPU per
    /// read, which also holds the idle process's own CPU, so the estimate
    /// leans low). Upstream: its CPU.
    pub fn cpu_without_ghost_scan_s(&self) -> f64 {
        let Some((_, _, cpu_us)) = self.ghost_scan_cost() else {
            return self.cpu_s;
        };
        let gets = self.requests.get("get").copied().unwrap_or(0);
        (self.cpu_s - gets as f64 * cpu_us / 1e6).max(0.0)
    }

    /// Whether steady brought nothing but the ghost scan's GETs, within its
    /// budget (10 % and two reads of slack for the phase edges), and the
    /// periodic resync's list pages and the watches it resumes after them:
    /// at most one resync's (as the resync phase measured them) for each
    /// resync that fits in the window. Leader election's Lease requests,
    /// with replicas, are neither.
    pub fn steady_is_only_the_scan_and_resync(&self) -> bool {
        let Some(steady) = self.phases.get("steady") else {
            return false;
        };
        let count = |verb: &str| {
            let all = steady.requests.get(verb).copied().unwrap_or(0);
            let lease = steady
                .requests_by_resource
                .get(&format!("{verb} leases"))
                .copied()
                .unwrap_or(0);
            all.saturating_sub(lease)
        };
        let budget = self.ghost_scan_qps.unwrap_or(0.0) * steady.wall_s * 1.1 + 2.0;
        let gets = count("get");
        let interval_s = self.resync_interval_s.unwrap_or(0.0);
        let resyncs = if interval_s > 0.0 {
            (steady.wall_s / interval_s).floor() as u64 + 1
        } else {
            0
        };
        let within_resyncs =
            |verb: &str| count(verb) <= resyncs * resync_requests(self.resync.as_ref(), verb);
        let others: u64 = steady
            .requests
            .keys()
            .filter(|verb| !matches!(verb.as_str(), "get" | "list" | "watch"))
            .map(|verb| count(verb))
            .sum();
        steady.writes == 0
            && others == 0
            && (gets as f64) <= budget
            && within_resyncs("list")
            && within_resyncs("watch")
    }
}

/// The requests of one verb that one full resync made, as the resync phase
/// measured them: its list pages, and the watches it resumes after them.
fn resync_requests(resync: Option<&Resync>, verb: &str) -> u64 {
    resync.map_or(0, |r| r.requests.get(verb).copied().unwrap_or(0))
}

/// API requests a second at rest, every verb but watch (a watch is one
/// long request, not a rate). kube-controller-manager: its requests in the
/// steady phase over the phase's length. endpoints-guard: the same, but its
/// list requests in steady (the periodic resync's pages, which a window of a
/// minute holds once or not at all) replaced by one full resync's lists (the
/// resync phase's) spread over the resync interval in effect; with the
/// resync off, steady as it is. None without a steady phase, or for
/// endpoints-guard without a resync measurement.
pub fn requests_per_s_at_rest(
    controller: Controller,
    steady: Option<&Phase>,
    resync: Option<&Resync>,
    resync_interval_s: Option<f64>,
    full_resync_interval_s: Option<f64>,
) -> Option<f64> {
    let steady = steady.filter(|s| s.wall_s > 0.0)?;
    let count = |verb: &str| steady.requests.get(verb).copied().unwrap_or(0);
    let all: u64 = steady.requests.values().sum::<u64>() - count("watch");
    let interval_s = resync_interval_s.unwrap_or(0.0);
    if controller.is_upstream() || interval_s <= 0.0 {
        return Some(all as f64 / steady.wall_s);
    }
    let one_resync = resync?.requests.get("list").copied().unwrap_or(0);
    match full_resync_interval_s {
        // Count checks between full resyncs: steady holds the checks (and
        // no full resync, which comes minutes later); the full one's lists
        // spread over its own interval.
        Some(full_s) if full_s > interval_s => {
            Some(all as f64 / steady.wall_s + one_resync as f64 / full_s)
        }
        _ => Some((all - count("list")) as f64 / steady.wall_s + one_resync as f64 / interval_s),
    }
}

/// The ghost phase's outcome in words: seconds, "not within N s", or "not
/// measured".
pub fn ghost_text(run: &RunResult) -> String {
    match (&run.ghost, run.ghost_found_s) {
        (None, _) => "not measured".to_string(),
        (Some(_), Some(found)) => format!("{found:.1} s"),
        (Some(g), None) => format!("not within {:.0} s", g.timeout_s),
    }
}

/// The phase in which a replicated endpoints-guard's followers start.
pub(super) const FOLLOWERS_PHASE: &str = "followers";

/// The pause before steady between making kube-apiserver and etcd collect
/// their garbage and steady's start ([`crate::plane::collect_garbage`]).
pub(super) const SETTLE_PHASE: &str = "settle";

/// Phases kept in `phases` but not in a run's totals, which are the
/// measured process's cold sync, churn and steady.
const UNCOUNTED_PHASES: [&str; 2] = [FOLLOWERS_PHASE, SETTLE_PHASE];

pub(super) struct Parts<'a> {
    pub size: &'a BenchOptions,
    pub kind: Kind,
    pub controller: Controller,
    pub setup_s: f64,
    pub cold_sync_s: f64,
    /// Sorted.
    pub latencies: &'a [f64],
    pub flips: u64,
    pub failed: u64,
    pub missed: usize,
    pub peak_rss_main_mb: f64,
    pub phases: BTreeMap<String, Phase>,
    pub resync: Option<Resync>,
    pub ghost_scan_qps: Option<f64>,
    pub resync_interval: Option<std::time::Duration>,
    pub full_resync_interval: Option<std::time::Duration>,
    pub ghost: Option<Ghost>,
    pub client_qps: Option<u32>,
    pub in_process: Option<InProcess>,
    /// The window with no controller the figures at rest are measured
    /// against (see [`RunResult::measure_at_rest`]).
    pub baseline: Spend,
    /// The window with no controller after the workload's setup.
    pub setup_baseline: Spend,
    pub consistency_check: Option<CheckCost>,
    pub guard_replicas: Option<u32>,
    pub followers_cpu_s_per_min_at_rest: Option<f64>,
}

/// A paragraph on kube-apiserver's own consistency checks in the window
/// with no controller.
pub(crate) fn checks_text(checks: &CheckCost) -> String {
    let each: Vec<String> = super::checks::CHECKED
        .iter()
        .map(|(group, resource)| {
            let name = super::checks::resource_name(group, resource);
            match checks.resources.get(&name) {
                Some(r) if r.errors > 0 => format!(
                    "{resource} {}× {:.3} CPU-s ({} ended in an error)",
                    r.checks,
                    r.cpu_s_per_check(),
                    r.errors
                ),
                Some(r) => format!("{resource} {}× {:.3} CPU-s", r.checks, r.cpu_s_per_check()),
                None => format!("{resource} not checked"),
            }
        })
        .collect();
    let per_min = checks.cpu_s_per_min.map_or_else(
        || "not measured (a resource had no check)".to_string(),
        |c| format!("{c:.4} CPU-s"),
    );
    format!(
        "kube-apiserver's consistency checks in the {:.0} s with no controller (kube-apiserver + etcd, each above their idle {:.3} CPU-s a second): {}; a minute of them, one check per resource every {:.0} s on average: {per_min}.\n\n",
        checks.window_s,
        checks.idle_cpu_s_per_s,
        each.join(", "),
        super::checks::MEAN_PERIOD_S,
    )
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(super) fn assemble(parts: Parts<'_>) -> RunResult {
    let opts = parts.size;
    let mut requests = BTreeMap::new();
    let (mut cpu_s, mut writes) = (0.0, 0);
    // The followers' start (replicas) and the settling pause are kept in
    // `phases` but not in the run's totals: those are the measured
    // process's cold sync, churn and steady, as with one replica.
    for (_, phase) in parts
        .phases
        .iter()
        .filter(|(name, _)| !UNCOUNTED_PHASES.contains(&name.as_str()))
    {
        super::audit::add(&mut requests, &phase.requests);
        cpu_s += phase.cpu_s;
        writes += phase.writes;
    }
    let lat = parts.latencies;
    let resync_interval_s = parts.resync_interval.map(|i| i.as_secs_f64());
    let api_requests_per_s_at_rest = requests_per_s_at_rest(
        parts.controller,
        parts.phases.get("steady"),
        parts.resync.as_ref(),
        resync_interval_s,
        parts.full_resync_interval.map(|i| i.as_secs_f64()),
    );
    let full_resync_interval_s = parts.full_resync_interval.map(|i| i.as_secs_f64());
    let steady_on_plane = parts
        .phases
        .get("steady")
        .is_some_and(|p| p.control_plane.is_some());
    let churn_p99_during_resync_ms = parts
        .resync
        .as_ref()
        .and_then(|r| r.churn.as_ref())
        .and_then(|c| c.during_p99_ms);
    let mut run = RunResult {
        size: opts.size.name.clone(),
        kind: parts.kind,
        controller: parts.controller,
        cold_sync_s: parts.cold_sync_s,
        churn_p50_ms: percentile(lat, 50.0),
        churn_p90_ms: percentile(lat, 90.0),
        churn_p99_ms: percentile(lat, 99.0),
        cpu_s,
        peak_rss_mb: parts.resync.as_ref().map_or(parts.peak_rss_main_mb, |r| {
            r.peak_rss_mb.max(parts.peak_rss_main_mb)
        }),
        peak_rss_main_mb: parts.peak_rss_main_mb,
        writes,
        changes: (opts.size.services + lat.len()) as u64,
        requests,
        services: opts.size.services,
        pods: opts.size.pods(),
        setup_s: parts.setup_s,
        churn_rate_per_s: opts.churn_rate,
        churn_flips: parts.flips,
        churn_failed_writes: parts.failed,
        churn_missed: parts.missed as u64,
        churn_writes: parts.phases.get("churn").map_or(0, |p| p.writes),
        phases: parts.phases,
        resync: parts.resync,
        ghost_scan_qps: parts.ghost_scan_qps,
        resync_interval_s,
        ghost_found_s: parts.ghost.as_ref().and_then(|g| g.found_s),
        ghost: parts.ghost,
        api_requests_per_s_at_rest,
        full_resync_interval_s,
        client_qps: parts.client_qps,
        in_process: parts.in_process,
        apiserver_cpu_s_per_min_at_rest: None,
        etcd_cpu_s_per_min_at_rest: None,
        response_bytes_per_min_at_rest: None,
        apf_seats_per_min_at_rest: None,
        control_plane_baseline: None,
        control_plane_after_setup: steady_on_plane.then_some(parts.setup_baseline),
        churn_p99_during_resync_ms,
        consistency_check_cpu_s_per_min: parts
            .consistency_check
            .as_ref()
            .and_then(|c| c.cpu_s_per_min),
        consistency_check: parts.consistency_check,
        guard_replicas: parts.guard_replicas,
        followers_cpu_s_per_min_at_rest: parts.followers_cpu_s_per_min_at_rest,
    };
    run.measure_at_rest(parts.baseline);
    run
}

#[derive(Serialize, Deserialize, Default)]
struct Report {
    runs: Vec<RunResult>,
}

/// `report.json` / `report.md` (Endpoints) or `report-endpointslices.*`.
pub fn report_file(kind: Kind, extension: &str) -> String {
    format!("report{}.{extension}", kind.file_suffix())
}

/// `latency-cdf-<size>.svg` (Endpoints) or `latency-cdf-endpointslices-<size>.svg`.
pub fn cdf_file(kind: Kind, size: &str) -> String {
    format!("latency-cdf{}-{size}.svg", kind.file_suffix())
}

/// Writes the kind's report JSON (replacing earlier runs of `size`), its
/// markdown and the CDF plot of `size`.
pub(super) fn write_all(
    dir: &Path,
    kind: Kind,
    size: &str,
    runs: &[RunResult],
    latencies: &[(Controller, Vec<f64>)],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join(report_file(kind, "json"));
    let mut report: Report = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    report.runs.retain(|r| r.size != size);
    report.runs.extend(runs.iter().cloned());
    // Smallest first (S, M, L, XL, numbered sizes in between); stable, so a
    // size's runs stay in their order.
    report.runs.sort_by_key(|r| r.pods);
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md = dir.join(report_file(kind, "md"));
    std::fs::write(&md, markdown(kind, &report.runs))
        .with_context(|| format!("writing {}", md.display()))?;
    let raw = dir.join(format!("latencies{}-{size}.json", kind.file_suffix()));
    let named: BTreeMap<&str, &Vec<f64>> = latencies.iter().map(|(c, v)| (c.name(), v)).collect();
    std::fs::write(&raw, serde_json::to_string(&named)? + "\n")
        .with_context(|| format!("writing {}", raw.display()))?;
    let svg = dir.join(cdf_file(kind, size));
    std::fs::write(&svg, cdf_svg(kind, size, latencies))
        .with_context(|| format!("writing {}", svg.display()))?;
    eprintln!(
        "eg-bench: wrote {}, {} and {}",
        json_path.display(),
        md.display(),
        svg.display()
    );
    Ok(())
}

/// Rewrites each kind's markdown in `dir` from its JSON (kinds without a
/// JSON file are skipped); returns the files written.
pub fn render_markdown(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    for kind in Kind::ALL {
        let json_path = dir.join(report_file(kind, "json"));
        let Ok(text) = std::fs::read_to_string(&json_path) else {
            continue;
        };
        let report: Report = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", json_path.display()))?;
        let md = dir.join(report_file(kind, "md"));
        std::fs::write(&md, markdown(kind, &report.runs))
            .with_context(|| format!("writing {}", md.display()))?;
        written.push(md);
    }
    if written.is_empty() {
        anyhow::bail!("no report JSON in {}", dir.display());
    }
    Ok(written)
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 {
        format!("{:.2}×", ours / theirs)
    } else {
        "n/a".into()
    }
}

/// The time within which a ghost's address must leave every object.
pub const GHOST_TARGET_S: f64 = 600.0;

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

fn requests_text(requests: &BTreeMap<String, u64>) -> String {
    if requests.is_empty() {
        return "0".into();
    }
    requests
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes in the cold phase per Service (each Service is one distinct change).
pub fn cold_writes_per_service(r: &RunResult) -> f64 {
    let cold = r.phases.get("cold").map_or(0, |p| p.writes);
    if r.services == 0 {
        0.0
    } else {
        cold as f64 / r.services as f64
    }
}

/// Churn writes per flip seen (each flip is one distinct change).
pub fn writes_per_change(r: &RunResult) -> f64 {
    let changes = r
        .churn_flips
        .saturating_sub(r.churn_missed + r.churn_failed_writes);
    if changes == 0 {
        0.0
    } else {
        r.churn_writes as f64 / changes as f64
    }
}

/// report.md: per size, the figures of each controller and the targets.
pub fn markdown(kind: Kind, runs: &[RunResult]) -> String {
    let upstream_name = kind.upstream_controller().0;
    let mut out = format!(
        "# endpoints-guard vs kube-controller-manager (`make bench KIND={}`): {}\n\n\
         endpoints-guard `--controllers={}` against kube-controller-manager `--controllers={upstream_name}`.\n",
        kind.name(),
        kind.objects(),
        kind.name(),
    );
    let runs: Vec<&RunResult> = runs.iter().filter(|r| r.kind == kind).collect();
    let mut sizes: Vec<&str> = runs.iter().map(|r| r.size.as_str()).collect();
    sizes.dedup();
    for size in sizes {
        let of = |c| {
            runs.iter()
                .copied()
                .find(|r| r.size == size && r.controller == c)
        };
        let (ours, theirs, fast) = (
            of(Controller::Guard),
            of(Controller::Upstream),
            of(Controller::UpstreamFast),
        );
        let any = ours.or(theirs).or(fast).expect("a run of this size");
        let _ = writeln!(
            out,
            "\n## Size {size}: {} Services × {} pods (setup {:.1} s)\n",
            any.services, any.pods, any.setup_s
        );
        // Columns: each controller measured at this size, then ours over each
        // kube-controller-manager run.
        let columns: Vec<&RunResult> = [ours, theirs, fast].into_iter().flatten().collect();
        let against: Vec<&RunResult> = if ours.is_some() {
            [theirs, fast].into_iter().flatten().collect()
        } else {
            Vec::new()
        };
        let mut head = "| figure |".to_string();
        for r in &columns {
            let _ = write!(head, " {} |", r.label());
        }
        for t in &against {
            let _ = write!(head, " ours / QPS {} |", t.client_qps.unwrap_or(20));
        }
        let _ = writeln!(
            out,
            "{head}\n|{}",
            "---|".repeat(1 + columns.len() + against.len())
        );
        let num = |name: &str, f: &dyn Fn(&RunResult) -> f64, digits: usize| {
            let mut line = format!("| {name} |");
            for r in &columns {
                let _ = write!(line, " {:.*} |", digits, f(r));
            }
            for t in &against {
                let q = ours.map_or("—".into(), |o| ratio(f(o), f(t)));
                let _ = write!(line, " {q} |");
            }
            line + "\n"
        };
        out += &num("cold sync (s)", &|r| r.cold_sync_s, 2);
        out += &num("churn p50 (ms)", &|r| r.churn_p50_ms, 1);
        out += &num("churn p90 (ms)", &|r| r.churn_p90_ms, 1);
        out += &num("churn p99 (ms)", &|r| r.churn_p99_ms, 1);
        // Only endpoints-guard measures itself: "—" elsewhere, and no ratio.
        let inside = |name: &str, f: &dyn Fn(&InProcess) -> f64| {
            let mut line = format!("| {name} |");
            for r in &columns {
                match &r.in_process {
                    Some(p) => {
                        let _ = write!(line, " {:.3} |", f(p));
                    }
                    None => line.push_str(" — |"),
                }
            }
            line.push_str(&" — |".repeat(against.len()));
            line + "\n"
        };
        out += &inside(
            "churn p50 inside the process, event → write sent (ms)",
            &|p| p.sent_p50_ms,
        );
        out += &inside(
            "churn p99 inside the process, event → write sent (ms)",
            &|p| p.sent_p99_ms,
        );
        out += &inside(
            "churn p99 inside the process, event → write answered (ms)",
            &|p| p.answered_p99_ms,
        );
        out += &num("CPU, cold+churn+steady (s)", &|r| r.cpu_s, 3);
        out += &num(
            "CPU less the ghost scan's reads (estimate, s)",
            &RunResult::cpu_without_ghost_scan_s,
            2,
        );
        out += &num("peak RSS (MiB)", &|r| r.peak_rss_mb, 1);
        out += &num(
            "peak RSS without the resync process (MiB)",
            &|r| r.peak_rss_main_mb,
            1,
        );
        out += &num("peak RSS per pod (bytes)", &RunResult::rss_bytes_per_pod, 0);
        out += &num(
            &format!("{} writes (watch events)", kind.objects()),
            &|r| r.writes as f64,
            0,
        );
        out += &num("distinct changes", &|r| r.changes as f64, 0);
        out += &num(
            "writes per distinct change",
            &|r| {
                if r.changes == 0 {
                    0.0
                } else {
                    r.writes as f64 / r.changes as f64
                }
            },
            3,
        );
        out += &num("cold-sync writes per Service", &cold_writes_per_service, 3);
        out += &num("churn writes per change", &writes_per_change, 3);
        out += &num(
            "API requests",
            &|r| r.requests.values().sum::<u64>() as f64,
            0,
        );
        out += &num(
            "cold-sync API requests per s (vs client QPS)",
            &RunResult::cold_requests_per_s,
            1,
        );
        // Figures a run may not have: "—" there and in its ratios.
        let optional = |name: &str, f: &dyn Fn(&RunResult) -> Option<f64>, digits: usize| {
            let mut line = format!("| {name} |");
            for r in &columns {
                match f(r) {
                    Some(v) => {
                        let _ = write!(line, " {v:.digits$} |");
                    }
                    None => line.push_str(" — |"),
                }
            }
            for t in &against {
                let q = match (ours.and_then(f), f(t)) {
                    (Some(o), Some(t)) => ratio(o, t),
                    _ => "—".into(),
                };
                let _ = write!(line, " {q} |");
            }
            line + "\n"
        };
        out += &optional(
            "API requests per s at rest (every verb but watch)",
            &|r| r.api_requests_per_s_at_rest,
            2,
        );
        out += &optional(
            "kube-apiserver's consistency checks in steady, left out of the two rows below",
            &|r| {
                r.phases
                    .get("steady")?
                    .control_plane
                    .map(|s| f64::from(s.checks_in_window))
            },
            0,
        );
        let with_no_controller = |spend: Option<Spend>| {
            spend.map(|s| {
                let minute = s.per_minute();
                minute.apiserver_cpu_s + minute.etcd_cpu_s
            })
        };
        out += &optional(
            "kube-apiserver + etcd CPU s a minute with no controller, checks left out: the round's window, the zero of the rows below",
            &|r| with_no_controller(r.control_plane_baseline),
            3,
        );
        out += &optional(
            "the same, the window after the workload's setup",
            &|r| with_no_controller(r.control_plane_after_setup),
            3,
        );
        out += &optional(
            "kube-apiserver CPU s a minute at rest, added",
            &|r| r.apiserver_cpu_s_per_min_at_rest,
            3,
        );
        out += &optional(
            "etcd CPU s a minute at rest, added",
            &|r| r.etcd_cpu_s_per_min_at_rest,
            3,
        );
        out += &optional(
            "response KiB a minute at rest, added",
            &|r| r.response_bytes_per_min_at_rest.map(|b| b / 1024.0),
            1,
        );
        out += &optional(
            "APF seats a minute at rest",
            &|r| r.apf_seats_per_min_at_rest,
            1,
        );
        if columns.iter().any(|r| r.guard_replicas.unwrap_or(1) > 1) {
            out += &optional(
                "replicas (endpoints-guard: one leader, the rest following)",
                &|r| r.guard_replicas.map(f64::from),
                0,
            );
            out += &optional(
                "followers' own CPU s a minute at rest, together",
                &|r| r.followers_cpu_s_per_min_at_rest,
                3,
            );
        }
        out += &optional(
            "kube-apiserver + etcd CPU at rest, added, ÷ their consistency checks of the same resources",
            &RunResult::plane_cpu_over_checks,
            2,
        );
        if let (Some(o), Some(t)) = (ours, theirs) {
            out += &optional(
                "the same, ours less kube-controller-manager's (QPS 20) in this round",
                &|r| {
                    (r.controller == Controller::Guard)
                        .then(|| o.plane_cpu_over_checks_beside(t))
                        .flatten()
                },
                2,
            );
        }
        out += &optional(
            "churn p99 during a resync (ms)",
            &|r| r.churn_p99_during_resync_ms,
            1,
        );
        out += &optional(
            "churn p99 outside a resync, the same process (ms)",
            &|r| r.resync_churn()?.outside_p99_ms,
            1,
        );
        out += &optional(
            "a flip's own status write, p99 during a resync (ms)",
            &|r| r.resync_churn()?.during_flip_write_p99_ms,
            1,
        );
        out += &optional(
            "a flip's own status write, p99 outside a resync (ms)",
            &|r| r.resync_churn()?.outside_flip_write_p99_ms,
            1,
        );
        out += &optional(
            "inside the process during a resync: event → write answered, p99 (ms)",
            &|r| {
                Some(
                    r.resync_churn()?
                        .during_in_process
                        .as_ref()?
                        .answered_p99_ms,
                )
            },
            2,
        );
        let mut line = format!(
            "| ghost: its address gone after its lost DELETE, from every {} |",
            kind.objects()
        );
        for r in &columns {
            let _ = write!(line, " {} |", ghost_text(r));
        }
        line.push_str(&" — |".repeat(against.len()));
        out += &line;
        out.push('\n');
        let missed: Vec<String> = columns
            .iter()
            .map(|r| format!("{} {}", r.label(), r.churn_missed))
            .collect();
        let _ = writeln!(
            out,
            "\nChurn: {} pods/s for {} flips; missed: {}.\n",
            any.churn_rate_per_s,
            any.churn_flips,
            missed.join(", ")
        );
        if let Some(checks) = &any.consistency_check {
            out += &checks_text(checks);
        }
        out.push_str("| controller | phase | wall (s) | CPU (s) | writes | requests |\n|---|---|---|---|---|---|\n");
        for r in columns.iter().copied() {
            for name in ["cold", "churn", "steady"] {
                if let Some(p) = r.phases.get(name) {
                    let _ = writeln!(
                        out,
                        "| {} | {name} | {:.1} | {:.3}{} | {} | {} |",
                        r.label(),
                        p.wall_s,
                        p.cpu_s,
                        if p.cpu_from_ticks { " (ticks)" } else { "" },
                        p.writes,
                        requests_text(&p.requests_by_resource)
                    );
                }
            }
            if let Some(g) = &r.ghost {
                let _ = writeln!(
                    out,
                    "| {} | ghost ({}: address {}; restored in {:.1} s) | {:.1} | — | — | {} |",
                    r.label(),
                    g.pod,
                    match g.found_s {
                        Some(found) => format!("gone after {found:.1} s"),
                        None => format!("still listed after {:.0} s", g.timeout_s),
                    },
                    g.restore_s,
                    g.found_s.unwrap_or(g.timeout_s),
                    requests_text(&g.requests_by_resource)
                );
            }
            match &r.resync {
                Some(s) => {
                    let _ = writeln!(
                        out,
                        "| {} | resync (one full diff; process peak RSS {:.1} MiB) | {:.2} | {:.3}{} | — | {} |",
                        r.label(),
                        s.peak_rss_mb,
                        s.duration_s,
                        s.cpu_s,
                        if s.cpu_from_ticks { " (ticks)" } else { "" },
                        requests_text(&s.requests_by_resource)
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "| {} | resync | n/a: its informer resync replays the cache; a relist is what its cold phase shows (client-go ≥ 1.34 lists through a streaming watch, sendInitialEvents) | | | |",
                        r.label()
                    );
                }
            }
        }
        if let (Some(o), Some(t)) = (ours, theirs) {
            out.push_str("\n| target (ours / upstream) | value | verdict |\n|---|---|---|\n");
            let row = |out: &mut String, name: &str, value: String, ok: bool| {
                let _ = writeln!(out, "| {name} | {value} | {} |", verdict(ok));
            };
            let q = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
            row(
                &mut out,
                "peak RSS ≤ 0.25×",
                ratio(o.peak_rss_mb, t.peak_rss_mb),
                q(o.peak_rss_mb, t.peak_rss_mb) <= 0.25,
            );
            row(
                &mut out,
                "CPU ≤ 0.5×",
                ratio(o.cpu_s, t.cpu_s),
                q(o.cpu_s, t.cpu_s) <= 0.5,
            );
            row(
                &mut out,
                "churn p99 ≤ 1.0×",
                ratio(o.churn_p99_ms, t.churn_p99_ms),
                q(o.churn_p99_ms, t.churn_p99_ms) <= 1.0,
            );
            if let Some(p) = &o.in_process {
                row(
                    &mut out,
                    "churn p99 inside the process (event → write sent) ≤ 1 ms",
                    format!("{:.3} ms over {} writes", p.sent_p99_ms, p.samples),
                    p.sent_p99_ms <= 1.0,
                );
            }
            row(
                &mut out,
                "cold sync ≤ 1.0×",
                ratio(o.cold_sync_s, t.cold_sync_s),
                q(o.cold_sync_s, t.cold_sync_s) <= 1.0,
            );
            let wpc = writes_per_change(o);
            match kind {
                Kind::Endpoints => row(
                    &mut out,
                    "writes per distinct change = 1.0 (churn)",
                    format!("{wpc:.3}"),
                    (wpc - 1.0).abs() < 1e-9,
                ),
                Kind::EndpointSlices => {
                    let (oc, tc) = (cold_writes_per_service(o), cold_writes_per_service(t));
                    row(
                        &mut out,
                        "cold-sync slice writes per Service ≤ upstream's",
                        format!("{oc:.3} vs {tc:.3}"),
                        oc <= tc + 1e-9,
                    );
                    let tw = writes_per_change(t);
                    row(
                        &mut out,
                        "churn slice writes per change ≤ upstream's",
                        format!("{wpc:.3} vs {tw:.3}"),
                        wpc <= tw + 1e-9,
                    );
                }
            }
            if o.ghost.is_some() {
                row(
                    &mut out,
                    &format!("ghost's address gone ≤ {GHOST_TARGET_S:.0} s after its lost DELETE"),
                    ghost_text(o),
                    o.ghost_found_s.is_some_and(|s| s <= GHOST_TARGET_S),
                );
            }
            let (reads, per_s, cpu_us) = o.ghost_scan_cost().unwrap_or_default();
            let steady_lists = o
                .phases
                .get("steady")
                .and_then(|p| p.requests.get("list"))
                .copied()
                .unwrap_or(0);
            row(
                &mut out,
                "guard's steady requests: only the ghost scan's GETs, within --ghost-scan-qps, and the resync's list pages and resumed watches",
                format!(
                    "{reads} GETs, {per_s:.1}/s (budget {}/s), {cpu_us:.0} µs CPU per read; {steady_lists} lists (one resync: {}, every {} s)",
                    o.ghost_scan_qps.unwrap_or(0.0),
                    resync_requests(o.resync.as_ref(), "list"),
                    o.resync_interval_s
                        .map_or("—".to_string(), |i| format!("{i:.0}"))
                ),
                o.steady_is_only_the_scan_and_resync(),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nRequests are counted from kube-apiserver's audit log (one ServiceAccount per controller). Writes are {} watch events (ADDED, MODIFIED, DELETED) seen by an independent watch. CPU is the process's threads' time on a CPU in nanoseconds (/proc/<pid>/task/*/schedstat), or its utime + stime in 10 ms clock ticks (/proc/<pid>/stat) where a thread exited during the phase (marked \"(ticks)\"); peak RSS is VmHWM. \"Inside the process\" figures are endpoints-guard's `endpoints_guard_event_to_write_seconds` and `_answered_seconds` histograms over churn alone (scraped before and after): from the watch event's arrival to the first write of the reconcile it queued being sent, and to that write's answer; interpolated inside buckets about 19 % wide, as `histogram_quantile` does.",
        kind.objects()
    );
    let _ = writeln!(
        out,
        "\nAPI requests per s at rest count every verb but watch: kube-controller-manager's in the steady phase over its length; endpoints-guard's likewise, but with its list requests in steady (the periodic resync's pages) replaced by one full resync's list requests (the resync phase's) divided by its `--resync-interval` in this run. The ghost figure is the time from the force-delete of a pod whose DELETE etcd-fault-proxy kept from kube-apiserver's watch cache until an independent watch saw its address in none of the {}; \"not within N s\" is a run that waited N s in vain, \"not measured\" one without the ghost phase.",
        kind.objects()
    );
    out
}

/// A CDF of each controller's churn latencies, log-scaled x axis.
pub fn cdf_svg(kind: Kind, size: &str, series: &[(Controller, Vec<f64>)]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 440.0, 70.0, 20.0, 40.0, 50.0);
    let all = series.iter().flat_map(|(_, v)| v.iter().copied());
    let min = all.clone().fold(f64::INFINITY, f64::min).max(0.1);
    let max = all.fold(0.0, f64::max).max(min * 10.0);
    let (lo, hi) = (min.log10().floor(), max.log10().ceil());
    let x = |ms: f64| left + (ms.max(10f64.powf(lo)).log10() - lo) / (hi - lo) * (w - left - right);
    let y = |f: f64| top + (1.0 - f) * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">Churn latency CDF, size {size} (pod status write → {} change)</text>\n",
        w / 2.0,
        kind.objects()
    );
    let mut decade = lo;
    while decade <= hi {
        let ms = 10f64.powf(decade);
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{ms} ms</text>",
            x(ms),
            h - bottom,
            h - bottom + 18.0
        );
        decade += 1.0;
    }
    for f in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#eee\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{f}</text>",
            y(f),
            w - right,
            left - 6.0,
            y(f) + 4.0
        );
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    for (i, (controller, values)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let n = values.len().max(1) as f64;
        let mut points = String::new();
        let mut prev = 0.0;
        for (k, v) in values.iter().enumerate() {
            let _ = write!(
                points,
                "{:.1},{:.1} {:.1},{:.1} ",
                x(*v),
                y(prev),
                x(*v),
                y((k + 1) as f64 / n)
            );
            prev = (k + 1) as f64 / n;
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{points}\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"{color}\">{} (n={}, p50 {:.1} ms, p99 {:.1} ms)</text>",
            left + 10.0,
            top + 16.0 + 16.0 * i as f64,
            controller.name(),
            values.len(),
            percentile(values, 50.0),
            percentile(values, 99.0)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">latency (ms, log scale)</text>\n</svg>",
        w / 2.0,
        h - 8.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn steady(wall_s: f64, requests: &[(&str, u64)]) -> Phase {
        Phase {
            wall_s,
            requests: counts(requests),
            ..Phase::default()
        }
    }

    /// A resync's requests: its list pages, its GETs, and the three watches
    /// it resumes after the lists.
    fn resync(lists: u64, gets: u64) -> Resync {
        Resync {
            requests: counts(&[("list", lists), ("get", gets), ("watch", 3)]),
            ..Resync::default()
        }
    }

    #[test]
    fn at_rest_the_guard_pays_one_resync_per_interval_not_the_windows() {
        // 60 s holding 300 scan reads, a watch and one resync's 6 pages; a
        // resync is 6 pages (its one GET is the scan's) every 120 s.
        let window = steady(60.0, &[("get", 300), ("watch", 1), ("list", 6)]);
        let rate = requests_per_s_at_rest(
            Controller::Guard,
            Some(&window),
            Some(&resync(6, 1)),
            Some(120.0),
            None,
        );
        assert_eq!(rate, Some(300.0 / 60.0 + 6.0 / 120.0));
        // A window without the resync: the same rate.
        let quiet = steady(60.0, &[("get", 300)]);
        assert_eq!(
            requests_per_s_at_rest(
                Controller::Guard,
                Some(&quiet),
                Some(&resync(6, 1)),
                Some(120.0),
                None
            ),
            rate
        );
        // Resync off: the window as it is.
        assert_eq!(
            requests_per_s_at_rest(Controller::Guard, Some(&window), None, Some(0.0), None),
            Some(306.0 / 60.0)
        );
        // Count checks every 120 s, a full resync every 1,200 s: steady's
        // checks (two lists per resource) as they are, the full lists spread.
        let checks = steady(60.0, &[("get", 300), ("list", 4)]);
        assert_eq!(
            requests_per_s_at_rest(
                Controller::Guard,
                Some(&checks),
                Some(&resync(6, 1)),
                Some(120.0),
                Some(1200.0)
            ),
            Some(304.0 / 60.0 + 6.0 / 1200.0)
        );
        // No resync measured: no figure.
        assert_eq!(
            requests_per_s_at_rest(Controller::Guard, Some(&window), None, Some(120.0), None),
            None
        );
    }

    #[test]
    fn at_rest_upstream_is_its_steady_rate_without_watches() {
        let window = steady(60.0, &[("watch", 2), ("get", 3), ("update", 3)]);
        for c in [Controller::Upstream, Controller::UpstreamFast] {
            assert_eq!(
                requests_per_s_at_rest(c, Some(&window), None, None, None),
                Some(0.1)
            );
        }
        assert_eq!(
            requests_per_s_at_rest(Controller::Upstream, None, None, None, None),
            None
        );
        let empty = steady(0.0, &[]);
        assert_eq!(
            requests_per_s_at_rest(Controller::Upstream, Some(&empty), None, None, None),
            None
        );
    }

    fn run(controller: Controller, ghost: Option<Ghost>) -> RunResult {
        let mut phases = BTreeMap::new();
        phases.insert(
            "steady".to_string(),
            steady(60.0, &[("get", 300), ("list", 6)]),
        );
        run_of(controller, ghost, phases)
    }

    fn run_of(
        controller: Controller,
        ghost: Option<Ghost>,
        phases: BTreeMap<String, Phase>,
    ) -> RunResult {
        let guard = controller == Controller::Guard;
        assemble(Parts {
            size: &BenchOptions::new(
                super::super::BenchSize {
                    name: "S".into(),
                    services: 1,
                    pods_per_service: 1,
                    services_per_namespace: 1,
                },
                "endpoints-guard".into(),
                "out".into(),
            ),
            kind: Kind::Endpoints,
            controller,
            setup_s: 0.0,
            cold_sync_s: 1.0,
            latencies: &[],
            flips: 0,
            failed: 0,
            missed: 0,
            peak_rss_main_mb: 1.0,
            phases,
            resync: guard.then(|| resync(6, 0)),
            ghost_scan_qps: guard.then_some(5.0),
            resync_interval: guard.then_some(std::time::Duration::from_secs(120)),
            full_resync_interval: None,
            ghost,
            client_qps: (!guard).then_some(20),
            in_process: None,
            baseline: Spend::default(),
            setup_baseline: Spend::default(),
            consistency_check: None,
            guard_replicas: guard.then_some(1),
            followers_cpu_s_per_min_at_rest: None,
        })
    }

    fn spend(window_s: f64, apiserver_cpu_s: f64, etcd_cpu_s: f64) -> Spend {
        Spend {
            window_s,
            apiserver_cpu_s,
            etcd_cpu_s,
            ..Spend::default()
        }
    }

    #[test]
    fn the_rounds_window_replaces_the_one_after_setup_as_the_zero() {
        let mut phases = BTreeMap::new();
        let mut steady_phase = steady(360.0, &[("get", 300)]);
        steady_phase.control_plane = Some(spend(360.0, 12.0, 6.0));
        phases.insert("steady".to_string(), steady_phase);
        // Steady spent 2 + 1 CPU-s a minute; so did the window after setup.
        let mut run = run_of(Controller::Upstream, None, phases);
        assert_eq!(run.control_plane_after_setup, Some(Spend::default()));
        run.measure_at_rest(spend(480.0, 16.0, 8.0));
        assert_eq!(run.apiserver_cpu_s_per_min_at_rest, Some(0.0));
        assert_eq!(run.etcd_cpu_s_per_min_at_rest, Some(0.0));
        // The round's quieter window: what the controller added grows.
        run.measure_at_rest(spend(360.0, 9.0, 3.0));
        assert_eq!(run.apiserver_cpu_s_per_min_at_rest, Some(0.5));
        assert_eq!(run.etcd_cpu_s_per_min_at_rest, Some(0.5));
        assert_eq!(run.control_plane_baseline, Some(spend(360.0, 9.0, 3.0)));
    }

    #[test]
    fn ours_less_upstreams_needs_no_window_with_no_controller() {
        let with_steady = |controller, apiserver_cpu_s, etcd_cpu_s| {
            let mut phases = BTreeMap::new();
            let mut steady_phase = steady(360.0, &[]);
            steady_phase.control_plane = Some(spend(360.0, apiserver_cpu_s, etcd_cpu_s));
            phases.insert("steady".to_string(), steady_phase);
            let mut run = run_of(controller, None, phases);
            run.consistency_check_cpu_s_per_min = Some(0.5);
            run
        };
        // Ours 3 CPU-s a minute, upstream's 2.5: 0.5 more, one checks' worth,
        // whichever window with no controller both are measured against.
        let (mut ours, mut theirs) = (
            with_steady(Controller::Guard, 12.0, 6.0),
            with_steady(Controller::Upstream, 10.0, 5.0),
        );
        for zero in [spend(360.0, 9.0, 3.0), spend(480.0, 16.0, 8.0)] {
            ours.measure_at_rest(zero);
            theirs.measure_at_rest(zero);
            let beside = ours.plane_cpu_over_checks_beside(&theirs);
            assert!(beside.is_some_and(|q| (q - 1.0).abs() < 1e-9), "{beside:?}");
        }
        theirs.apiserver_cpu_s_per_min_at_rest = None;
        assert_eq!(ours.plane_cpu_over_checks_beside(&theirs), None);
    }

    fn ghost(found_s: Option<f64>) -> Ghost {
        Ghost {
            pod: "bench-0/svc-0-pod-9".into(),
            timeout_s: 660.0,
            found_s,
            ..Ghost::default()
        }
    }

    #[test]
    fn a_ghost_never_found_is_not_a_ghost_not_looked_for() {
        let found = run(Controller::Guard, Some(ghost(Some(130.5))));
        let never = run(Controller::Upstream, Some(ghost(None)));
        let skipped = run(Controller::UpstreamFast, None);
        assert_eq!(found.ghost_found_s, Some(130.5));
        assert_eq!(never.ghost_found_s, None);
        assert_eq!(skipped.ghost_found_s, None);
        assert_eq!(ghost_text(&found), "130.5 s");
        assert_eq!(ghost_text(&never), "not within 660 s");
        assert_eq!(ghost_text(&skipped), "not measured");
        // The JSON keeps the difference.
        for r in [&found, &never, &skipped] {
            let back: RunResult =
                serde_json::from_str(&serde_json::to_string(r).unwrap_or_default())
                    .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back.ghost, r.ghost);
            assert_eq!(ghost_text(&back), ghost_text(r));
        }
        let md = markdown(Kind::Endpoints, &[found, never, skipped]);
        assert!(
            md.contains("| 130.5 s | not within 660 s | not measured | — | — |"),
            "{md}"
        );
        assert!(
            md.contains("| ghost's address gone ≤ 600 s after its lost DELETE | 130.5 s | met |"),
            "{md}"
        );
        // Ours: 300 reads over 60 s, the window's 6 pages replaced by 6
        // every 120 s; theirs: everything but watches over 60 s.
        assert!(
            md.contains("| API requests per s at rest (every verb but watch) | 5.05 | 5.10 | 5.10 | 0.99× | 0.99× |"),
            "{md}"
        );
    }

    #[test]
    fn reports_from_before_the_ghost_phase_still_read() {
        let mut old = serde_json::to_value(run(Controller::Guard, None)).unwrap_or_default();
        for field in [
            "ghost",
            "ghost_found_s",
            "api_requests_per_s_at_rest",
            "resync_interval_s",
        ] {
            old.as_object_mut().map(|o| o.remove(field));
        }
        let back: RunResult = serde_json::from_value(old).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ghost_text(&back), "not measured");
        assert_eq!(back.api_requests_per_s_at_rest, None);
    }

    #[test]
    fn the_followers_start_and_the_settling_stay_out_of_the_runs_totals() {
        let mut phases = BTreeMap::new();
        phases.insert("steady".to_string(), steady(60.0, &[("get", 300)]));
        let mut start = steady(20.0, &[("list", 40), ("watch", 3)]);
        start.cpu_s = 2.0;
        phases.insert(FOLLOWERS_PHASE.to_string(), start);
        let mut settle = steady(60.0, &[("get", 300)]);
        settle.cpu_s = 0.5;
        phases.insert(SETTLE_PHASE.to_string(), settle);
        let replicated = run_of(Controller::Guard, None, phases);
        assert_eq!(replicated.requests, counts(&[("get", 300)]));
        assert_eq!(replicated.cpu_s, 0.0);
        assert!(replicated.phases.contains_key(FOLLOWERS_PHASE));
        assert!(replicated.phases.contains_key(SETTLE_PHASE));
    }

    #[test]
    fn steady_may_hold_the_resyncs_pages_but_no_more() {
        let ours = run(Controller::Guard, None);
        assert!(ours.steady_is_only_the_scan_and_resync());
        let mut resumed = ours.clone();
        resumed.phases.insert(
            "steady".into(),
            steady(60.0, &[("get", 300), ("list", 6), ("watch", 3)]),
        );
        assert!(resumed.steady_is_only_the_scan_and_resync());
        let mut restarts = ours.clone();
        restarts.phases.insert(
            "steady".into(),
            steady(60.0, &[("get", 300), ("list", 6), ("watch", 4)]),
        );
        assert!(!restarts.steady_is_only_the_scan_and_resync());
        let mut more = ours.clone();
        more.phases
            .insert("steady".into(), steady(60.0, &[("get", 300), ("list", 13)]));
        assert!(!more.steady_is_only_the_scan_and_resync());
        let mut writes = ours.clone();
        writes.phases.insert(
            "steady".into(),
            steady(60.0, &[("get", 300), ("update", 1)]),
        );
        assert!(!writes.steady_is_only_the_scan_and_resync());
        let mut reads = ours.clone();
        reads
            .phases
            .insert("steady".into(), steady(60.0, &[("get", 400)]));
        assert!(!reads.steady_is_only_the_scan_and_resync());
        // Replicas electing a leader: the Lease's reads and renewals are
        // neither the scan's nor the resync's, and count for neither.
        let mut elected = ours;
        let mut with_lease = steady(60.0, &[("get", 400), ("list", 6), ("update", 12)]);
        with_lease.requests_by_resource = counts(&[("get leases", 100), ("update leases", 12)]);
        elected.phases.insert("steady".into(), with_lease.clone());
        assert!(elected.steady_is_only_the_scan_and_resync());
        with_lease.requests_by_resource = counts(&[("get leases", 100), ("update leases", 11)]);
        elected.phases.insert("steady".into(), with_lease);
        assert!(!elected.steady_is_only_the_scan_and_resync());
    }
}
