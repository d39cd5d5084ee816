//! `make bench` in brief, inside `make test`: size S (100 Services × 1,000
//! pods), endpoints-guard and kube-controller-manager (default client limits), for Endpoints and then EndpointSlices on the same
//! control plane, 10 s of churn at 10 pods/s, 5 s steady, one resync. It
//! checks that the bench works and the figures that do not depend on machine
//! speed (this is the debug build): every flip reaches the Endpoints (the
//! slices), endpoints-guard writes once per change (slices: no more often
//! than upstream) and makes no live reads in steady state. Reports go to
//! target/bench-smoke/.
//!
//! Needs the control-plane programs: `make controlplane`.

use std::path::PathBuf;
use std::time::Duration;

use eg_harness::binaries::workspace_root;
use eg_tools::bench::{self, BenchOptions, BenchSize, Controller, Kind, RunResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_s_briefly() -> anyhow::Result<()> {
    let out = workspace_root()?.join("target/bench-smoke");
    let mut opts = BenchOptions::new(
        BenchSize::named("S")?,
        PathBuf::from(env!("CARGO_BIN_EXE_endpoints-guard")),
        out.clone(),
    );
    opts.churn = Duration::from_secs(10);
    opts.steady = Duration::from_secs(5);
    opts.resync_interval = Duration::from_secs(3);
    opts.cold_sync_timeout = Duration::from_secs(120);
    opts.kinds = Kind::ALL.to_vec();
    // Not kube-controller-manager with raised client limits: about 40 s more
    // for two more runs; `make bench` has it.
    opts.controllers = vec![Controller::Guard, Controller::Upstream];
    let runs = bench::run(opts).await?;
    assert_eq!(runs.len(), 4);
    for run in &runs {
        let name = format!("{} {}", run.kind.name(), run.controller.name());
        assert!(run.cold_sync_s > 0.0, "{name}: {run:?}");
        assert_eq!(run.churn_flips, 100, "{name}");
        assert_eq!(run.churn_failed_writes, 0, "{name}");
        assert_eq!(run.churn_missed, 0, "{name}: flips never seen");
        assert!(run.churn_p99_ms >= run.churn_p50_ms && run.churn_p50_ms > 0.0);
        assert!(run.peak_rss_mb > 0.0 && run.cpu_s > 0.0, "{name}: {run:?}");
        assert!(
            run.requests.get("list").copied().unwrap_or(0)
                + run.requests.get("watch").copied().unwrap_or(0)
                >= 3,
            "{name}: its lists (or streaming watch-lists) should be in the audit log: {:?}",
            run.requests
        );
    }
    let of = |kind: Kind, c: Controller| -> &RunResult {
        runs.iter()
            .find(|r| r.kind == kind && r.controller == c)
            .expect("a run of each kind and controller")
    };
    let ours = of(Kind::Endpoints, Controller::Guard);
    assert_eq!(
        ours.churn_writes, ours.churn_flips,
        "endpoints-guard: one Endpoints write per distinct change"
    );
    let steady = &ours.phases["steady"];
    assert_eq!(steady.writes, 0, "endpoints-guard wrote in steady state");
    assert!(
        ours.steady_is_only_the_ghost_scan(),
        "in steady state endpoints-guard may only make the ghost scan's GETs, within its budget: {:?}",
        steady.requests_by_resource
    );
    let (reads, _, _) = ours.ghost_scan_cost().unwrap_or_default();
    assert!(reads > 0, "the ghost scan read nothing in steady state");
    let resync = ours.resync.as_ref().expect("a resync measurement");
    assert!(resync.duration_s > 0.0);
    assert!(resync.requests.get("list").copied().unwrap_or(0) >= 3);
    let (ours, theirs) = (
        of(Kind::EndpointSlices, Controller::Guard),
        of(Kind::EndpointSlices, Controller::Upstream),
    );
    assert!(
        ours.churn_writes <= theirs.churn_writes
            && ours.phases["cold"].writes <= theirs.phases["cold"].writes,
        "endpoints-guard: no more slice writes than upstream (cold {} vs {}, churn {} vs {})",
        ours.phases["cold"].writes,
        theirs.phases["cold"].writes,
        ours.churn_writes,
        theirs.churn_writes
    );
    assert_eq!(
        ours.phases["steady"].writes, 0,
        "endpoints-guard wrote slices in steady state"
    );
    for file in [
        "report.json",
        "report.md",
        "latency-cdf-S.svg",
        "report-endpointslices.json",
        "report-endpointslices.md",
        "latency-cdf-endpointslices-S.svg",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    Ok(())
}
