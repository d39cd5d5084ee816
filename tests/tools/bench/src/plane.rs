//! What kube-apiserver and etcd spend, read at the start and end of a
//! window: their CPU from /proc ([`procstat`]) and the bytes of the
//! responses kube-apiserver sent (`apiserver_response_sizes_sum`, every
//! request but watches: a watch's bytes are counted only when it ends,
//! minutes after they were sent, in whichever window that falls). A controller's
//! cost to the control plane is a window with it running against the same
//! window with no controller ([`Spend::attributable_per_min`]).
//!
//! Two clocks of the control plane's own run through every window whatever
//! the controller does, and each alone moves a window of a few minutes by
//! more than a controller adds at rest: kube-apiserver's consistency checks
//! (a check of 30,000 pods costs about 2 CPU-seconds, each resource's every
//! 5 to 7.5 minutes) and Go's collection of kube-apiserver's and etcd's
//! heaps, forced every 2 minutes when nothing else triggered one. A window's
//! checks are taken out at their measured cost ([`Spend::with_checks`]);
//! the collections are lined up ([`collect_garbage`]), so that a window
//! starting half a period after one holds one forced collection per
//! [`COLLECTION_PERIOD`] of its length.

use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::Client;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use eg_harness::ControlPlane;
use eg_workload::metrics::sample_sum;
use eg_workload::procstat::CpuSample;

use crate::checks::{CheckCost, CheckDone};

/// Go's forced collection period (`forcegcperiod`): a program whose heap
/// grew too little to trigger a collection gets one two minutes after the
/// last.
pub const COLLECTION_PERIOD: Duration = Duration::from_secs(120);

/// kube-apiserver flag serving `/debug/pprof`, whose heap profile collects
/// first when asked (`gc=1`): [`collect_garbage`].
pub const APISERVER_ARGS: [&str; 1] = ["--profiling=true"];

/// etcd flag serving `/debug/pprof` on its client URL.
pub const ETCD_ARGS: [&str; 1] = ["--enable-pprof"];

/// The control plane's counters at one moment.
#[derive(Clone, Debug, Default)]
pub struct PlaneSample {
    apiserver: CpuSample,
    /// One per etcd member.
    etcd: Vec<CpuSample>,
    response_bytes: f64,
    /// `apiserver_storage_consistency_checks_total`, every resource and status.
    consistency_checks: f64,
    /// The seats API Priority and Fairness charged requests outside the
    /// exempt priority level (the bench's own requests and kube-apiserver's
    /// are exempt).
    apf_seats: f64,
}

/// What the control plane spent over one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spend {
    pub window_s: f64,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    /// Bytes of kube-apiserver's answers to every request but watches.
    pub response_bytes: f64,
    /// Consistency checks kube-apiserver ran on its watch caches.
    #[serde(default)]
    pub consistency_checks: f64,
    /// Seats API Priority and Fairness charged requests outside the exempt
    /// priority level: in a window with one controller, its requests.
    #[serde(default)]
    pub apf_seats: f64,
    /// kube-apiserver's CPU in the consistency checks that ended in the
    /// window, each at its resource's mean cost per check in the window
    /// with no controller ([`Spend::with_checks`]); [`Spend::per_minute`]
    /// and [`Spend::added_over`] leave it out.
    #[serde(default)]
    pub checks_apiserver_cpu_s: f64,
    /// The same for etcd.
    #[serde(default)]
    pub checks_etcd_cpu_s: f64,
    /// Those checks, every resource.
    #[serde(default)]
    pub checks_in_window: u32,
}

/// The three figures of a [`Spend`]: over a minute, or in total.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    pub response_bytes: f64,
    pub apf_seats: f64,
}

impl PlaneSample {
    /// Reads kube-apiserver's and etcd's counters.
    pub async fn read(cp: &ControlPlane, client: &Client) -> Result<Self> {
        let apiserver = cp
            .apiserver_pid()
            .context("kube-apiserver is not running")?;
        let etcd = cp
            .etcd_pids()
            .into_iter()
            .map(CpuSample::read)
            .collect::<Result<Vec<_>>>()?;
        let text = apiserver_metrics(client).await?;
        Ok(Self {
            apiserver: CpuSample::read(apiserver)?,
            etcd,
            response_bytes: sample_sum(&text, "apiserver_response_sizes_sum").unwrap_or(0.0)
                - sample_sum(&text, "apiserver_response_sizes_sum{verb=\"WATCH\"}").unwrap_or(0.0),
            // The series appear with the first check.
            consistency_checks: sample_sum(&text, "apiserver_storage_consistency_checks_total")
                .unwrap_or(0.0),
            apf_seats: sample_sum(&text, SEATS).unwrap_or(0.0)
                - sample_sum(&text, &format!("{SEATS}{{priority_level=\"exempt\"}}"))
                    .unwrap_or(0.0),
        })
    }

    /// What was spent from `earlier` to `self`, `window_s` seconds apart.
    /// A kube-apiserver restarted in between starts its counters from zero:
    /// a counter that went back counts from there.
    pub fn since(&self, earlier: &PlaneSample, window_s: f64) -> Spend {
        let etcd_cpu_s = self
            .etcd
            .iter()
            .zip(earlier.etcd.iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(now, then)| now.since(then.unwrap_or(&CpuSample::default())).0)
            .sum();
        Spend {
            window_s,
            apiserver_cpu_s: self.apiserver.since(&earlier.apiserver).0,
            etcd_cpu_s,
            response_bytes: grown(self.response_bytes, earlier.response_bytes),
            consistency_checks: grown(self.consistency_checks, earlier.consistency_checks),
            apf_seats: grown(self.apf_seats, earlier.apf_seats),
            ..Spend::default()
        }
    }
}

/// Makes kube-apiserver and the etcd member collect their garbage now
/// (their heap profiles with `gc=1`, which [`APISERVER_ARGS`] and
/// [`ETCD_ARGS`] serve). A window starting half a [`COLLECTION_PERIOD`]
/// later, with nothing allocating much, has their forced collections half a
/// period from either end: one per period of its length, not one more or
/// less depending on where it started.
pub async fn collect_garbage(cp: &ControlPlane, client: &Client) -> Result<()> {
    apiserver_text(client, "/debug/pprof/heap?gc=1&debug=1")
        .await
        .context("asking kube-apiserver to collect its garbage (is --profiling on?)")?;
    let url = cp.etcd_client_url();
    let addr = url.strip_prefix("http://").unwrap_or(&url);
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to etcd at {addr}"))?;
    stream
        .write_all(
            format!("GET /debug/pprof/heap?gc=1&debug=1 HTTP/1.0\r\nHost: {addr}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .context("asking etcd to collect its garbage")?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .context("reading etcd's heap profile")?;
    let status = answer.split(|&b| b == b'\n').next().unwrap_or_default();
    let status = String::from_utf8_lossy(status);
    anyhow::ensure!(
        status.split_whitespace().nth(1) == Some("200"),
        "etcd answered {} to GET /debug/pprof/heap (is --enable-pprof on?)",
        status.trim_end()
    );
    Ok(())
}

/// The seats API Priority and Fairness estimated for each request, summed
/// (each request's larger of its initial and final seats).
const SEATS: &str = "apiserver_flowcontrol_work_estimated_seats_sum";

/// kube-apiserver's `/metrics`, as text.
pub async fn apiserver_metrics(client: &Client) -> Result<String> {
    apiserver_text(client, "/metrics")
        .await
        .context("reading kube-apiserver's /metrics")
}

/// What kube-apiserver answers a GET of `path`, as text.
async fn apiserver_text(client: &Client, path: &str) -> Result<String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .with_context(|| format!("building GET {path}"))?;
    client
        .request_text(request)
        .await
        .with_context(|| format!("GET {path}"))
}

/// How much a counter grew from `then` to `now`; one that went back was
/// reset and counts from zero.
fn grown(now: f64, then: f64) -> f64 {
    if now >= then { now - then } else { now }
}

impl Cost {
    /// `self` and `other` spread over `window_s` seconds, a minute of it.
    pub fn plus_spread(self, other: Cost, window_s: f64) -> Cost {
        if window_s <= 0.0 {
            return self;
        }
        let per_min = 60.0 / window_s;
        Cost {
            apiserver_cpu_s: self.apiserver_cpu_s + other.apiserver_cpu_s * per_min,
            etcd_cpu_s: self.etcd_cpu_s + other.etcd_cpu_s * per_min,
            response_bytes: self.response_bytes + other.response_bytes * per_min,
            apf_seats: self.apf_seats + other.apf_seats * per_min,
        }
    }
}

impl Spend {
    /// This window with `checks` (those that ended in it) costed at their
    /// resources' mean per check in `cost`. A resource `cost` saw no check
    /// of is counted in `checks_in_window` but costs nothing.
    pub fn with_checks(mut self, checks: &[CheckDone], cost: &CheckCost) -> Spend {
        self.checks_apiserver_cpu_s = 0.0;
        self.checks_etcd_cpu_s = 0.0;
        self.checks_in_window = 0;
        for check in checks {
            self.checks_in_window += 1;
            let Some(each) = cost.resources.get(&check.resource) else {
                continue;
            };
            if each.checks > 0 {
                let n = f64::from(each.checks);
                self.checks_apiserver_cpu_s += each.apiserver_cpu_s / n;
                self.checks_etcd_cpu_s += each.etcd_cpu_s / n;
            }
        }
        self
    }

    /// kube-apiserver's CPU less its checks'.
    fn apiserver_cpu_s_less_checks(&self) -> f64 {
        self.apiserver_cpu_s - self.checks_apiserver_cpu_s
    }

    /// etcd's CPU less its share of the checks.
    fn etcd_cpu_s_less_checks(&self) -> f64 {
        self.etcd_cpu_s - self.checks_etcd_cpu_s
    }

    fn per_min(&self, value: f64) -> f64 {
        if self.window_s > 0.0 {
            value * 60.0 / self.window_s
        } else {
            0.0
        }
    }

    /// A minute of this window, its consistency checks left out.
    pub fn per_minute(&self) -> Cost {
        Cost {
            apiserver_cpu_s: self.per_min(self.apiserver_cpu_s_less_checks()),
            etcd_cpu_s: self.per_min(self.etcd_cpu_s_less_checks()),
            response_bytes: self.per_min(self.response_bytes),
            apf_seats: self.per_min(self.apf_seats),
        }
    }

    /// This window's spend less what `baseline` spends in as long, both
    /// without their consistency checks: what a controller added over the
    /// whole window.
    pub fn added_over(&self, baseline: &Spend) -> Cost {
        let rate = |value: f64| {
            if baseline.window_s > 0.0 {
                value * self.window_s / baseline.window_s
            } else {
                0.0
            }
        };
        Cost {
            apiserver_cpu_s: self.apiserver_cpu_s_less_checks()
                - rate(baseline.apiserver_cpu_s_less_checks()),
            etcd_cpu_s: self.etcd_cpu_s_less_checks() - rate(baseline.etcd_cpu_s_less_checks()),
            response_bytes: self.response_bytes - rate(baseline.response_bytes),
            apf_seats: self.apf_seats - rate(baseline.apf_seats),
        }
    }

    /// A minute of this window less a minute of `baseline` (the same
    /// control plane with no controller), both without their consistency
    /// checks: what the controller added. Noise
    /// can make it negative; it is reported as measured.
    pub fn attributable_per_min(&self, baseline: &Spend) -> Cost {
        let (with, without) = (self.per_minute(), baseline.per_minute());
        Cost {
            apiserver_cpu_s: with.apiserver_cpu_s - without.apiserver_cpu_s,
            etcd_cpu_s: with.etcd_cpu_s - without.etcd_cpu_s,
            response_bytes: with.response_bytes - without.response_bytes,
            apf_seats: with.apf_seats - without.apf_seats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(window_s: f64, apiserver: f64, etcd: f64, bytes: f64) -> Spend {
        Spend {
            window_s,
            apiserver_cpu_s: apiserver,
            etcd_cpu_s: etcd,
            response_bytes: bytes,
            apf_seats: bytes / 1000.0,
            ..Spend::default()
        }
    }

    fn check(resource: &str) -> CheckDone {
        CheckDone {
            at_s: 0.0,
            resource: resource.to_string(),
            erred: false,
        }
    }

    #[test]
    fn checks_are_left_out_at_their_mean_cost() {
        let mut cost = CheckCost::default();
        cost.resources.insert(
            "core/pods".to_string(),
            crate::checks::ResourceChecks {
                checks: 2,
                errors: 0,
                apiserver_cpu_s: 4.0,
                etcd_cpu_s: 1.0,
            },
        );
        // 120 s with a controller holding one check of the pods and one of a
        // resource the baseline never saw checked, against 240 s with none.
        let with = spend(120.0, 5.0, 1.5, 0.0)
            .with_checks(&[check("core/pods"), check("core/nodes")], &cost);
        assert_eq!(with.checks_in_window, 2);
        assert!((with.checks_apiserver_cpu_s - 2.0).abs() < 1e-9);
        assert!((with.checks_etcd_cpu_s - 0.5).abs() < 1e-9);
        let baseline = spend(240.0, 4.0, 2.0, 0.0).with_checks(&[], &cost);
        let added = with.attributable_per_min(&baseline);
        // (5 - 2) / 2 min - 4 / 4 min; (1.5 - 0.5) / 2 - 2 / 4.
        assert!((added.apiserver_cpu_s - 0.5).abs() < 1e-9);
        assert!(added.etcd_cpu_s.abs() < 1e-9);
        let over = with.added_over(&baseline);
        assert!((over.apiserver_cpu_s - 1.0).abs() < 1e-9);
        // Costed again, not added to what was there.
        let again = with.with_checks(&[check("core/pods")], &cost);
        assert_eq!(again.checks_in_window, 1);
        assert!((again.checks_apiserver_cpu_s - 2.0).abs() < 1e-9);
    }

    #[test]
    fn attributable_is_a_minute_with_less_a_minute_without() {
        // 180 s with a controller against a 90 s baseline.
        let with = spend(180.0, 6.0, 3.0, 3_000_000.0);
        let baseline = spend(90.0, 1.5, 0.75, 150_000.0);
        let added = with.attributable_per_min(&baseline);
        assert!((added.apiserver_cpu_s - 1.0).abs() < 1e-9);
        assert!((added.etcd_cpu_s - 0.5).abs() < 1e-9);
        assert!((added.response_bytes - 900_000.0).abs() < 1e-6);
        assert!((added.apf_seats - 900.0).abs() < 1e-9);
        // Noise below the baseline stays visible.
        let less = spend(60.0, 0.5, 0.5, 0.0).attributable_per_min(&baseline);
        assert!(less.apiserver_cpu_s < 0.0);
        assert_eq!(spend(0.0, 1.0, 1.0, 1.0).per_minute().apiserver_cpu_s, 0.0);
    }

    #[test]
    fn a_full_resync_is_spread_over_its_interval() {
        // 12 s holding one full resync, against 90 s of rest.
        let resync = spend(12.0, 3.0, 1.2, 1_000_000.0);
        let baseline = spend(90.0, 1.5, 0.75, 90_000.0);
        let added = resync.added_over(&baseline);
        assert!((added.apiserver_cpu_s - 2.8).abs() < 1e-9);
        assert!((added.etcd_cpu_s - 1.1).abs() < 1e-9);
        assert!((added.response_bytes - 988_000.0).abs() < 1e-6);
        // Every 20 minutes: a twentieth of it a minute.
        let at_rest = Cost::default().plus_spread(added, 1200.0);
        assert!((at_rest.apiserver_cpu_s - 0.14).abs() < 1e-9);
        assert!((at_rest.apf_seats - 49.4).abs() < 1e-9);
        assert_eq!(Cost::default().plus_spread(added, 0.0), Cost::default());
    }

    #[test]
    fn counters_that_went_back_count_from_zero() {
        let earlier = PlaneSample {
            response_bytes: 1000.0,
            consistency_checks: 4.0,
            ..PlaneSample::default()
        };
        let now = PlaneSample {
            response_bytes: 10.0,
            consistency_checks: 6.0,
            etcd: vec![CpuSample::default()],
            ..PlaneSample::default()
        };
        let spent = now.since(&earlier, 60.0);
        assert_eq!(spent.response_bytes, 10.0);
        assert_eq!(spent.consistency_checks, 2.0);
        assert_eq!(spent.etcd_cpu_s, 0.0);
    }
}
