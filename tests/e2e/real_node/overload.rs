//! The overload row on the real node, traffic as the judge: API Priority
//! and Fairness on with in-flight limits two cores can exhaust
//! (`NodeOptions::priority_and_fairness`), kube-controller-manager's
//! endpoint controllers as production runs them (their kube-system
//! ServiceAccounts, `workload-high`) beside endpoints-guard installed by the
//! chart in opt-in scope at its defaults (but for the test's image), and one
//! Deployment behind two Services: `web`, opted in (endpoints-guard's), and
//! `web-plain` (kube-controller-manager's). Both see the same pods, so both
//! controllers answer the same changes.
//!
//! Each phase (the chart's FlowSchemas off, then on by `helm upgrade`) sends
//! traffic to both Services while a server pod goes unready and ready
//! through its probe, quiet first and then while a co-tenant
//! ([`crate::co_tenant`], ConfigMaps: no node would run its filler pods)
//! floods the controllers' API server with LISTs and GETs, with one
//! 3 → 4 → 3 replicas in the middle. Judged per controller: requests failed
//! by wrong endpoints, the time from a pod's change to the slices showing it
//! (p50/p99, quiet and under the flood, from the judge's watch), leader
//! changes, and the APF queue wait of its requests. Required: endpoints-guard
//! fails no request by wrong endpoints, changes no leader with its
//! FlowSchemas, and the flood queued without being refused (else the row
//! proves nothing); the latencies are a report (`overload.json`).
//!
//! `EG_E2E_NODE_ONLY=overload`: a node of its own (the rest of the real-node
//! rows keep APF off), report in `target/e2e-node/overload/`.

use eg_node::traffic::Moment;

use super::opt_in::{PLAIN, cluster_ip, opt_in_web};
use super::*;
use crate::co_tenant::{self, CoTenant, Filler, FloodCounts, apf_waits, percentile};

pub(super) const ROW: &str = "APF overload by a co-tenant";
/// The flood's filler ConfigMaps, concurrent clients and request budget.
const FILLER: usize = 3000;
const FLOOD_CLIENTS: usize = 24;
const FLOOD_MAX_REQUESTS: u64 = 50_000;
/// A server pod unready this long, then ready this long.
const FLIP: Duration = Duration::from_secs(3);

/// `EG_E2E_NODE_ONLY=overload`.
pub(super) fn only() -> bool {
    std::env::var("EG_E2E_NODE_ONLY").as_deref() == Ok("overload")
}

/// The quiet part of a phase and the flood's length.
fn lengths(form: Form) -> (Duration, Duration) {
    match form {
        Form::Full => (Duration::from_secs(20), Duration::from_secs(60)),
        Form::Short => (Duration::from_secs(12), Duration::from_secs(30)),
    }
}

/// One controller's figures in one phase.
#[derive(Debug, Default, serde::Serialize)]
struct Column {
    controller: &'static str,
    service: &'static str,
    /// Pod change → slices (ms), quiet and under the flood, and how many
    /// changes each holds.
    quiet_p50_ms: f64,
    quiet_p99_ms: f64,
    quiet_changes: usize,
    flood_p50_ms: f64,
    flood_p99_ms: f64,
    flood_changes: usize,
    leader_changes: i64,
    /// Mean wait in APF queues of its FlowSchema's requests under the flood.
    apf_wait_mean_ms: f64,
    schema: &'static str,
}

#[derive(Debug, serde::Serialize)]
struct Phase {
    flow_schemas: bool,
    columns: Vec<Column>,
    flood: FloodCounts,
    flood_apf_wait_mean_ms: f64,
}

/// Both columns, both phases.
pub(super) async fn rows(run: &mut Run<'_>) -> Result<()> {
    let cp = &run.node.cp;
    let mut kcm_args = cp.kube_controller_manager_identity()?;
    kcm_args.extend([
        "--leader-elect=true".to_string(),
        "--leader-elect-resource-namespace=kube-system".to_string(),
    ]);
    let kcm_args: Vec<&str> = kcm_args.iter().map(String::as_str).collect();
    let _kcm =
        cp.start_controller_manager("endpoints-controller,endpointslice-controller", &kcm_args)?;
    // The chart's defaults but for the test's image: its Lease, scan and
    // resync, no sidecar.
    run.install_chart_with(&[
        "scope=opt-in",
        "chaos.enabled=false",
        "ghostScanPeriod=6h",
        "resyncInterval=90s",
        "leaderElection.leaseDuration=15s",
        "leaderElection.renewGrace=10s",
        "flowSchemas.enabled=false",
    ])
    .await?;
    run.deploy_workload().await?;
    let services: Api<Service> = Api::namespaced(run.client.clone(), TEST_NS);
    services
        .create(&PostParams::default(), &service(PLAIN))
        .await?;
    let web = ServiceWatch::start(&run.client, TEST_NS, SERVICE, "app=web").await;
    let plain = ServiceWatch::start(&run.client, TEST_NS, PLAIN, "app=web").await;
    opt_in_web(&services, &web).await?;
    let targets = [
        cluster_ip(&services, SERVICE).await?,
        cluster_ip(&services, PLAIN).await?,
    ];
    let tenant = CoTenant::create(&run.node.cp, Filler::ConfigMaps, FILLER).await?;

    let mut phases = Vec::new();
    for flow_schemas in [false, true] {
        if flow_schemas {
            upgrade_chart(run.node, &["--set", "flowSchemas.enabled=true"])?;
        }
        let phase = run_phase(run, flow_schemas, &tenant, [&web, &plain], targets).await?;
        eprintln!("e2e_node: {ROW}: {phase:?}");
        phases.push(phase);
    }
    std::fs::write(
        run.out.join("overload.json"),
        serde_json::to_string_pretty(&json!({"phases": phases}))?,
    )?;
    if let Err(err) = save_controller_logs(&run.client, run.node.cp.log_dir(), "overload").await {
        eprintln!("e2e_node: the controller's logs were not saved: {err:#}");
    }
    for phase in &phases {
        ensure!(
            phase.flood.failed == 0,
            "the flood's requests were refused: {phase:?}"
        );
        ensure!(
            phase.flood_apf_wait_mean_ms > 0.0,
            "the flood never queued: the row proves nothing ({phase:?})"
        );
    }
    let guard_with = phases[1]
        .columns
        .iter()
        .find(|c| c.controller == GUARD)
        .map_or(0, |c| c.leader_changes);
    ensure!(
        guard_with == 0,
        "endpoints-guard changed leader {guard_with} times with its FlowSchemas"
    );
    Ok(())
}

async fn run_phase(
    run: &mut Run<'_>,
    flow_schemas: bool,
    tenant: &CoTenant,
    watches: [&ServiceWatch; 2],
    targets: [SocketAddr; 2],
) -> Result<Phase> {
    let phase_name = match flow_schemas {
        false => format!("{ROW}, without the chart's FlowSchemas"),
        true => format!("{ROW}, with the chart's FlowSchemas"),
    };
    for (watch, target) in watches.iter().zip(targets) {
        wait_published_exactly(watch, 3, Duration::from_secs(60)).await?;
        wait_serving(target, 20, Duration::from_secs(60))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    let (quiet_for, flood_for) = lengths(run.form);
    let leases = [
        (GUARD, SYSTEM_NS, "endpoints-guard"),
        (UPSTREAM, "kube-system", "kube-controller-manager"),
    ];
    let transitions_before = co_tenant::lease_transitions(&run.client, &leases).await?;
    let traffic = targets.map(|target| Traffic::start(target, RATE, MAX_ROW));
    let started = Instant::now();
    flips(watches[1], started + quiet_for).await?;

    let flood_started = Instant::now();
    let deadline = flood_started + flood_for;
    let waits_start = apf_waits(&run.node.cp).await?;
    let flood = tenant.flood(FLOOD_CLIENTS, deadline, FLOOD_MAX_REQUESTS);
    flips(watches[1], flood_started + flood_for / 3).await?;
    let deployments: Api<Deployment> = Api::namespaced(run.client.clone(), TEST_NS);
    scale(&deployments, 4).await?;
    for watch in watches {
        wait_published_exactly(watch, 4, Duration::from_secs(60)).await?;
    }
    scale(&deployments, 3).await?;
    flips(watches[1], deadline).await?;
    let counts = flood.finish().await?;
    let flood_ended = Instant::now();
    let waits_end = apf_waits(&run.node.cp).await?;
    for watch in watches {
        wait_published_exactly(watch, 3, Duration::from_secs(60)).await?;
    }
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let transitions_after = co_tenant::lease_transitions(&run.client, &leases).await?;
    let guard_schema = match flow_schemas {
        true => "endpoints-guard-workload",
        false => "service-accounts",
    };
    let mut columns = Vec::new();
    for ((controller, service, schema), (watch, traffic)) in [
        (GUARD, SERVICE, guard_schema),
        (UPSTREAM, PLAIN, "kube-system-service-accounts"),
    ]
    .into_iter()
    .zip(watches.into_iter().zip(traffic))
    {
        let samples = traffic.finish().await;
        let moments = watch.moments();
        let verdict = judge(&samples, &moments, GRACE, GAP);
        if let Some(first) = samples.iter().find(|s| !s.ok) {
            write_timeline(
                &run.out,
                controller,
                &phase_name,
                first.at,
                &samples,
                &moments,
            )?;
        }
        let lags = lags(&moments);
        let within = |from: Instant, to: Instant| -> Vec<f64> {
            lags.iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, ms)| *ms)
                .collect()
        };
        let (quiet, under) = (
            within(started, flood_started),
            within(flood_started, flood_ended),
        );
        let column = Column {
            controller,
            service,
            quiet_p50_ms: percentile(&quiet, 0.50),
            quiet_p99_ms: percentile(&quiet, 0.99),
            quiet_changes: quiet.len(),
            flood_p50_ms: percentile(&under, 0.50),
            flood_p99_ms: percentile(&under, 0.99),
            flood_changes: under.len(),
            leader_changes: transitions_after
                .get(controller)
                .copied()
                .unwrap_or_default()
                - transitions_before
                    .get(controller)
                    .copied()
                    .unwrap_or_default(),
            apf_wait_mean_ms: waits_end.mean_ms_since(&waits_start, schema),
            schema,
        };
        let note = format!(
            "pod change → slices p50/p99 {:.0}/{:.0} ms quiet, {:.0}/{:.0} ms under the flood; APF wait {:.2} ms ({schema}); {} leader changes",
            column.quiet_p50_ms,
            column.quiet_p99_ms,
            column.flood_p50_ms,
            column.flood_p99_ms,
            column.apf_wait_mean_ms,
            column.leader_changes
        );
        eprintln!("e2e_node: {controller}: {phase_name}: {verdict:?} {note}");
        run.rows.push(Row::scoped(
            &phase_name,
            controller,
            "opt-in",
            service,
            verdict,
            note,
        ));
        columns.push(column);
    }
    Ok(Phase {
        flow_schemas,
        columns,
        flood: counts,
        flood_apf_wait_mean_ms: waits_end.mean_ms_since(&waits_start, "service-accounts"),
    })
}

/// A ready server pod unready through its probe for [`FLIP`], then ready
/// for as long, until `until`.
async fn flips(watch: &ServiceWatch, until: Instant) -> Result<()> {
    while Instant::now() + 2 * FLIP <= until {
        let (_, ip) = some_ready_pod(watch)?;
        pod_post(&ip, "/unready").await?;
        tokio::time::sleep(FLIP).await;
        pod_post(&ip, "/ready").await?;
        tokio::time::sleep(FLIP).await;
    }
    Ok(())
}

/// Every stretch in which the slices' ready addresses differed from the
/// live Ready pods: when it began and how long it lasted (ms). One still
/// open at the last moment counts up to it.
fn lags(moments: &[Moment]) -> Vec<(Instant, f64)> {
    let mut out = Vec::new();
    let mut open: Option<Instant> = None;
    for moment in moments {
        match (open, moment.published == moment.live) {
            (None, false) => open = Some(moment.at),
            (Some(since), true) => {
                out.push((since, (moment.at - since).as_secs_f64() * 1000.0));
                open = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some(last)) = (open, moments.last()) {
        out.push((since, (last.at - since).as_secs_f64() * 1000.0));
    }
    out
}

/// What the row must show in the report's rows: endpoints-guard failed no
/// request by wrong endpoints in either phase.
pub(super) fn verdict(rows: &[Row]) -> Result<()> {
    let wrong: Vec<_> = rows
        .iter()
        .filter(|r| r.controller == GUARD && r.failed_wrong_endpoints > 0)
        .map(|r| format!("{}: {}", r.name, r.failed_wrong_endpoints))
        .collect();
    ensure!(
        wrong.is_empty(),
        "endpoints-guard failed requests by wrong endpoints: {wrong:?}"
    );
    ensure!(
        rows.iter().filter(|r| r.name.starts_with(ROW)).count() == 4,
        "the overload row lacks a column or a phase: {rows:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn moment(at: Instant, published: &[&str], live: &[&str]) -> Moment {
        let set = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<BTreeSet<_>>();
        Moment {
            at,
            published: set(published),
            live: set(live),
        }
    }

    #[test]
    fn a_lag_runs_from_the_first_differing_moment_to_the_first_agreeing_one() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let moments = [
            moment(ms(0), &["a", "b"], &["a", "b"]),
            moment(ms(100), &["a", "b"], &["a"]),
            moment(ms(150), &["a", "b"], &["a"]),
            moment(ms(400), &["a"], &["a"]),
            moment(ms(500), &["a"], &["a", "c"]),
        ];
        let lags = lags(&moments);
        assert_eq!(lags.len(), 2);
        assert_eq!(lags[0], (ms(100), 300.0));
        assert_eq!(lags[1], (ms(500), 0.0));
    }
}
