//! `make bench` in brief, inside `make test`: size S (100 Services × 1,000
//! pods), endpoints-guard (two replicas, as the chart runs it) and
//! kube-controller-manager (default client limits), for Endpoints and then
//! EndpointSlices on the same control plane, 10 s of churn at 10 pods/s,
//! 5 s steady, one resync and nine more under churn, and endpoints-guard's
//! ghost phase for Endpoints. Before the
//! controllers, the control plane runs 8 minutes with none: it holds
//! kube-apiserver's first consistency check of every resource, whose cost
//! is measured; what each controller adds is measured against a window as
//! long as steady with none, taken in its round. It checks that the
//! bench works and the figures that do not depend on machine speed (this
//! is the debug build): every flip reaches the Endpoints (the slices),
//! endpoints-guard writes once per change (slices: no more often than
//! upstream), makes no live reads in steady state, and removes a ghost
//! pod's address within the bound of the path it takes here. Reports go to
//! target/bench-smoke/.
//!
//! The ghost phase takes the short path of docs/ghosts.md: kube-apiserver
//! compacts etcd every [`COMPACTION`], and once compaction has removed every
//! snapshot of its pod cache (pods quiet since churn), it serves the
//! resync's exact list from etcd, without waiting for its consistency check
//! (every 5 to 7.5 minutes). endpoints-guard runs at its defaults, so that
//! is its next resync. kube-controller-manager never finds the ghost: its
//! run would only wait out the timeout, so it reports the phase as not
//! measured, as endpoints-guard's EndpointSlices run does.
//!
//! Needs the control-plane programs: `make controlplane`.

use std::time::Duration;

use crate::common::endpoints_guard;
use eg_bench::{
    self as bench, BenchOptions, BenchSize, Controller, GuardDefaults, Kind, RunResult, report,
};
use eg_harness::binaries::workspace_root;

/// kube-apiserver's `--etcd-compaction-interval` in the smoke.
const COMPACTION: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_s_briefly() -> anyhow::Result<()> {
    let out = workspace_root()?.join("target/bench-smoke");
    let binary = endpoints_guard();
    let defaults = GuardDefaults::of_binary(&binary).await?;
    let mut opts = BenchOptions::new(BenchSize::named("S")?, binary, out.clone());
    opts.churn = Duration::from_secs(10);
    opts.steady = Duration::from_secs(5);
    // Still makes kube-apiserver and etcd collect their garbage before the
    // windows at rest, but waits no longer for their next forced collection.
    opts.collection_offset = Duration::from_secs(1);
    opts.resync_phase_interval = Duration::from_secs(3);
    opts.cold_sync_timeout = Duration::from_secs(120);
    opts.kinds = Kind::ALL.to_vec();
    // Not kube-controller-manager with raised client limits: about 40 s more
    // for two more runs; `make bench` has it.
    opts.controllers = vec![Controller::Guard, Controller::Upstream];
    opts.etcd_compaction_interval = Some(COMPACTION);
    opts.ghost_controllers = vec![Controller::Guard];
    opts.ghost_kinds = vec![Kind::Endpoints];
    // Compaction removes the revisions older than the one it recorded an
    // interval earlier, so pods changed last in churn have no snapshot left
    // after two intervals; the next resync then finds the ghost. One resync
    // more in case the first asked for a resourceVersion compacted away (it
    // then lists the latest state, which the cache serves).
    let bound = 2 * COMPACTION + 2 * defaults.resync_interval;
    opts.ghost_timeout = bound;
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
        ours.steady_is_only_the_scan_and_resync(),
        "in steady state endpoints-guard may only make the ghost scan's GETs, within its budget, and its resync's lists: {:?}",
        steady.requests_by_resource
    );
    // The bench passed neither flag: the binary's own defaults ran.
    assert_eq!(
        ours.resync_interval_s,
        Some(defaults.resync_interval.as_secs_f64())
    );
    assert_eq!(ours.ghost_scan_qps, Some(defaults.ghost_scan_qps));
    let ghost = ours.ghost.as_ref().expect("endpoints-guard's ghost phase");
    let found = ours.ghost_found_s.unwrap_or(f64::INFINITY);
    assert!(
        found <= bound.as_secs_f64(),
        "endpoints-guard: the ghost's address should be gone within {bound:?}: {ghost:?}"
    );
    assert_eq!(ghost.found_s, ours.ghost_found_s);
    eprintln!(
        "bench smoke: ghost {} gone after {found:.1} s ({} resyncs, {} scan reads, kube-apiserver's failed checks {:?}), restored in {:.1} s",
        ghost.pod,
        ghost.resyncs.unwrap_or(0),
        ghost.ghost_scan_reads.unwrap_or(0),
        ghost.apiserver_check_failures,
        ghost.restore_s
    );
    for run in &runs {
        let name = format!("{} {}", run.kind.name(), run.controller.name());
        let rate = run.api_requests_per_s_at_rest;
        assert!(rate.is_some_and(f64::is_finite), "{name}: {rate:?}");
        if run.controller == Controller::Guard {
            assert_eq!(run.guard_replicas, Some(2), "{name}");
            let follower = run.followers_cpu_s_per_min_at_rest;
            assert!(
                follower.is_some_and(|cpu| cpu.is_finite() && cpu >= 0.0),
                "{name}: the follower's CPU at rest: {follower:?}"
            );
        }
        if !(run.kind == Kind::Endpoints && run.controller == Controller::Guard) {
            assert!(
                run.ghost.is_none() && run.ghost_found_s.is_none(),
                "{name}: no ghost phase ran"
            );
        }
    }
    for run in &runs {
        let name = format!("{} {}", run.kind.name(), run.controller.name());
        let plane = [
            run.apiserver_cpu_s_per_min_at_rest,
            run.etcd_cpu_s_per_min_at_rest,
            run.response_bytes_per_min_at_rest,
        ];
        assert!(
            plane.iter().all(|v| v.is_some_and(f64::is_finite)),
            "{name}: what it costs kube-apiserver and etcd at rest: {plane:?}"
        );
        // Each round's own window with no controller is the zero; the one
        // after setup, as long as the checks' window, is kept beside it.
        let baseline = run.control_plane_baseline.unwrap_or_default();
        assert!(
            baseline.window_s > 0.0 && baseline.window_s < 60.0 && baseline.apiserver_cpu_s > 0.0,
            "{name}: the round's window with no controller was measured: {baseline:?}"
        );
        let after_setup = run.control_plane_after_setup.unwrap_or_default();
        assert!(
            after_setup.window_s >= 60.0 && after_setup.apiserver_cpu_s > 0.0,
            "{name}: the window after setup was measured: {after_setup:?}"
        );
        // The window with no controller held kube-apiserver's first
        // consistency check of every resource the controllers watch.
        let checks = run
            .consistency_check
            .as_ref()
            .expect("kube-apiserver's consistency checks measured");
        for (group, resource) in bench::checks::CHECKED {
            let name = bench::checks::resource_name(group, resource);
            assert!(
                checks.resources.get(&name).is_some_and(|r| r.checks >= 1),
                "{name}: no check in the {:.0} s window: {checks:?}",
                checks.window_s
            );
        }
        assert!(
            run.consistency_check_cpu_s_per_min
                .is_some_and(f64::is_finite),
            "{name}: {checks:?}"
        );
        // Those checks are left out of that window's spend at rest.
        assert!(
            after_setup.checks_in_window as usize >= bench::checks::CHECKED.len(),
            "{name}: the window's checks left out: {after_setup:?}"
        );
        let during = run.resync.as_ref().and_then(|r| r.churn.clone());
        match run.controller {
            Controller::Guard => {
                let churn = during.expect("pods flipped through resyncs");
                assert_eq!(
                    churn.resyncs,
                    bench::RESYNCS_UNDER_CHURN,
                    "{name}: {churn:?}"
                );
                assert_eq!(churn.missed, 0, "{name}: flips never seen: {churn:?}");
                assert!(churn.outside_flips > 0, "{name}: {churn:?}");
                assert_eq!(run.churn_p99_during_resync_ms, churn.during_p99_ms);
            }
            _ => assert!(during.is_none() && run.churn_p99_during_resync_ms.is_none()),
        }
    }
    let json = std::fs::read_to_string(out.join("report.json"))?;
    for field in [
        "apiserver_cpu_s_per_min_at_rest",
        "etcd_cpu_s_per_min_at_rest",
        "response_bytes_per_min_at_rest",
        "churn_p99_during_resync_ms",
        "consistency_check_cpu_s_per_min",
        "apf_seats_per_min_at_rest",
    ] {
        assert!(json.contains(field), "report.json has no {field}");
    }
    // The scan's reads are requests at rest, and the resync's lists too:
    // both charged seats by API Priority and Fairness.
    assert!(ours.api_requests_per_s_at_rest.unwrap_or(0.0) > 0.0);
    assert!(
        ours.apf_seats_per_min_at_rest.unwrap_or(0.0) > 0.0,
        "{:?}",
        ours.apf_seats_per_min_at_rest
    );
    let theirs = of(Kind::Endpoints, Controller::Upstream);
    let md = report::markdown(Kind::Endpoints, &runs);
    assert!(
        md.contains(&format!(
            "| {} | {} |",
            report::ghost_text(ours),
            report::ghost_text(theirs)
        )) && report::ghost_text(theirs) == "not measured",
        "report.md should give both controllers' ghost figures:\n{md}"
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
