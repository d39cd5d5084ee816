//! `make bench [SIZE=S|M|L|XL|N] [KIND=endpoints|endpointslices|both]`:
//! endpoints-guard side by side with kube-controller-manager's endpoints
//! (or endpointslice) controller, at its default client QPS (20) and again
//! with `--kube-api-qps`/`--kube-api-burst` raised (`--fast-qps`, default
//! 1000; 0 leaves that run out); see `eg_bench`.
//!
//! ```text
//! eg-bench [--size S|M|L|XL|N] [--kind endpoints|endpointslices|both] [--rate PODS_PER_S]
//!          [--churn-secs N] [--steady-secs N] [--check-window-secs N] [--resync-secs N] [--out DIR]
//!          [--only CONTROLLER[,CONTROLLER]...] [--upstream-arg FLAG]...
//!          [--guard-resync-secs N] [--guard-full-resync-secs N] [--ghost-scan-qps N] [--fast-qps N] [--repeat N]
//!          [--ghost CONTROLLER[,CONTROLLER]...|none] [--ghost-kind endpoints|endpointslices|both|none]
//!          [--ghost-timeout-secs N] [--etcd-compaction-secs N] [--guard-replicas N]
//!          [--collection-offset-secs N]
//!   CONTROLLER: endpoints-guard | kube-controller-manager | kube-controller-manager-fast
//! eg-bench --render [--out DIR]    # rewrite the report*.md from report*.json
//! ```
//!
//! `--check-window-secs` is the least length of the window with no
//! controller (default 480: one of kube-apiserver's consistency checks of
//! every resource falls in it; 0: as long as steady, the checks not
//! measured). `--resync-secs` is the interval of the resync phase's fresh process;
//! `--guard-resync-secs`, `--guard-full-resync-secs` and `--ghost-scan-qps` set endpoints-guard's flags
//! in its measured run (unset: the binary's defaults). `--ghost` names the
//! controllers whose runs have the ghost phase (default endpoints-guard and
//! kube-controller-manager; `--ghost-kind` the kinds, default both), each
//! waiting up to `--ghost-timeout-secs` (660). `--etcd-compaction-secs` is
//! kube-apiserver's `--etcd-compaction-interval` (default its own, 5 minutes).
//! `--guard-replicas` runs endpoints-guard as that many replicas electing a
//! leader (default 2, the chart's `replicaCount`; 1: one process, no
//! election): the followers join after churn, and steady measures them all.
//! `--collection-offset-secs` is how long after kube-apiserver and etcd are
//! made to collect their garbage the windows at rest start (default 60,
//! half of Go's forced period; see `eg_bench::plane`).
//!
//! `SIZE` and `KIND` may also come from the environment (the flags win).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eg_bench::{self as bench, BenchOptions, BenchSize, Controller, Kind};
use eg_harness::binaries::workspace_root;

fn usage() -> &'static str {
    "usage: eg-bench [--size S|M|L|XL|N] [--kind endpoints|endpointslices|both] [--rate N] \
     [--churn-secs N] [--steady-secs N] [--check-window-secs N] \
     [--resync-secs N] [--out DIR] \
     [--only endpoints-guard|kube-controller-manager|kube-controller-manager-fast[,...]] \
     [--upstream-arg FLAG]... [--apiserver-arg FLAG]... [--guard-resync-secs N] [--guard-full-resync-secs N] [--ghost-scan-qps N] [--fast-qps N] [--repeat N] \
     [--ghost CONTROLLER[,...]|none] [--ghost-kind endpoints|endpointslices|both|none] \
     [--ghost-timeout-secs N] [--etcd-compaction-secs N] [--guard-replicas N] \
     [--collection-offset-secs N] | eg-bench --render [--out DIR]"
}

/// `--only` and `--ghost`: controller names, comma-separated.
fn controllers(flag: &str, value: &str) -> Result<Vec<Controller>> {
    value
        .split(',')
        .map(|name| {
            Controller::named(name.trim())
                .with_context(|| format!("{flag} {name}: unknown controller"))
        })
        .collect()
}

fn parse() -> Result<BenchOptions> {
    let root = workspace_root()?;
    let binary = bench::guard_binary(&root);
    let size = std::env::var("SIZE").unwrap_or_else(|_| "S".into());
    let mut opts = BenchOptions::new(BenchSize::named(&size)?, binary, root.join("target/bench"));
    opts.kinds = Kind::parse_list(&std::env::var("KIND").unwrap_or_default())?;
    let mut render_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{}", usage());
            std::process::exit(0);
        }
        if flag == "--render" {
            render_only = true;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value; {}", usage()))?;
        let secs = |v: &str| -> Result<Duration> {
            Ok(Duration::from_secs(
                v.parse().with_context(|| format!("{flag} {v}"))?,
            ))
        };
        match flag.as_str() {
            "--size" => opts.size = BenchSize::named(&value)?,
            "--kind" => opts.kinds = Kind::parse_list(&value)?,
            "--rate" => opts.churn_rate = value.parse().context("--rate")?,
            "--churn-secs" => opts.churn = secs(&value)?,
            "--steady-secs" => opts.steady = secs(&value)?,
            "--check-window-secs" => opts.check_window = secs(&value)?,
            "--collection-offset-secs" => opts.collection_offset = secs(&value)?,
            "--resync-secs" => opts.resync_phase_interval = secs(&value)?,
            "--guard-resync-secs" => opts.guard_resync_interval = Some(secs(&value)?),
            "--guard-full-resync-secs" => opts.guard_full_resync_interval = Some(secs(&value)?),
            "--ghost" if value == "none" => opts.ghost_controllers.clear(),
            "--ghost" => opts.ghost_controllers = controllers("--ghost", &value)?,
            "--ghost-kind" if value == "none" => opts.ghost_kinds.clear(),
            "--ghost-kind" => opts.ghost_kinds = Kind::parse_list(&value)?,
            "--ghost-timeout-secs" => opts.ghost_timeout = secs(&value)?,
            "--etcd-compaction-secs" => opts.etcd_compaction_interval = Some(secs(&value)?),
            "--out" => opts.out_dir = PathBuf::from(value),
            "--upstream-arg" => opts.upstream_args.push(value),
            "--apiserver-arg" => opts.apiserver_args.push(value),
            "--ghost-scan-qps" => {
                opts.ghost_scan_qps = Some(value.parse().context("--ghost-scan-qps")?)
            }
            "--fast-qps" => opts.fast_upstream_qps = value.parse().context("--fast-qps")?,
            "--repeat" => {
                opts.repeat = value.parse().context("--repeat")?;
                if opts.repeat == 0 {
                    bail!("--repeat 0: give at least one round");
                }
            }
            "--guard-replicas" => {
                opts.guard_replicas = value.parse().context("--guard-replicas")?;
                if opts.guard_replicas == 0 {
                    bail!("--guard-replicas 0: give at least one replica");
                }
            }
            "--only" => opts.controllers = controllers("--only", &value)?,
            other => bail!("unknown flag {other}; {}", usage()),
        }
    }
    if opts.fast_upstream_qps == 0 {
        opts.controllers.retain(|c| *c != Controller::UpstreamFast);
    }
    if render_only {
        for md in bench::report::render_markdown(&opts.out_dir)? {
            println!("wrote {}", md.display());
        }
        std::process::exit(0);
    }
    if !opts.guard_binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release` (make bench does)",
            opts.guard_binary.display()
        );
    }
    Ok(opts)
}

#[tokio::main]
async fn main() -> Result<()> {
    let opts = parse()?;
    let runs = bench::run(opts).await?;
    for run in &runs {
        println!("{}", serde_json::to_string(run)?);
    }
    Ok(())
}
