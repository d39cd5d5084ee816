//! target/soak/report.json, report.md and soak.svg (RSS, cached objects and
//! tombstones over time, the faults marked), written by hand.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::stats::{Sample, Trend};
use super::workload::{OpCounts, WorkloadSize};

/// One fault of the schedule and what followed it.
#[derive(Debug, Clone, Serialize)]
pub struct Episode {
    pub fault: String,
    /// Seconds after the workload started.
    pub started: f64,
    /// When the fault was cleared (its window ended).
    pub ended: f64,
    /// Converged within the budget after `ended`.
    pub converged: bool,
    /// From `ended` to the first pass of the oracle that found nothing wrong
    /// (`None`: not within twice the budget).
    pub converge_seconds: Option<f64>,
    /// The most the convergence may take (one resync interval + slack, or
    /// more where the fault says why).
    pub budget_seconds: f64,
    /// Spurious deletions first seen after this fault began.
    pub spurious: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub passed: bool,
    pub failures: Vec<String>,
    pub duration_seconds: f64,
    pub resync_interval_seconds: f64,
    /// The most a convergence may take after a fault ends.
    pub convergence_budget_seconds: f64,
    pub guard_binary: String,
    pub workload: WorkloadSize,
    pub operations: OpCounts,
    pub etcd_compactions: u64,
    pub stream_cuts: u64,
    /// Pod watches watch-chaos served in protobuf: the faults reached the
    /// decoder endpoints-guard runs in production.
    pub protobuf_pod_watches: u64,
    /// `uptime` at the start and at the end (the machine is shared).
    pub load: Vec<String>,
    pub initial_sync_seconds: f64,
    pub episodes: Vec<Episode>,
    /// Endpoints deleted while their Service existed (the independent watch).
    pub spurious_deletions: Vec<String>,
    /// Endpoints removed from a Service's EndpointSlices while it selected a
    /// live pod with that address (the chaos matrix's slice observer).
    pub spurious_slice_removals: Vec<String>,
    pub trends: Vec<Trend>,
    pub samples: Vec<Sample>,
}

impl Report {
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(self)?)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        std::fs::write(
            dir.join("soak.svg"),
            svg(&self.samples, &self.episodes, self.duration_seconds),
        )?;
        Ok(())
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Soak: {:.0} minutes — {}\n",
            self.duration_seconds / 60.0,
            if self.passed { "passed" } else { "**FAILED**" }
        );
        for f in &self.failures {
            let _ = writeln!(out, "- failure: {f}");
        }
        let w = &self.workload;
        let _ = writeln!(
            out,
            "endpoints-guard `{}` (both controllers, enforce mode, `--resync-interval {:.0}s --ghost-scan-period 0 --ghost-scan-qps 20`) behind watch-chaos on a local kube-apiserver + etcd. \
             Workload: {} small apps × ~{} pods, ~{} churned Services, {} Services of {} pods (above 1,000 endpoints), {:.0} operations/s: \
             {} operations ({} failed writes, mostly while kube-apiserver or etcd was down). \
             Background: etcd compacted {} times (every 10 s), watch streams cut {} times (every 30 s); \
             {} pod watches through watch-chaos in protobuf. Initial sync {:.1} s. Load: {}.\n",
            self.guard_binary,
            self.resync_interval_seconds,
            w.apps,
            w.pods_per_app,
            w.services,
            w.big_services,
            w.big_pods,
            w.ops_per_second,
            self.operations.total(),
            self.operations.total_failed(),
            self.etcd_compactions,
            self.stream_cuts,
            self.protobuf_pod_watches,
            self.initial_sync_seconds,
            self.load.join(" → "),
        );
        let _ = writeln!(
            out,
            "Spurious deletions (Endpoints deleted while their Service existed, from a direct watch): **{}**{}\n",
            self.spurious_deletions.len(),
            if self.spurious_deletions.is_empty() {
                String::new()
            } else {
                format!(": {}", self.spurious_deletions.join(", "))
            }
        );
        let _ = writeln!(
            out,
            "Spurious EndpointSlice removals (an endpoint removed while its Service selected a live pod with that address, from a direct watch): **{}**{}\n",
            self.spurious_slice_removals.len(),
            if self.spurious_slice_removals.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    self.spurious_slice_removals
                        .iter()
                        .take(10)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        // Convergence by fault kind.
        let _ = writeln!(
            out,
            "Convergence after each fault ends (budget {:.0} s = one resync interval + slack):\n",
            self.convergence_budget_seconds
        );
        let _ = writeln!(
            out,
            "| fault | times | converged in budget | converge s (median / max) | budget s | spurious |\n| --- | ---: | ---: | ---: | ---: | ---: |"
        );
        let mut kinds: Vec<&str> = Vec::new();
        for e in &self.episodes {
            if !kinds.contains(&e.fault.as_str()) {
                kinds.push(&e.fault);
            }
        }
        for kind in kinds {
            let eps: Vec<&Episode> = self.episodes.iter().filter(|e| e.fault == kind).collect();
            let mut secs: Vec<f64> = eps.iter().filter_map(|e| e.converge_seconds).collect();
            secs.sort_by(|a, b| a.total_cmp(b));
            let median = secs.get(secs.len() / 2).copied().unwrap_or(f64::NAN);
            let max = secs.last().copied().unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "| {kind} | {} | {} | {median:.1} / {max:.1} | {:.0} | {} |",
                eps.len(),
                eps.iter().filter(|e| e.converged).count(),
                eps.iter().map(|e| e.budget_seconds).fold(0.0, f64::max),
                eps.iter().map(|e| e.spurious).sum::<usize>()
            );
        }
        let _ = writeln!(
            out,
            "\nResource use over the last two thirds (least-squares slope; flat when the fitted growth over the window is within the allowance):\n"
        );
        let _ = writeln!(
            out,
            "| series | mean | slope / hour | fitted growth | allowed | flat |\n| --- | ---: | ---: | ---: | ---: | --- |"
        );
        for t in &self.trends {
            let _ = writeln!(
                out,
                "| {} ({}) | {:.1} | {:+.2} | {:+.2} | {:.1} | {} |",
                t.series,
                t.unit,
                t.mean,
                t.slope_per_hour,
                t.growth,
                t.allowed,
                if t.flat { "yes" } else { "**no**" }
            );
        }
        if let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) {
            let peak = self.samples.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
            let cpu = if last.t > first.t {
                (last.cpu_seconds - first.cpu_seconds) / (last.t - first.t)
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "\nRSS {:.1} MiB at the start, {:.1} MiB at the end, peak {:.1} MiB; CPU {:.3} cores on average; fds {:.0} → {:.0}; threads {:.0} → {:.0}; cached objects {:.0} → {:.0}; tombstones at the end {:.0}. {} samples every 10 s.",
                first.rss_mib,
                last.rss_mib,
                peak,
                cpu,
                first.fds,
                last.fds,
                first.threads,
                last.threads,
                first.cache_total(),
                last.cache_total(),
                last.tombstones,
                self.samples.len()
            );
        }
        let _ = writeln!(out, "\nOperations: {:?}\n", self.operations.ops);
        let _ = writeln!(
            out,
            "| # | fault | from s | to s | converged (s) | note |\n| ---: | --- | ---: | ---: | ---: | --- |"
        );
        for (i, e) in self.episodes.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {} | {} |",
                i + 1,
                e.fault,
                e.started,
                e.ended,
                match e.converge_seconds {
                    Some(s) if e.converged => format!("{s:.1}"),
                    Some(s) => format!("**{s:.1}** (over budget)"),
                    None => "**no**".to_string(),
                },
                e.problem.clone().unwrap_or_default().replace('|', "/")
            );
        }
        out
    }
}

/// The SVG: three stacked panels (RSS; cached objects; tombstones), time on
/// x, each fault a shaded band with its number.
pub fn svg(samples: &[Sample], episodes: &[Episode], duration: f64) -> String {
    let (w, left, right) = (1000.0, 70.0, 20.0);
    let (panel_h, gap, top) = (170.0, 45.0, 40.0);
    let plot_w = w - left - right;
    let t_max = samples
        .last()
        .map(|s| s.t)
        .unwrap_or(duration)
        .max(duration)
        .max(1.0);
    let x = |t: f64| left + plot_w * t / t_max;
    let h = top + 3.0 * (panel_h + gap) + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14">endpoints-guard soak: {:.0} min, faults shaded (numbers: report.md)</text>"#,
        duration / 60.0
    );
    type Series<'a> = (&'a str, &'a str, Box<dyn Fn(&Sample) -> f64 + 'a>);
    let panels: Vec<(String, Vec<Series>)> = vec![
        (
            "RSS (MiB)".to_string(),
            vec![("rss", "#c0392b", Box::new(|s: &Sample| s.rss_mib))],
        ),
        (
            "cached objects".to_string(),
            vec![
                ("all", "#2c3e50", Box::new(|s: &Sample| s.cache_total())),
                (
                    "pods",
                    "#2980b9",
                    Box::new(|s: &Sample| s.cache_objects.get("pods").copied().unwrap_or(0.0)),
                ),
                (
                    "endpointslices",
                    "#27ae60",
                    Box::new(|s: &Sample| {
                        s.cache_objects
                            .get("endpointslices")
                            .copied()
                            .unwrap_or(0.0)
                    }),
                ),
            ],
        ),
        (
            "tombstones, queue depth".to_string(),
            vec![
                ("tombstones", "#8e44ad", Box::new(|s: &Sample| s.tombstones)),
                ("queue", "#d35400", Box::new(|s: &Sample| s.queue_depth)),
            ],
        ),
    ];
    for (p, (title, series)) in panels.iter().enumerate() {
        let y0 = top + p as f64 * (panel_h + gap);
        let y_max = samples
            .iter()
            .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)))
            .fold(0.0_f64, f64::max)
            .max(1.0)
            * 1.1;
        let y = |v: f64| y0 + panel_h - panel_h * v / y_max;
        for (i, e) in episodes.iter().enumerate() {
            let (a, b) = (x(e.started), x(e.ended.max(e.started + 1.0)));
            let color = if e.converged { "#f1c40f" } else { "#e74c3c" };
            let _ = writeln!(
                out,
                r#"<rect x="{a:.1}" y="{y0:.1}" width="{:.1}" height="{panel_h}" fill="{color}" fill-opacity="0.25"/>"#,
                (b - a).max(1.0)
            );
            if p == 0 {
                let _ = writeln!(
                    out,
                    r##"<text x="{a:.1}" y="{:.1}" font-size="8" fill="#7f6000">{}</text>"##,
                    y0 - 3.0,
                    i + 1
                );
            }
        }
        let _ = writeln!(
            out,
            r##"<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel_h}" fill="none" stroke="#555"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{left}" y="{:.1}" font-weight="bold">{title}</text>"#,
            y0 - 14.0
        );
        for k in 0..=4 {
            let v = y_max * k as f64 / 4.0;
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{v:.0}</text><line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
                left - 4.0,
                y(v) + 4.0,
                left + plot_w,
                y(v),
                y(v)
            );
        }
        for (k, (name, color, f)) in series.iter().enumerate() {
            let points: Vec<String> = samples
                .iter()
                .map(|s| format!("{:.1},{:.1}", x(s.t), y(f(s))))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                points.join(" ")
            );
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" fill="{color}">{name}</text>"#,
                left + plot_w - 120.0,
                y0 + 14.0 + 13.0 * k as f64
            );
        }
        // Time axis, minutes.
        let step = if t_max > 1200.0 {
            300.0
        } else if t_max > 300.0 {
            60.0
        } else {
            30.0
        };
        let mut t = 0.0;
        while t <= t_max {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
                x(t),
                y0 + panel_h + 13.0,
                if step >= 60.0 {
                    format!("{:.0} min", t / 60.0)
                } else {
                    format!("{t:.0} s")
                }
            );
            t += step;
        }
    }
    out.push_str("</svg>\n");
    out
}
