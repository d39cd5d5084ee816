//! Resource use of the endpoints-guard process over time, from /proc/<pid>
//! and its /metrics, and the flat-slope test over the last two thirds.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, anyhow};
use serde::Serialize;

use eg_workload::metrics::sample_sum;

/// One sample, `t` seconds after the workload started.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t: f64,
    /// VmRSS, MiB.
    pub rss_mib: f64,
    /// utime + stime so far, seconds.
    pub cpu_seconds: f64,
    /// CPU use since the previous sample, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Entries of /proc/<pid>/fd.
    pub fds: f64,
    /// `Threads:` of /proc/<pid>/status (endpoints-guard exports no tokio
    /// task gauge; its tasks run on these threads).
    pub threads: f64,
    /// `endpoints_guard_cache_objects` by resource.
    pub cache_objects: BTreeMap<String, f64>,
    /// `endpoints_guard_cache_tombstones`, all resources.
    pub tombstones: f64,
    /// `endpoints_guard_queue_depth`, all controllers.
    pub queue_depth: f64,
}

impl Sample {
    pub fn cache_total(&self) -> f64 {
        self.cache_objects.values().sum()
    }
}

fn status_field(pid: u32, field: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("{path}: no {field}"))
}

/// Reads /proc/<pid> and scrapes `metrics` (the /metrics text).
pub fn sample(pid: u32, t: f64, metrics: &str, previous: Option<&Sample>) -> Result<Sample> {
    let rss_mib = status_field(pid, "VmRSS:")? / 1024.0;
    let threads = status_field(pid, "Threads:")?;
    let cpu_seconds = eg_workload::procstat::cpu_seconds(pid)?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as f64;
    let cpu_cores = match previous {
        Some(p) if t > p.t => (cpu_seconds - p.cpu_seconds) / (t - p.t),
        _ => 0.0,
    };
    // Every `endpoints_guard_cache_objects{...resource="x"...} v` line, summed by resource.
    let mut cache_objects: BTreeMap<String, f64> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("endpoints_guard_cache_objects{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let resource = labels
            .split(',')
            .find_map(|l| l.strip_prefix("resource=\""))
            .map(|r| r.trim_end_matches(['}', '"']).to_string())
            .unwrap_or_default();
        if let Ok(v) = value.parse::<f64>() {
            *cache_objects.entry(resource).or_default() += v;
        }
    }
    Ok(Sample {
        t,
        rss_mib,
        cpu_seconds,
        cpu_cores,
        fds,
        threads,
        cache_objects,
        tombstones: sample_sum(metrics, "endpoints_guard_cache_tombstones").unwrap_or(0.0),
        queue_depth: sample_sum(metrics, "endpoints_guard_queue_depth").unwrap_or(0.0),
    })
}

/// Least-squares slope of `ys` over `xs` (per unit of x); 0 for fewer than
/// two distinct x.
pub fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len().min(ys.len());
    if n < 2 {
        return 0.0;
    }
    let mx = xs[..n].iter().sum::<f64>() / n as f64;
    let my = ys[..n].iter().sum::<f64>() / n as f64;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for i in 0..n {
        sxy += (xs[i] - mx) * (ys[i] - my);
        sxx += (xs[i] - mx) * (xs[i] - mx);
    }
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// The verdict on one series over the last two thirds of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Trend {
    pub series: String,
    pub unit: String,
    /// Mean over the window.
    pub mean: f64,
    /// Least-squares slope, units per hour.
    pub slope_per_hour: f64,
    /// The fitted growth over the window (slope × window length).
    pub growth: f64,
    /// The most growth allowed over the window.
    pub allowed: f64,
    pub flat: bool,
}

/// The flat-slope criterion. Over the samples of the last two thirds of the
/// run, a least-squares line is fitted to each series; the series is flat
/// when the growth that line predicts over the window (slope × window length)
/// is at most:
/// - RSS: max(4 MiB, 5% of its mean over the window);
/// - open file descriptors: max(8, 20% of the mean) (watch connections are
///   cut every 30 s and come back; a leak of one per fault is still caught);
/// - threads: 2 (tokio's worker threads are fixed; blocking threads come and go);
/// - cached objects (all resources): max(20, 5% of the mean) — the workload
///   holds its sizes near fixed targets, so the cache must too;
/// - tombstones: max(20, 2% of the cached objects' mean) — deletion candidates
///   must be confirmed and dropped, not pile up.
///
/// A leak as small as the allowed growth per window is caught: in a 30-minute
/// run (20-minute window) 4 MiB is 12 MiB/hour.
///
/// Runs shorter than 10 minutes (the 3-minute form in `make test`) are still
/// warming up over most of their window (the allocator's high-water mark
/// rises with the first relists after a restart), so there the RSS
/// allowance is max(12 MiB, 25% of the mean) and the fds' max(12, 50% of
/// the mean): checks for gross leaks only.
pub fn trends(samples: &[Sample], run_seconds: f64) -> Vec<Trend> {
    let short = run_seconds < 600.0;
    let from = run_seconds / 3.0;
    let window: Vec<&Sample> = samples.iter().filter(|s| s.t >= from).collect();
    let xs: Vec<f64> = window.iter().map(|s| s.t).collect();
    let length = match (xs.first(), xs.last()) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    let cache_mean = mean(&window.iter().map(|s| s.cache_total()).collect::<Vec<_>>());
    // (name, unit, value, floor, share of the mean)
    type Series<'a> = (&'a str, &'a str, fn(&Sample) -> f64, f64, f64);
    let series: [Series; 5] = [
        (
            "rss",
            "MiB",
            |s| s.rss_mib,
            if short { 12.0 } else { 4.0 },
            if short { 0.25 } else { 0.05 },
        ),
        (
            "open fds",
            "fds",
            |s| s.fds,
            if short { 12.0 } else { 8.0 },
            if short { 0.5 } else { 0.2 },
        ),
        ("threads", "threads", |s| s.threads, 2.0, 0.0),
        ("cached objects", "objects", |s| s.cache_total(), 20.0, 0.05),
        ("tombstones", "objects", |s| s.tombstones, 20.0, 0.0),
    ];
    series
        .iter()
        .map(|(name, unit, get, floor, share)| {
            let ys: Vec<f64> = window.iter().map(|s| get(s)).collect();
            let m = mean(&ys);
            let per_second = slope(&xs, &ys);
            let growth = per_second * length;
            let allowed = if *name == "tombstones" {
                floor.max(0.02 * cache_mean)
            } else {
                floor.max(share * m)
            };
            Trend {
                series: name.to_string(),
                unit: unit.to_string(),
                mean: m,
                slope_per_hour: per_second * 3600.0,
                growth,
                allowed,
                flat: growth <= allowed,
            }
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_noise() {
        let xs = [0.0, 10.0, 20.0, 30.0];
        assert!((slope(&xs, &[1.0, 2.0, 3.0, 4.0]) - 0.1).abs() < 1e-9);
        assert_eq!(slope(&xs, &[5.0, 5.0, 5.0, 5.0]), 0.0);
        assert_eq!(slope(&[1.0], &[1.0]), 0.0);
    }

    #[test]
    fn a_leak_is_not_flat_and_a_plateau_is() {
        let make = |rss: f64, t: f64| Sample {
            t,
            rss_mib: rss,
            cpu_seconds: 0.0,
            cpu_cores: 0.0,
            fds: 20.0,
            threads: 6.0,
            cache_objects: BTreeMap::from([("pods".to_string(), 1000.0)]),
            tombstones: 0.0,
            queue_depth: 0.0,
        };
        // 30 MiB, growing 1 MiB/minute: 20 MiB over the last 20 minutes.
        let leak: Vec<Sample> = (0..180)
            .map(|i| make(30.0 + i as f64 / 6.0, i as f64 * 10.0))
            .collect();
        let rss = &trends(&leak, 1800.0)[0];
        assert!(!rss.flat, "{rss:?}");
        // A step up early, then flat with noise.
        let plateau: Vec<Sample> = (0..180)
            .map(|i| {
                let base = if i < 30 { 30.0 } else { 40.0 };
                make(base + (i % 3) as f64, i as f64 * 10.0)
            })
            .collect();
        assert!(trends(&plateau, 1800.0).iter().all(|t| t.flat));
    }
}
