//! `eg-restcost`: what the requests endpoints-guard makes at rest cost
//! kube-apiserver and etcd, one request at a time, on one control plane
//! in one run (docs/bench-runs.md). The bench's windows at rest scatter by
//! more than the whole of endpoints-guard's requests at M; driven here at
//! many times their rate, each kind of request stands well above that
//! scatter, and its cost per request times its rate at the chart's
//! defaults gives the minute at rest without the scatter.
//!
//! ```text
//! SIZE=S|M|L [EG_BINARY=…] eg-restcost [--window-secs 90] [--repeat 2] [--rate 20]
//! ```
//!
//! The rates at rest come from the defaults in `EG_BINARY`'s `--help`
//! (default `target/release/endpoints-guard`).
//!
//! No controller runs. Each round measures, on the same workload, in an
//! order turned by one place each round: `none` (no request), `get` (the
//! ghost scan's read: the metadata of one pod from etcd, pods in turn),
//! `count pods` / `count services` (a resync's count check between full
//! resyncs: a one-item LIST for the current resourceVersion, then a
//! one-item LIST at exactly it, whose `remainingItemCount` is the count),
//! and `renew` (the leader's renewal of its Lease: a strategic-merge PATCH
//! of its `renewTime`).
//! Requests go at `--rate` a second, spaced evenly, as the controller
//! spaces its own. Before each window kube-apiserver and etcd are made to
//! collect their garbage, then left 10 s, as before the bench's windows.
//! kube-apiserver's consistency check is off (it would land in some windows
//! and not others), and etcd is compacted once the workload is created.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_bench::plane::{self, PlaneSample};
use eg_bench::{BenchSize, BenchWorkload, GuardDefaults, guard_binary, plane_options};
use eg_harness::ControlPlane;
use eg_harness::binaries::workspace_root;
use hardened_watcher::live::{self, ListShape, PageFrom};
use hardened_watcher::{LiveRead, ObjectKey};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NAMESPACE: &str = "default";

/// The ghost scan's slowest pace while it has targets, which no flag sets
/// (`src/reconcile/ghost_scan/pace.rs`).
const GHOST_SCAN_MIN_QPS: f64 = 0.5;

struct Options {
    size: BenchSize,
    window: Duration,
    repeat: u32,
    rate: u32,
}

fn parse() -> Result<Options> {
    let mut opts = Options {
        size: BenchSize::named(&std::env::var("SIZE").unwrap_or_else(|_| "S".into()))?,
        window: Duration::from_secs(90),
        repeat: 2,
        rate: 20,
    };
    for (flag, value) in eg_bench::flag_values()? {
        match flag.as_str() {
            "--window-secs" => {
                opts.window = Duration::from_secs(value.parse().context("--window-secs")?)
            }
            "--repeat" => opts.repeat = value.parse().context("--repeat")?,
            "--rate" => opts.rate = value.parse().context("--rate")?,
            other => bail!(
                "unknown flag {other}; usage: SIZE=S|M|L eg-restcost [--window-secs N] [--repeat N] [--rate N]"
            ),
        }
    }
    if opts.rate == 0 || opts.window.is_zero() || opts.repeat == 0 {
        bail!("--rate, --window-secs and --repeat must be above 0");
    }
    Ok(opts)
}

/// What a window sends, at the window's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Requests {
    None,
    Get,
    CountPods,
    CountServices,
    Renew,
}

impl Requests {
    fn name(self) -> &'static str {
        match self {
            Requests::None => "none",
            Requests::Get => "get",
            Requests::CountPods => "count pods",
            Requests::CountServices => "count services",
            Requests::Renew => "renew",
        }
    }
}

const ORDER: [Requests; 5] = [
    Requests::None,
    Requests::Get,
    Requests::CountPods,
    Requests::CountServices,
    Requests::Renew,
];

/// The Lease the `renew` window renews.
const LEASE: &str = "eg-restcost";

/// Round `round`'s order: `ORDER` turned by one more place each round.
fn round_order(round: u32) -> Vec<Requests> {
    let mut order = ORDER.to_vec();
    order.rotate_left(round as usize % ORDER.len());
    order
}

/// A count check as the resync makes it: the current resourceVersion from
/// a one-item LIST, then the count at exactly it.
async fn count_check<K>(client: &Client) -> Result<u64>
where
    K: kube::Resource<DynamicType = ()>,
{
    let probe = live::list_page_as::<K>(
        client,
        &(),
        1,
        PageFrom::Current,
        ListShape::Metadata,
        "probe",
    )
    .await
    .context("the one-item LIST")?;
    live::count_at::<K>(client, &(), &probe.resource_version, "count")
        .await
        .context("the count at that resourceVersion")?
        .context("the server gave no count")
}

/// Sends one request of `requests`, the `k`th of the window.
async fn send(
    client: &Client,
    workload: &BenchWorkload,
    requests: Requests,
    k: usize,
) -> Result<()> {
    match requests {
        Requests::None => Ok(()),
        Requests::Get => {
            let pod = &workload.pods[k % workload.pods.len()];
            let key = ObjectKey::new(&pod.namespace, &pod.name);
            match live::get_meta::<Pod>(client, &(), &key).await? {
                LiveRead::Found(_) => Ok(()),
                LiveRead::Gone => bail!("pod {}/{} is gone", pod.namespace, pod.name),
            }
        }
        Requests::CountPods => expect_count(count_check::<Pod>(client).await?, workload.pods.len()),
        Requests::CountServices => expect_count(
            count_check::<Service>(client).await?,
            workload.services.len(),
        ),
        Requests::Renew => {
            let renewed = json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } });
            Api::<Lease>::namespaced(client.clone(), NAMESPACE)
                .patch(LEASE, &PatchParams::default(), &Patch::Strategic(renewed))
                .await?;
            Ok(())
        }
    }
}

/// The Lease the `renew` window renews, held by no one else.
async fn create_lease(client: &Client) -> Result<()> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            namespace: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(LEASE.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &lease)
        .await
        .context("creating the Lease to renew")?;
    Ok(())
}

fn expect_count(counted: u64, created: usize) -> Result<()> {
    if counted < created as u64 {
        bail!("counted {counted}, fewer than the {created} created");
    }
    Ok(())
}

/// What one window measured.
struct Window {
    round: u32,
    requests: Requests,
    sent: u64,
    plane_cpu_s: f64,
    response_bytes: f64,
    window_s: f64,
}

async fn measure(
    cp: &ControlPlane,
    workload: &BenchWorkload,
    opts: &Options,
    requests: Requests,
    round: u32,
) -> Result<Window> {
    let client = cp.client();
    plane::collect_garbage(cp, &client).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = PlaneSample::read(cp, &client).await?;
    let started = Instant::now();
    let end = started + opts.window;
    let mut sent = 0;
    if requests == Requests::None {
        tokio::time::sleep_until(end.into()).await;
    } else {
        let mut ticker = tokio::time::interval(Duration::from_secs(1) / opts.rate);
        while Instant::now() < end {
            ticker.tick().await;
            send(&client, workload, requests, sent as usize)
                .await
                .with_context(|| format!("a {} request", requests.name()))?;
            sent += 1;
        }
    }
    let window_s = started.elapsed().as_secs_f64();
    let after = PlaneSample::read(cp, &client).await?;
    let spend = after.since(&before, window_s);
    Ok(Window {
        round,
        requests,
        sent,
        plane_cpu_s: spend.apiserver_cpu_s + spend.etcd_cpu_s,
        response_bytes: spend.response_bytes,
        window_s,
    })
}

/// The requests endpoints-guard makes at rest, from its defaults.
struct AtRest {
    /// The ghost scan's reads a second: one pass over every pod and
    /// Service per period, within the scan's floor and cap.
    scan_reads_per_s: f64,
    /// Count checks a second, each of pods, Services and Endpoints.
    count_checks_per_s: f64,
    /// The leader's Lease renewals a second.
    renewals_per_s: f64,
}

impl AtRest {
    fn of(defaults: &GuardDefaults, objects: usize) -> Result<Self> {
        let period = defaults
            .ghost_scan_period
            .context("the binary has no --ghost-scan-period")?;
        if defaults.resync_interval.is_zero() || period.is_zero() {
            bail!(
                "a zero --resync-interval or --ghost-scan-period makes no count checks or scan to price"
            );
        }
        Ok(Self {
            scan_reads_per_s: (objects as f64 / period.as_secs_f64()).clamp(
                GHOST_SCAN_MIN_QPS,
                defaults.ghost_scan_qps.max(GHOST_SCAN_MIN_QPS),
            ),
            count_checks_per_s: 1.0 / defaults.resync_interval.as_secs_f64(),
            renewals_per_s: 1.0
                / defaults
                    .lease_renewal_every
                    .filter(|every| !every.is_zero())
                    .context("the binary's --help gives no Lease renewal interval")?
                    .as_secs_f64(),
        })
    }

    /// kube-apiserver + etcd CPU-s a minute, Endpoints only, at `cost`:
    /// Endpoints are as many as Services and their count priced as theirs.
    /// The followers' and the leader's GETs of the Lease are not in it
    /// (kube-lease-manager paces them itself); each costs about a `get`.
    fn minute(&self, cost: &Costs) -> f64 {
        60.0 * (self.scan_reads_per_s * cost.get
            + self.count_checks_per_s * (cost.count_pods + 2.0 * cost.count_services)
            + self.renewals_per_s * cost.renew)
    }
}

/// kube-apiserver + etcd CPU-s of one request of each kind.
struct Costs {
    get: f64,
    count_pods: f64,
    count_services: f64,
    renew: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let opts = parse()?;
    // The binary whose defaults price the minute at rest, as eg-bench picks it.
    let binary = guard_binary(&workspace_root()?);
    if !binary.exists() {
        bail!(
            "{} does not exist: build it (cargo build --release -p endpoints-guard) or set EG_BINARY",
            binary.display()
        );
    }
    let defaults = GuardDefaults::of_binary(&binary).await?;
    let mut options = plane_options();
    // Its checks would land in some windows and not others; what they cost
    // is the bench's to measure.
    options
        .apiserver_args
        .push("--feature-gates=DetectCacheInconsistency=false".into());
    let cp = ControlPlane::start(options).await?;
    let workload = BenchWorkload::created(&opts.size, &cp.client()).await?;
    create_lease(&cp.client()).await?;
    cp.compact_etcd().await?;
    let mut windows = Vec::new();
    for round in 1..=opts.repeat {
        for requests in round_order(round) {
            let w = measure(&cp, &workload, &opts, requests, round).await?;
            eprintln!(
                "round {round} {:>14}: {} requests; kube-apiserver + etcd {:.2} CPU-s; {:.0} KiB of answers",
                requests.name(),
                w.sent,
                w.plane_cpu_s,
                w.response_bytes / 1024.0
            );
            windows.push(w);
        }
    }
    let objects = workload.pods.len() + workload.services.len();
    let at_rest = AtRest::of(&defaults, objects)?;
    println!(
        "| round | requests | sent | kube-apiserver + etcd CPU-ms a request, beyond `none` | bytes of answers a request |"
    );
    println!("| ---: | --- | ---: | ---: | ---: |");
    let mut minutes = Vec::new();
    for round in 1..=opts.repeat {
        let of = |requests: Requests| {
            windows
                .iter()
                .find(|w| w.round == round && w.requests == requests)
                .with_context(|| format!("round {round} measured no {} window", requests.name()))
        };
        let idle = of(Requests::None)?;
        let per_request = |w: &Window| {
            let cpu =
                (w.plane_cpu_s - idle.plane_cpu_s / idle.window_s * w.window_s) / w.sent as f64;
            let bytes = (w.response_bytes - idle.response_bytes / idle.window_s * w.window_s)
                / w.sent as f64;
            (cpu, bytes)
        };
        let cost_of = |requests: Requests| -> Result<f64> {
            let w = of(requests)?;
            let (cpu, bytes) = per_request(w);
            println!(
                "| {round} | {} | {} | {:.3} | {bytes:.0} |",
                requests.name(),
                w.sent,
                cpu * 1000.0
            );
            Ok(cpu)
        };
        let costs = Costs {
            get: cost_of(Requests::Get)?,
            count_pods: cost_of(Requests::CountPods)?,
            count_services: cost_of(Requests::CountServices)?,
            renew: cost_of(Requests::Renew)?,
        };
        minutes.push(at_rest.minute(&costs));
    }
    println!();
    println!(
        "At {}'s defaults ({:.2} ghost-scan reads a second over {objects} pods and Services, a count check of pods, Services and Endpoints every {:.0} s, a Lease renewal every {:.0} s; the Lease's GETs and the full resync left out): {} kube-apiserver + etcd CPU-s a minute, rounds 1 to {}.",
        binary.display(),
        at_rest.scan_reads_per_s,
        1.0 / at_rest.count_checks_per_s,
        1.0 / at_rest.renewals_per_s,
        minutes
            .iter()
            .map(|m| format!("{m:.4}"))
            .collect::<Vec<_>>()
            .join(", "),
        opts.repeat
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_measures_each_window_once_and_starts_elsewhere() {
        let first: Vec<Requests> = (1..=5).map(|r| round_order(r)[0]).collect();
        for requests in ORDER {
            assert_eq!(first.iter().filter(|r| **r == requests).count(), 1);
            for round in 1..=5 {
                assert_eq!(
                    round_order(round)
                        .iter()
                        .filter(|r| **r == requests)
                        .count(),
                    1
                );
            }
        }
    }

    const DEFAULTS: GuardDefaults = GuardDefaults {
        resync_interval: Duration::from_secs(90),
        ghost_scan_qps: 5.0,
        full_resync_interval: Some(Duration::from_secs(1200)),
        ghost_scan_period: Some(Duration::from_secs(6 * 3600)),
        lease_renewal_every: Some(Duration::from_secs(5)),
    };

    #[test]
    fn the_scan_is_paced_within_its_floor_and_cap() {
        let reads = |objects| {
            AtRest::of(&DEFAULTS, objects)
                .map(|r| r.scan_reads_per_s)
                .ok()
        };
        assert_eq!(reads(1_100), Some(0.5));
        assert!((reads(33_000).unwrap_or_default() - 33_000.0 / 21_600.0).abs() < 1e-9);
        assert_eq!(reads(1_000_000), Some(5.0));
    }

    #[test]
    fn a_minute_at_rest_adds_the_scan_the_count_checks_and_the_renewals() -> Result<()> {
        let cost = Costs {
            get: 0.002,
            count_pods: 0.001,
            count_services: 0.0005,
            renew: 0.004,
        };
        // 0.5 reads/s × 2 ms × 60 s, (1 + 2 × 0.5) ms × 60/90, 4 ms × 60/5.
        let minute = AtRest::of(&DEFAULTS, 1_100)?.minute(&cost);
        let expected = 0.06 + 0.002 * 60.0 / 90.0 + 0.004 * 12.0;
        assert!((minute - expected).abs() < 1e-12, "{minute}");
        Ok(())
    }

    #[test]
    fn no_scan_or_resync_is_nothing_to_price() {
        let off = GuardDefaults {
            resync_interval: Duration::ZERO,
            ..DEFAULTS
        };
        assert!(AtRest::of(&off, 1_100).is_err());
        let without = GuardDefaults {
            ghost_scan_period: None,
            ..DEFAULTS
        };
        assert!(AtRest::of(&without, 1_100).is_err());
        let unelected = GuardDefaults {
            lease_renewal_every: None,
            ..DEFAULTS
        };
        assert!(AtRest::of(&unelected, 1_100).is_err());
    }
}
