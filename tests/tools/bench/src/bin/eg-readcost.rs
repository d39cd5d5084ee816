//! `eg-readcost`: what the ghost scan's read (a metadata GET of one pod,
//! served from etcd) costs the reading process in CPU, paced four ways, on a
//! local control plane. The figures back the pacing of
//! `src/reconcile/ghost_scan/` (docs/bench-runs.md).
//!
//! ```text
//! eg-readcost [--rate READS_PER_S] [--secs N] [--pods N] [--runtime multi|current]
//! ```
//!
//! Phases, each `--secs` long: idle (no reads), spaced (one read every
//! 1/rate s), burst (every second, `rate` reads one after the other), and
//! concurrent (every second, `rate` reads at once). CPU is the process's
//! user + system time from `/proc/self/stat`, so it includes the kernel's
//! share of every socket operation and thread wake-up.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

const NS: &str = "default";

struct Options {
    rate: u32,
    secs: u64,
    pods: u32,
    current_thread: bool,
}

fn parse() -> Result<Options> {
    let mut opts = Options {
        rate: 10,
        secs: 20,
        pods: 100,
        current_thread: false,
    };
    for (flag, value) in eg_bench::flag_values()? {
        match flag.as_str() {
            "--rate" => opts.rate = value.parse().context("--rate")?,
            "--secs" => opts.secs = value.parse().context("--secs")?,
            "--pods" => opts.pods = value.parse().context("--pods")?,
            "--runtime" => {
                opts.current_thread = match value.as_str() {
                    "multi" => false,
                    "current" => true,
                    other => bail!("--runtime {other}: multi or current"),
                }
            }
            other => bail!(
                "unknown flag {other}; usage: eg-readcost [--rate N] [--secs N] [--pods N] [--runtime multi|current]"
            ),
        }
    }
    if opts.rate == 0 || opts.pods == 0 || opts.secs == 0 {
        bail!("--rate, --pods and --secs must be above 0");
    }
    Ok(opts)
}

/// This process's user + system CPU time.
fn cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("/proc/self/stat")?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("/proc/self/stat: no command")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .context("/proc/self/stat: short line")?
            .parse()
            .context("/proc/self/stat: a time")
    };
    // USER_HZ is 100 on Linux.
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// One metadata GET (resourceVersion unset: served from etcd). The scan
/// decodes less of the answer (`hardened_watcher::live::get_meta`); the
/// difference is the same in every phase.
async fn read(pods: &Api<Pod>, name: &str) -> Result<()> {
    pods.get_metadata(name)
        .await
        .with_context(|| format!("GET {name}"))?;
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Pacing {
    Idle,
    Spaced,
    Burst,
    Concurrent,
}

async fn phase(pods: &Api<Pod>, keys: &[String], pacing: Pacing, opts: &Options) -> Result<()> {
    let start = Instant::now();
    let cpu_before = cpu()?;
    let end = start + Duration::from_secs(opts.secs);
    let mut reads = 0u64;
    let mut next = keys.iter().cycle();
    let mut tick = tokio::time::interval(match pacing {
        Pacing::Spaced => Duration::from_secs(1) / opts.rate,
        _ => Duration::from_secs(1),
    });
    while Instant::now() < end {
        tick.tick().await;
        match pacing {
            Pacing::Idle => {}
            Pacing::Spaced => {
                let key = next.next().context("no pods")?;
                read(pods, key).await?;
                reads += 1;
            }
            Pacing::Burst => {
                for _ in 0..opts.rate {
                    let key = next.next().context("no pods")?;
                    read(pods, key).await?;
                    reads += 1;
                }
            }
            Pacing::Concurrent => {
                let batch: Vec<&String> = next.by_ref().take(opts.rate as usize).collect();
                for answer in join_all(batch.iter().map(|key| read(pods, key))).await {
                    answer?;
                    reads += 1;
                }
            }
        }
    }
    let spent = cpu()?.saturating_sub(cpu_before);
    let wall = start.elapsed().as_secs_f64();
    let per_read = if reads > 0 {
        format!("{:.3} ms", spent.as_secs_f64() * 1000.0 / reads as f64)
    } else {
        "-".to_string()
    };
    println!(
        "{pacing:?}: {reads} reads in {wall:.1} s, CPU {:.2} s ({:.1} ms/s), per read {per_read}",
        spent.as_secs_f64(),
        spent.as_secs_f64() * 1000.0 / wall
    );
    Ok(())
}

async fn run(opts: Options) -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let mut keys = Vec::new();
    for i in 0..opts.pods {
        let name = format!("read-{i}");
        let ip = format!("10.9.{}.{}", i / 250, i % 250 + 1);
        cp.create_pod_with_status(
            PodBuilder::serving(NS, &name, "readcost"),
            PodStatusSpec::ready([ip.as_str()]),
        )
        .await?;
        keys.push(name);
    }
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    // One read first: the connection is open before anything is measured.
    read(&pods, &keys[0]).await?;
    println!(
        "{} pods, {} reads/s, {} s a phase, {} runtime",
        opts.pods,
        opts.rate,
        opts.secs,
        if opts.current_thread {
            "current-thread"
        } else {
            "multi-thread"
        }
    );
    for pacing in [
        Pacing::Idle,
        Pacing::Spaced,
        Pacing::Burst,
        Pacing::Concurrent,
    ] {
        phase(&pods, &keys, pacing, &opts).await?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let opts = parse()?;
    let runtime = if opts.current_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(run(opts))
}
