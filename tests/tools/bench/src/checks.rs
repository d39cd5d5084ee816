//! What kube-apiserver's own consistency check of its watch caches costs
//! (`DetectCacheInconsistency`): the floor endpoints-guard's ghost
//! detection is measured against.
//!
//! kube-apiserver checks each cached resource on its own clock, every 5 to
//! 7.5 minutes from its start: it lists the watch cache, lists etcd at the
//! same resourceVersion in pages of 10,000, and compares digests. Turning
//! the check off and comparing two windows would bury a check's cost in
//! the windows' noise (seconds of CPU against fractions of one), so the
//! check is timed instead. kube-apiserver logs each check that passed or
//! failed at verbosity 3 ([`APISERVER_ARGS`] raise it for the checker's
//! file alone) and each that ended in an error at any verbosity, and [`Trace`] samples kube-apiserver's and etcd's CPU every
//! [`SAMPLE_EVERY`]. A check's cost ([`attribute`]) is the CPU above the
//! idle rate in the sample holding its log line and the busy samples just
//! before it; a minute's cost is each checked resource's mean per check
//! over the mean period between checks ([`MEAN_PERIOD_S`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use eg_harness::ControlPlane;
use eg_workload::procstat::CpuSample;

/// The resources whose checks are the floor: what the controllers watch.
/// (group, resource) as kube-apiserver logs them.
pub const CHECKED: [(&str, &str); 5] = [
    ("", "pods"),
    ("", "services"),
    ("", "endpoints"),
    ("discovery.k8s.io", "endpointslices"),
    ("", "nodes"),
];

/// kube-apiserver flags that log every finished check: verbosity 3 for the
/// checker's source file only (`consistency/checker.go` from 1.37,
/// `cacher/delegator.go` before).
pub const APISERVER_ARGS: [&str; 1] = ["--vmodule=checker=3,delegator=3"];

/// The mean time between two checks of one resource: a 5-minute period
/// with up to 50 % added at random.
pub const MEAN_PERIOD_S: f64 = 375.0;

/// The longest time between two checks of one resource, and from
/// kube-apiserver's start to the first: a window this long, plus the
/// checks' own time, holds at least one check of every resource.
pub const LONGEST_GAP: Duration = Duration::from_secs(450);

/// How often [`Trace`] samples kube-apiserver's and etcd's CPU.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// How far before its log line a check's busy samples may reach.
const LOOKBACK_S: f64 = 30.0;

/// What kube-apiserver's consistency checks cost over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckCost {
    pub window_s: f64,
    /// kube-apiserver's and etcd's idle CPU rate, seconds a second, that a
    /// check's samples are measured against.
    pub idle_cpu_s_per_s: f64,
    /// By `group/resource` (`core/pods`), every resource checked in the window.
    pub resources: BTreeMap<String, ResourceChecks>,
    /// kube-apiserver + etcd CPU seconds a minute that checking [`CHECKED`]
    /// costs: each one's mean per check over [`MEAN_PERIOD_S`]. None when
    /// one of them had no check in the window.
    pub cpu_s_per_min: Option<f64>,
}

/// One resource's checks in the window, and their cost in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceChecks {
    /// Every check that ended, those that ended in an error included.
    pub checks: u32,
    /// Checks that ended in an error before comparing: the cache not ready,
    /// or etcd refusing the list at the cache's resourceVersion (compacted
    /// away: with `--etcd-compaction-interval` as short as a minute, a
    /// resource no one writes to has its cache's resourceVersion compacted).
    #[serde(default)]
    pub errors: u32,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
}

impl ResourceChecks {
    /// kube-apiserver + etcd CPU seconds of one check, on average.
    pub fn cpu_s_per_check(&self) -> f64 {
        if self.checks == 0 {
            0.0
        } else {
            (self.apiserver_cpu_s + self.etcd_cpu_s) / f64::from(self.checks)
        }
    }
}

/// kube-apiserver's and etcd's CPU over one sampling interval ending at `at_s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuStep {
    /// Seconds since the Unix epoch.
    pub at_s: f64,
    pub dt_s: f64,
    pub apiserver_s: f64,
    pub etcd_s: f64,
}

impl CpuStep {
    fn rate(&self) -> f64 {
        (self.apiserver_s + self.etcd_s) / self.dt_s
    }
}

/// A check kube-apiserver logged as ended: passed or failed (both did the
/// work), or ended in an error partway.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckDone {
    /// Seconds since the Unix epoch.
    pub at_s: f64,
    /// `group/resource`, the core group as `core`.
    pub resource: String,
    pub erred: bool,
}

/// The name a resource goes by in [`CheckCost::resources`].
pub fn resource_name(group: &str, resource: &str) -> String {
    let group = if group.is_empty() { "core" } else { group };
    format!("{group}/{resource}")
}

/// The checks that ended in a kube-apiserver log (klog's text format, in
/// UTC). klog's header has no year: each line's time of day is placed on
/// the day that brings it nearest `near_s`.
pub fn parse_checks(log: &str, near_s: f64) -> Vec<CheckDone> {
    log.lines()
        .filter_map(|line| {
            let erred = if line.contains("\"Cache consistency check passed\"")
                || line.contains("\"Cache consistency check failed\"")
            {
                false
            } else if line.contains("\"Cache consistency check error\"") {
                true
            } else {
                return None;
            };
            let at_s = klog_time(line, near_s)?;
            let group = quoted_value(line, "group")?;
            let resource = quoted_value(line, "resource")?;
            Some(CheckDone {
                at_s,
                resource: resource_name(group, resource),
                erred,
            })
        })
        .collect()
}

/// The time of a klog line (`I1129 23:01:02.123456 ...`) in seconds since
/// the Unix epoch, on the day nearest `near_s`.
fn klog_time(line: &str, near_s: f64) -> Option<f64> {
    let clock = line.get(6..21)?;
    let (hms, micros) = clock.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<u32>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    let of_day = f64::from(h * 3600 + m * 60 + s) + micros.parse::<f64>().ok()? / 1e6;
    const DAY: f64 = 86_400.0;
    let midnight = (near_s / DAY).floor() * DAY;
    [midnight - DAY, midnight, midnight + DAY]
        .into_iter()
        .map(|day| day + of_day)
        .min_by(|a, b| (a - near_s).abs().total_cmp(&(b - near_s).abs()))
}

/// The value of `key="value"` in a structured klog line.
fn quoted_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}=\""))? + key.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// The median of `values` (0 when empty).
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What `checks` cost, from the CPU `steps` over the same window.
///
/// The idle rate is the median of the steps no check is near. A check
/// claims the step holding its log line and, going back, each step busier
/// than idle plus four median deviations, up to [`LOOKBACK_S`] or another
/// check's claim. A claimed step's CPU above the idle rate goes to its
/// claimants in equal parts.
pub fn attribute(steps: &[CpuStep], checks: &[CheckDone], window_s: f64) -> CheckCost {
    let holding = |at_s: f64| {
        steps
            .iter()
            .position(|s| s.at_s - s.dt_s < at_s && at_s <= s.at_s)
    };
    let near_check = |step: &CpuStep| {
        checks
            .iter()
            .any(|c| step.at_s > c.at_s - LOOKBACK_S && step.at_s - step.dt_s < c.at_s + 1.0)
    };
    let quiet: Vec<&CpuStep> = steps.iter().filter(|s| !near_check(s)).collect();
    let idle_api = median(quiet.iter().map(|s| s.apiserver_s / s.dt_s).collect());
    let idle_etcd = median(quiet.iter().map(|s| s.etcd_s / s.dt_s).collect());
    let idle = idle_api + idle_etcd;
    let deviation = median(quiet.iter().map(|s| (s.rate() - idle).abs()).collect());
    // At least 5 % of a core above idle: a quiet stretch's median deviation
    // can be nil.
    let busy = idle + (4.0 * deviation).max(0.05);
    // Which checks claim each step.
    let mut claims: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    let mut ends: Vec<(usize, usize)> = checks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| holding(c.at_s).map(|step| (i, step)))
        .collect();
    ends.sort_by_key(|&(_, step)| step);
    let mut claimed_up_to = 0;
    for &(check, end) in &ends {
        claims[end].push(check);
        let earliest = checks[check].at_s - LOOKBACK_S;
        let mut step = end;
        while step > claimed_up_to
            && steps[step - 1].at_s > earliest
            && steps[step - 1].rate() > busy
            && claims[step - 1].is_empty()
        {
            step -= 1;
            claims[step].push(check);
        }
        claimed_up_to = end + 1;
    }
    let mut resources: BTreeMap<String, ResourceChecks> = BTreeMap::new();
    for (check, _) in &ends {
        let check = &checks[*check];
        let entry = resources.entry(check.resource.clone()).or_default();
        entry.checks += 1;
        entry.errors += u32::from(check.erred);
    }
    for (step, claimants) in steps.iter().zip(&claims) {
        if claimants.is_empty() {
            continue;
        }
        let share = claimants.len() as f64;
        let api = (step.apiserver_s - idle_api * step.dt_s) / share;
        let etcd = (step.etcd_s - idle_etcd * step.dt_s) / share;
        for &check in claimants {
            let entry = resources.entry(checks[check].resource.clone()).or_default();
            entry.apiserver_cpu_s += api;
            entry.etcd_cpu_s += etcd;
        }
    }
    let cpu_s_per_min = CHECKED
        .iter()
        .map(|(group, resource)| {
            resources
                .get(&resource_name(group, resource))
                .map(|r| r.cpu_s_per_check() * 60.0 / MEAN_PERIOD_S)
        })
        .sum::<Option<f64>>();
    CheckCost {
        window_s,
        idle_cpu_s_per_s: idle,
        resources,
        cpu_s_per_min,
    }
}

/// kube-apiserver's and etcd's CPU, sampled every [`SAMPLE_EVERY`] in the
/// background until [`Trace::finish`].
pub struct Trace {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<Vec<CpuStep>>>,
}

fn now_s() -> f64 {
    epoch_s(SystemTime::now())
}

/// kube-apiserver's and etcd's CPU samples now.
fn sample(apiserver: u32, etcd: &[u32]) -> Result<(CpuSample, Vec<CpuSample>)> {
    let etcd = etcd
        .iter()
        .map(|&pid| CpuSample::read(pid))
        .collect::<Result<Vec<_>>>()?;
    Ok((CpuSample::read(apiserver)?, etcd))
}

impl Trace {
    /// Starts sampling the control plane's kube-apiserver and etcd members.
    pub fn start(cp: &ControlPlane) -> Result<Self> {
        let apiserver = cp
            .apiserver_pid()
            .context("kube-apiserver is not running")?;
        let etcd = cp.etcd_pids();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let mut last = sample(apiserver, &etcd)?;
        let mut last_at = now_s();
        let task = tokio::spawn(async move {
            let mut steps = Vec::new();
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok(steps),
                    _ = tick.tick() => {}
                }
                let at_s = now_s();
                let now =
                    sample(apiserver, &etcd).context("sampling kube-apiserver's and etcd's CPU")?;
                steps.push(CpuStep {
                    at_s,
                    dt_s: at_s - last_at,
                    apiserver_s: now.0.since(&last.0).0,
                    etcd_s: now.1.iter().zip(&last.1).map(|(n, l)| n.since(l).0).sum(),
                });
                (last, last_at) = (now, at_s);
            }
        });
        Ok(Self { stop, task })
    }

    /// Stops sampling; what the checks logged in `apiserver_log` meanwhile cost.
    pub async fn finish(self, apiserver_log: &std::path::Path, window_s: f64) -> Result<CheckCost> {
        // A task that already ended on an error has dropped the receiver.
        let _ = self.stop.send(());
        let steps = self.task.await.context("the CPU sampling task")??;
        let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
            anyhow::bail!("no CPU samples of kube-apiserver and etcd");
        };
        let (from, to) = (first.at_s - first.dt_s, last.at_s);
        let checks = ended_between(apiserver_log, from, to)?;
        Ok(attribute(&steps, &checks, window_s))
    }
}

/// The checks `apiserver_log` shows ended after `from_s` and by `to_s`
/// (seconds since the Unix epoch).
pub fn ended_between(
    apiserver_log: &std::path::Path,
    from_s: f64,
    to_s: f64,
) -> Result<Vec<CheckDone>> {
    Ok(between(&read_checks(apiserver_log, to_s)?, from_s, to_s))
}

/// Every check `apiserver_log` shows ended, its lines placed on the day
/// nearest `near_s` ([`parse_checks`]).
pub fn read_checks(apiserver_log: &std::path::Path, near_s: f64) -> Result<Vec<CheckDone>> {
    let log = std::fs::read(apiserver_log)
        .with_context(|| format!("reading {}", apiserver_log.display()))?;
    Ok(parse_checks(&String::from_utf8_lossy(&log), near_s))
}

/// The `checks` that ended after `from_s` and by `to_s`.
pub fn between(checks: &[CheckDone], from_s: f64, to_s: f64) -> Vec<CheckDone> {
    checks
        .iter()
        .filter(|c| c.at_s > from_s && c.at_s <= to_s)
        .cloned()
        .collect()
}

/// `at` in seconds since the Unix epoch (0 before it).
pub fn epoch_s(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;
