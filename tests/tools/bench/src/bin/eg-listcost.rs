//! `eg-listcost`: what a full resync's list of every pod costs
//! kube-apiserver and etcd, and how much slower kube-apiserver answers
//! other clients' writes while it serves one, for whole objects (what the
//! resync lists today) and for metadata alone (`PartialObjectMetadataList`,
//! the lead of docs/ghosts.md), on one control plane in one run
//! (docs/bench-runs.md).
//!
//! ```text
//! SIZE=S|M|L eg-listcost [--window-secs 60] [--repeat 2] [--write-rate 20] [--page 500] [--share 1]
//! ```
//!
//! No controller runs. Each round measures three windows on the same
//! workload, in an order that turns every round so a drift weighs on each
//! alike: `none` (no list), `whole` and `metadata` (lists of every pod, one
//! after the other for the whole window, each as the resync makes it: a
//! one-item LIST for the current resourceVersion, then pages at exactly
//! that resourceVersion, in protobuf and gzipped as endpoints-guard asks).
//! Through every window the tool writes pods' Ready condition at
//! `--write-rate` a second, as a kubelet would, and times each write from
//! sending it to reading the answer. With `--share F` below 1 a list pauses
//! after each page for as long as the page took × (1/F − 1), so that pages
//! are served about F of the window's time (a paced resync).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_bench::plane::PlaneSample;
use eg_bench::report::percentile;
use eg_bench::{BenchSize, BenchWorkload, PodRef, plane_options, set_ready};
use eg_harness::ControlPlane;
use hardened_watcher::live::{self, ListShape, PageFrom};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

struct Options {
    size: BenchSize,
    window: Duration,
    repeat: u32,
    write_rate: u32,
    page: u32,
    /// The share of the time pages are asked for (1: back to back).
    share: f64,
}

fn parse() -> Result<Options> {
    let mut opts = Options {
        size: BenchSize::named(&std::env::var("SIZE").unwrap_or_else(|_| "S".into()))?,
        window: Duration::from_secs(60),
        repeat: 2,
        write_rate: 20,
        page: 500,
        share: 1.0,
    };
    for (flag, value) in eg_bench::flag_values()? {
        match flag.as_str() {
            "--window-secs" => {
                opts.window = Duration::from_secs(value.parse().context("--window-secs")?)
            }
            "--repeat" => opts.repeat = value.parse().context("--repeat")?,
            "--write-rate" => opts.write_rate = value.parse().context("--write-rate")?,
            "--page" => opts.page = value.parse().context("--page")?,
            "--share" => opts.share = value.parse().context("--share")?,
            other => bail!(
                "unknown flag {other}; usage: SIZE=S|M|L eg-listcost [--window-secs N] [--repeat N] [--write-rate N] [--page N] [--share F]"
            ),
        }
    }
    if opts.write_rate == 0 || opts.page == 0 || opts.window.is_zero() {
        bail!("--write-rate, --page and --window-secs must be above 0");
    }
    if !(opts.share > 0.0 && opts.share <= 1.0) {
        bail!("--share must be above 0 and at most 1");
    }
    Ok(opts)
}

/// What a window lists, back to back: nothing, or every pod in one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lists {
    None,
    Of(ListShape),
}

impl Lists {
    fn name(self) -> &'static str {
        match self {
            Lists::None => "none",
            Lists::Of(ListShape::Metadata) => "metadata",
            Lists::Of(_) => "whole",
        }
    }
}

const ORDER: [Lists; 3] = [
    Lists::None,
    Lists::Of(ListShape::Whole),
    Lists::Of(ListShape::Metadata),
];

/// Round `round`'s order: `ORDER` turned by one more place each round.
fn round_order(round: u32) -> Vec<Lists> {
    let mut order = ORDER.to_vec();
    order.rotate_left(round as usize % ORDER.len());
    order
}

/// What one window measured.
struct Window {
    round: u32,
    lists: Lists,
    /// Seconds from a list's one-item probe to its last page's answer, one
    /// entry per list of every pod finished in the window.
    list_s: Vec<f64>,
    plane_cpu_s: f64,
    response_bytes: f64,
    window_s: f64,
    /// Round trips of the status writes (ms), in the order sent.
    write_ms: Vec<f64>,
    failed_writes: u64,
}

/// Lists every pod once as the resync does: the current resourceVersion
/// from a one-item LIST, then every page at exactly that resourceVersion.
/// After each page it pauses so that pages take about `share` of the time.
/// Returns the pods listed.
async fn list_all(client: &Client, shape: ListShape, page: u32, share: f64) -> Result<usize> {
    let probe = live::list_page_as::<Pod>(client, &(), 1, PageFrom::Current, shape, "probe")
        .await
        .context("the one-item LIST")?;
    let rv = probe.resource_version;
    let mut from = PageFrom::Exactly(&rv);
    let mut token;
    let mut pods = 0;
    loop {
        let asked = Instant::now();
        let answer = live::list_page_as::<Pod>(client, &(), page, from, shape, "list")
            .await
            .with_context(|| format!("a page of the list at resourceVersion {rv}"))?;
        pods += answer.items.len() + answer.unreadable;
        match answer.continue_token {
            Some(next) => {
                if share < 1.0 {
                    tokio::time::sleep(asked.elapsed().mul_f64(1.0 / share - 1.0)).await;
                }
                token = next;
                from = PageFrom::Continue(&token);
            }
            None => return Ok(pods),
        }
    }
}

/// Writes pods' Ready condition at `rate` a second until `end`, pod `next`
/// onward (each flipped the other way from the last time), and returns each
/// answered write's round trip and the failures.
async fn write_until(
    client: &Client,
    pods: &[PodRef],
    next: &mut usize,
    rate: u32,
    end: Instant,
) -> (Vec<f64>, u64) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate);
    let limit = Arc::new(Semaphore::new(32));
    let mut tasks = JoinSet::new();
    while Instant::now() < end {
        ticker.tick().await;
        let k = *next;
        *next += 1;
        let pod = pods[k % pods.len()].clone();
        // The first pass sets every pod not ready, the next one ready again.
        let ready = (k / pods.len()) % 2 == 1;
        let (client, limit) = (client.clone(), limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let sent = Instant::now();
            set_ready(&client, &pod, ready)
                .await
                .ok()
                .map(|()| sent.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let (mut ms, mut failed) = (Vec::new(), 0);
    while let Some(done) = tasks.join_next().await {
        match done.ok().flatten() {
            Some(round_trip) => ms.push(round_trip),
            None => failed += 1,
        }
    }
    (ms, failed)
}

async fn measure(
    cp: &ControlPlane,
    workload: &BenchWorkload,
    next_pod: &mut usize,
    opts: &Options,
    lists: Lists,
    round: u32,
) -> Result<Window> {
    let client = cp.client();
    let before = PlaneSample::read(cp, &client).await?;
    let started = Instant::now();
    let end = started + opts.window;
    let lister = async {
        let mut list_s = Vec::new();
        if let Lists::Of(shape) = lists {
            while Instant::now() < end {
                let at = Instant::now();
                let pods = list_all(&client, shape, opts.page, opts.share).await?;
                if pods < workload.pods.len() {
                    bail!(
                        "a {} list held {pods} pods, fewer than the {} created",
                        lists.name(),
                        workload.pods.len()
                    );
                }
                list_s.push(at.elapsed().as_secs_f64());
            }
        } else {
            tokio::time::sleep_until(end.into()).await;
        }
        Ok(list_s)
    };
    let writer = write_until(&client, &workload.pods, next_pod, opts.write_rate, end);
    let (list_s, (write_ms, failed_writes)) = tokio::join!(lister, writer);
    let list_s = list_s?;
    let window_s = started.elapsed().as_secs_f64();
    let after = PlaneSample::read(cp, &client).await?;
    let spend = after.since(&before, window_s);
    Ok(Window {
        round,
        lists,
        list_s,
        plane_cpu_s: spend.apiserver_cpu_s + spend.etcd_cpu_s,
        response_bytes: spend.response_bytes,
        window_s,
        write_ms,
        failed_writes,
    })
}

fn p(ms: &[f64], at: f64) -> f64 {
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, at)
}

#[tokio::main]
async fn main() -> Result<()> {
    let opts = parse()?;
    let cp = ControlPlane::start(plane_options()).await?;
    let workload = BenchWorkload::created(&opts.size, &cp.client()).await?;
    let mut next_pod = 0;
    let mut windows = Vec::new();
    for round in 1..=opts.repeat {
        for lists in round_order(round) {
            let w = measure(&cp, &workload, &mut next_pod, &opts, lists, round).await?;
            eprintln!(
                "round {round} {:>8}: {} lists; kube-apiserver + etcd {:.2} CPU-s; {:.0} KiB of answers; writes p50 {:.1} ms, p99 {:.1} ms ({} answered, {} failed)",
                lists.name(),
                w.list_s.len(),
                w.plane_cpu_s,
                w.response_bytes / 1024.0,
                p(&w.write_ms, 50.0),
                p(&w.write_ms, 99.0),
                w.write_ms.len(),
                w.failed_writes
            );
            windows.push(w);
        }
    }
    println!(
        "| round | lists | lists of {} pods | seconds a list (median) | kube-apiserver + etcd CPU-s a list, beyond `none` | KiB of answers a list | status writes answered | write p50 (ms) | write p99 (ms) |",
        workload.pods.len()
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for round in 1..=opts.repeat {
        let of = |lists: Lists| {
            windows
                .iter()
                .find(|w| w.round == round && w.lists == lists)
                .with_context(|| format!("round {round} measured no {} window", lists.name()))
        };
        let idle = of(Lists::None)?;
        let idle_cpu_per_s = idle.plane_cpu_s / idle.window_s;
        let idle_bytes_per_s = idle.response_bytes / idle.window_s;
        for lists in ORDER {
            let w = of(lists)?;
            let per_list = |total: f64, idle_per_s: f64, decimals: usize| {
                if w.list_s.is_empty() {
                    return "-".to_string();
                }
                let added = (total - idle_per_s * w.window_s) / w.list_s.len() as f64;
                format!("{added:.decimals$}")
            };
            let median = if w.list_s.is_empty() {
                "-".to_string()
            } else {
                format!("{:.3}", p(&w.list_s, 50.0))
            };
            let kib = per_list(w.response_bytes / 1024.0, idle_bytes_per_s / 1024.0, 0);
            println!(
                "| {round} | {} | {} | {median} | {} | {kib} | {} | {:.1} | {:.1} |",
                lists.name(),
                w.list_s.len(),
                per_list(w.plane_cpu_s, idle_cpu_per_s, 4),
                w.write_ms.len(),
                p(&w.write_ms, 50.0),
                p(&w.write_ms, 99.0),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_measures_each_window_once_and_starts_elsewhere() {
        let first: Vec<Lists> = (1..=3).map(|r| round_order(r)[0]).collect();
        for lists in ORDER {
            assert_eq!(first.iter().filter(|l| **l == lists).count(), 1);
            for round in 1..=3 {
                assert_eq!(
                    round_order(round).iter().filter(|l| **l == lists).count(),
                    1
                );
            }
        }
    }
}
