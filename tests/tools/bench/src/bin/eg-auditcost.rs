//! `eg-auditcost`: what endpoints-guard's compaction audit and its ghost
//! scan each cost kube-apiserver and etcd at rest, against endpoints-guard
//! with both off, in one run on one control plane (docs/bench-runs.md).
//!
//! ```text
//! SIZE=S|M|L eg-auditcost [--window-secs 240] [--repeat 2] [--baseline PATH]
//! ```
//!
//! kube-apiserver compacts etcd every 60 s here, so a window holds several
//! of the audit's lists at a compaction revision; the figure per minute at
//! kube-apiserver's default (one compaction every 5 minutes) is the cost of
//! one such list divided by 5. Each round runs endpoints-guard three times,
//! one configuration after the other, on the same workload: `off` (no audit,
//! no scan), `audit` (the audit every minute, no scan), `scan` (the scan at
//! its defaults, no audit). With `--baseline`, a fourth run per round is
//! another endpoints-guard binary's audit (`audit-baseline`), to compare two
//! builds' audits in one run: it comes right after `audit` in odd rounds and
//! right before it in even ones (`round_configs`). Each run waits for the caches to sync and 30 s
//! more, then measures kube-apiserver's and etcd's CPU and the bytes of its
//! answers over the window.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_bench::plane::PlaneSample;
use eg_bench::{BenchSize, BenchWorkload, plane_options, start_guard};
use eg_harness::ControlPlane;
use eg_harness::binaries::workspace_root;
use eg_workload::metrics::sample_sum;

const COMPACTION: Duration = Duration::from_secs(60);
/// kube-apiserver's default `--etcd-compaction-interval`.
const DEFAULT_COMPACTION: Duration = Duration::from_secs(300);
const SETTLE: Duration = Duration::from_secs(30);

struct Options {
    size: BenchSize,
    window: Duration,
    repeat: u32,
    binary: PathBuf,
    /// Another build whose audit is measured beside this one's.
    baseline: Option<PathBuf>,
}

fn parse() -> Result<Options> {
    let root = workspace_root()?;
    let mut opts = Options {
        size: BenchSize::named(&std::env::var("SIZE").unwrap_or_else(|_| "S".into()))?,
        window: Duration::from_secs(240),
        repeat: 2,
        binary: std::env::var_os("EG_BINARY")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/release/endpoints-guard")),
        baseline: None,
    };
    for (flag, value) in eg_bench::flag_values()? {
        match flag.as_str() {
            "--window-secs" => {
                opts.window = Duration::from_secs(value.parse().context("--window-secs")?)
            }
            "--repeat" => opts.repeat = value.parse().context("--repeat")?,
            "--baseline" => opts.baseline = Some(PathBuf::from(value)),
            other => bail!(
                "unknown flag {other}; usage: SIZE=S|M|L eg-auditcost [--window-secs N] [--repeat N] [--baseline PATH]"
            ),
        }
    }
    Ok(opts)
}

/// One configuration of endpoints-guard: its name, `--ghost-scan-qps`,
/// `--compaction-audit-interval`, and whether it runs the baseline build.
struct Config {
    name: &'static str,
    scan_qps: &'static str,
    audit_every: &'static str,
    baseline: bool,
}

const CONFIGS: [Config; 4] = [
    Config {
        name: "off",
        scan_qps: "0",
        audit_every: "0",
        baseline: false,
    },
    Config {
        name: "audit",
        scan_qps: "0",
        audit_every: "1m",
        baseline: false,
    },
    Config {
        name: "audit-baseline",
        scan_qps: "0",
        audit_every: "1m",
        baseline: true,
    },
    Config {
        name: "scan",
        scan_qps: "5",
        audit_every: "0",
        baseline: false,
    },
];

/// What round `round` runs, in order: the baseline's audit only when there
/// is one, and the two builds' audits swap places every other round, so a
/// drift over the run weighs on both alike.
fn round_configs(opts: &Options, round: u32) -> Vec<&'static Config> {
    let mut configs: Vec<&Config> = CONFIGS
        .iter()
        .filter(|c| opts.baseline.is_some() || !c.baseline)
        .collect();
    let at = |configs: &[&Config], name: &str| configs.iter().position(|c| c.name == name);
    if round.is_multiple_of(2)
        && let (Some(this), Some(baseline)) =
            (at(&configs, "audit"), at(&configs, "audit-baseline"))
    {
        configs.swap(this, baseline);
    }
    configs
}

/// What one window measured.
struct Window {
    round: u32,
    config: &'static str,
    plane_cpu_s_per_min: f64,
    response_bytes: f64,
    /// endpoints-guard's own CPU, from /proc (its `process_cpu_seconds_total`
    /// counts whole seconds).
    own_cpu_s_per_min: f64,
    audits_listed: f64,
    scan_reads: f64,
}

async fn measure(cp: &ControlPlane, opts: &Options, config: &Config, round: u32) -> Result<Window> {
    let mut args = vec![
        format!("--ghost-scan-qps={}", config.scan_qps),
        format!("--compaction-audit-interval={}", config.audit_every),
        "--resync-interval=90s".to_string(),
    ];
    if !config.baseline {
        // Every compaction revision listed in full, whatever the counts
        // say: what one listing costs is what this tool measures.
        args.push("--compaction-audit-full-every=1".to_string());
    }
    let binary = match (&opts.baseline, config.baseline) {
        (Some(baseline), true) => baseline,
        _ => &opts.binary,
    };
    let mut guard = start_guard(
        cp,
        binary,
        cp.kubeconfig_path(),
        &args,
        &format!("guard-{}-{round}", config.name),
    )?;
    guard.wait_ready(Duration::from_secs(600)).await?;
    tokio::time::sleep(SETTLE).await;
    let client = cp.client();
    let series = |text: &str, name: &str| sample_sum(text, name).unwrap_or(0.0);
    let before_metrics = guard.metrics().await?;
    let own_before = guard.cpu()?;
    let before = PlaneSample::read(cp, &client).await?;
    let started = Instant::now();
    tokio::time::sleep(opts.window).await;
    let after = PlaneSample::read(cp, &client).await?;
    let after_metrics = guard.metrics().await?;
    let own_after = guard.cpu()?;
    let spend = after.since(&before, started.elapsed().as_secs_f64());
    let listed = "endpoints_guard_compaction_audits_total{result=\"listed\"}";
    let failed = "endpoints_guard_compaction_audits_total{result=\"failed\"}";
    let reads = "endpoints_guard_ghost_scan_reads_total";
    if series(&after_metrics, failed) > 0.0 {
        bail!(
            "{}: a compaction audit failed (see the log under {})",
            config.name,
            cp.log_dir().display()
        );
    }
    Ok(Window {
        round,
        config: config.name,
        plane_cpu_s_per_min: (spend.apiserver_cpu_s + spend.etcd_cpu_s) * 60.0 / spend.window_s,
        response_bytes: spend.response_bytes,
        own_cpu_s_per_min: own_after.since(&own_before).0 * 60.0 / spend.window_s,
        audits_listed: series(&after_metrics, listed) - series(&before_metrics, listed),
        scan_reads: series(&after_metrics, reads) - series(&before_metrics, reads),
    })
}

fn main() -> Result<()> {
    let opts = parse()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(opts))
}

async fn run(opts: Options) -> Result<()> {
    let cp = ControlPlane::start(plane_options().etcd_compaction_interval(COMPACTION)).await?;
    BenchWorkload::created(&opts.size, &cp.client()).await?;
    let mut windows = Vec::new();
    for round in 1..=opts.repeat {
        for config in round_configs(&opts, round) {
            let window = measure(&cp, &opts, config, round).await?;
            eprintln!(
                "round {round} {:>14}: kube-apiserver + etcd {:.3} CPU-s/min, endpoints-guard {:.3}; {:.0} KiB of answers; {} audit lists, {} scan reads",
                window.config,
                window.plane_cpu_s_per_min,
                window.own_cpu_s_per_min,
                window.response_bytes / 1024.0,
                window.audits_listed,
                window.scan_reads
            );
            windows.push(window);
        }
    }
    println!(
        "| round | build | added by the audit, CPU-s/min (compaction every {} s) | compaction revisions listed | per compaction revision: CPU-s, KiB of answers | endpoints-guard's own CPU, added, CPU-s/min | the audit at kube-apiserver's default compaction, CPU-s/min | added by the scan at its defaults, CPU-s/min | its reads/s |",
        COMPACTION.as_secs()
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for round in 1..=opts.repeat {
        let of = |name: &str| {
            windows
                .iter()
                .find(|w| w.round == round && w.config == name)
                .with_context(|| format!("round {round} measured no {name} window"))
        };
        let (off, scan) = (of("off")?, of("scan")?);
        let scan_added = scan.plane_cpu_s_per_min - off.plane_cpu_s_per_min;
        let scan_rate = scan.scan_reads / opts.window.as_secs_f64();
        let mut builds = vec![("this", of("audit")?)];
        if opts.baseline.is_some() {
            builds.push(("baseline", of("audit-baseline")?));
        }
        for (build, audit) in builds {
            let audit_added = audit.plane_cpu_s_per_min - off.plane_cpu_s_per_min;
            // Pods and Services are each listed once per compaction revision.
            let revisions = audit.audits_listed / 2.0;
            let (per_revision, kib_per_revision) = if revisions > 0.0 {
                (
                    audit_added * opts.window.as_secs_f64() / 60.0 / revisions,
                    (audit.response_bytes - off.response_bytes) / 1024.0 / revisions,
                )
            } else {
                (f64::NAN, f64::NAN)
            };
            // The one-item LIST that finds no new compaction is left out: it
            // is in every configuration's resync already, about as cheap.
            let at_default = per_revision * 60.0 / DEFAULT_COMPACTION.as_secs_f64();
            let own_added = audit.own_cpu_s_per_min - off.own_cpu_s_per_min;
            println!(
                "| {round} | {build} | {audit_added:.3} | {revisions} | {per_revision:.3}, {kib_per_revision:.0} | {own_added:.3} | {at_default:.3} | {scan_added:.3} | {scan_rate:.2} |",
            );
        }
    }
    Ok(())
}
