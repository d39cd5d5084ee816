//! Leader election on a real control plane with two endpoints-guard processes:
//! exactly one writes, the other takes over after the leader is killed (-9)
//! within the lease duration, and the two never lead at once (both leader
//! gauges sampled every 100 ms). And a Lease taken by someone else stops the
//! leader's writes at once, long before its next renewal would notice.
//! Only the leader resyncs and runs the ghost scan; a replica that takes
//! over resyncs at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, endpoints_guard, eventually, metric_value};
use anyhow::{Context, Result, bail};
use eg_harness::loopback;
use eg_harness::process::{Process, free_ports};
use eg_harness::{
    ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder, ready_ips,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};

const NS: &str = "lead";
const LEASE_NS: &str = "default";

/// One endpoints-guard process and the port of its metrics server.
struct Instance {
    name: &'static str,
    process: Process,
    port: u16,
}

impl Instance {
    fn spawn(cp: &ControlPlane, name: &'static str, port: u16, lease: &[&str]) -> Result<Self> {
        let mut args: Vec<String> = vec![
            "--kubeconfig".into(),
            cp.kubeconfig_path().display().to_string(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{port}"),
            "--leader-elect".into(),
            "--leader-election-namespace".into(),
            LEASE_NS.into(),
        ];
        args.extend(lease.iter().map(|s| s.to_string()));
        let log = cp.log_dir().join(format!("endpoints-guard-{name}.log"));
        let process = Process::spawn(name, &endpoints_guard(), &args, &log)?;
        Ok(Self {
            name,
            process,
            port,
        })
    }

    /// (leader gauge, Endpoints writes of any verb); None while unreachable.
    async fn sample(port: u16) -> Option<(bool, f64)> {
        let text =
            tokio::time::timeout(Duration::from_millis(500), loopback::get(port, "/metrics"))
                .await
                .ok()?
                .ok()?;
        let writes: f64 = ["create", "update", "delete"]
            .iter()
            .map(|verb| {
                metric_value(
                    &text,
                    &format!("endpoints_guard_endpoints_writes_total{{verb=\"{verb}\"}}"),
                )
            })
            .sum();
        text.contains("endpoints_guard_leader ")
            .then(|| (metric_value(&text, "endpoints_guard_leader") == 1.0, writes))
    }

    /// (resyncs finished, ghost-scan reads); None while unreachable.
    async fn background_reads(port: u16) -> Option<(f64, f64)> {
        let text = loopback::get(port, "/metrics").await.ok()?;
        Some((
            metric_value(&text, "endpoints_guard_resync_duration_seconds_count"),
            metric_value(&text, "endpoints_guard_ghost_scan_reads_total"),
        ))
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    a: Option<(bool, f64)>,
    b: Option<(bool, f64)>,
}

async fn wait_ips(cp: &ControlPlane, want: &[&str], timeout: Duration) -> Result<()> {
    common::wait_endpoint_ips(cp, NS, "web", want, timeout)
        .await
        .map(drop)
}

async fn add_ready_pod(cp: &ControlPlane, name: &str, ip: &str) -> Result<()> {
    cp.create_pod_with_status(
        PodBuilder::serving(NS, name, "web"),
        PodStatusSpec::ready([ip]),
    )
    .await?;
    Ok(())
}

async fn setup() -> Result<ControlPlane> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace(NS).await?;
    cp.create_service(
        ServiceBuilder::new(NS, "web")
            .selector("app", "web")
            .port("http", 80, 8080, "TCP"),
    )
    .await?;
    add_ready_pod(&cp, "web-0", "10.2.0.1").await?;
    Ok(cp)
}

const LEASE_SECONDS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_and_takeover_within_the_lease_after_kill_9() -> Result<()> {
    let cp = setup().await?;
    // A resync interval longer than the test: a resync can only be the
    // catch-up of a replica that became leader.
    let lease_args = [
        "--leader-election-lease-duration",
        "4s",
        "--leader-election-renew-grace",
        "2s",
        "--resync-interval",
        "10m",
    ];
    let [port_a, port_b] = free_ports::<2>()?;
    let mut instances = [
        Instance::spawn(&cp, "guard-a", port_a, &lease_args)?,
        Instance::spawn(&cp, "guard-b", port_b, &lease_args)?,
    ];

    // Both leader gauges, every 100 ms, for the whole test.
    let start = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                let (a, b) = tokio::join!(Instance::sample(port_a), Instance::sample(port_b));
                let sample = Sample {
                    at: start.elapsed(),
                    a,
                    b,
                };
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(sample);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let latest = |samples: &Arc<Mutex<Vec<Sample>>>| {
        samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .copied()
    };

    let leader = eventually(Duration::from_secs(30), "exactly one leader", || async {
        Ok(match latest(&samples) {
            Some(Sample {
                a: Some((true, _)),
                b: Some((false, _)),
                ..
            }) => Some(0),
            Some(Sample {
                a: Some((false, _)),
                b: Some((true, _)),
                ..
            }) => Some(1),
            _ => None,
        })
    })
    .await?;
    let follower = 1 - leader;
    wait_ips(&cp, &["10.2.0.1"], Duration::from_secs(30)).await?;
    add_ready_pod(&cp, "web-1", "10.2.0.2").await?;
    wait_ips(&cp, &["10.2.0.1", "10.2.0.2"], Duration::from_secs(30)).await?;

    // The second address reaches kube-apiserver's readers before the answer
    // to the write reaches the leader, which counts a write only on its
    // answer: wait for the count rather than read it once.
    let leader_port = instances[leader].port;
    eventually(
        Duration::from_secs(10),
        "the leader to count its two writes",
        || async move {
            Ok(match Instance::sample(leader_port).await {
                Some((_, writes)) if writes >= 2.0 => Some(()),
                _ => None,
            })
        },
    )
    .await?;
    let Some((false, follower_writes)) = Instance::sample(instances[follower].port).await else {
        bail!("the follower claims leadership or is unreachable");
    };
    assert_eq!(follower_writes, 0.0, "the follower wrote");
    // The ghost scan reads at least once every two seconds on the leader.
    eventually(
        Duration::from_secs(10),
        "the leader's ghost scan to read",
        || async move {
            Ok(Instance::background_reads(leader_port)
                .await
                .filter(|(_, reads)| *reads > 0.0)
                .map(drop))
        },
    )
    .await?;
    assert_eq!(
        Instance::background_reads(instances[follower].port).await,
        Some((0.0, 0.0)),
        "the follower resynced or scanned"
    );

    // kill -9 the leader: no release, the Lease must expire.
    let killed = instances[leader].name;
    let pid = instances[leader].process.pid().context("leader pid")?;
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) on our own, not yet reaped, child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed_at = Instant::now();
    // A change nobody writes until the new leader takes over.
    add_ready_pod(&cp, "web-2", "10.2.0.3").await?;

    let follower_port = instances[follower].port;
    eventually(
        Duration::from_secs(LEASE_SECONDS + 10),
        "the follower to take over",
        || async {
            Ok(Instance::sample(follower_port)
                .await
                .filter(|(l, _)| *l)
                .map(|_| ()))
        },
    )
    .await?;
    let takeover = killed_at.elapsed();
    eventually(
        Duration::from_secs(20),
        "the new leader to resync once, catching up",
        || async {
            Ok(Instance::background_reads(follower_port)
                .await
                .filter(|(resyncs, _)| *resyncs == 1.0)
                .map(drop))
        },
    )
    .await?;
    eprintln!(
        "leader election: {killed} killed -9; {} took over after {takeover:?} (lease duration {LEASE_SECONDS}s)",
        instances[follower].name
    );
    // The Lease had at most its duration left; the lease manager then waits up
    // to 1 s (random) after force-releasing an expired Lease, and the watchdog
    // confirms within its poll interval (0.5 s here).
    assert!(
        takeover <= Duration::from_secs(LEASE_SECONDS) + Duration::from_millis(1800),
        "takeover took {takeover:?}"
    );
    wait_ips(
        &cp,
        &["10.2.0.1", "10.2.0.2", "10.2.0.3"],
        Duration::from_secs(20),
    )
    .await?;
    let lease = Api::<Lease>::namespaced(cp.client(), LEASE_NS)
        .get("endpoints-guard")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(!holder.is_empty(), "nobody holds the Lease");

    sampler.abort();
    let samples = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let both: Vec<&Sample> = samples
        .iter()
        .filter(|s| matches!((s.a, s.b), (Some((true, _)), Some((true, _)))))
        .collect();
    assert!(both.is_empty(), "two leaders at once: {both:?}");
    assert!(samples.len() > 20, "only {} samples", samples.len());
    let leads = |s: &Sample, who: usize| {
        let gauge = if who == 0 { s.a } else { s.b };
        matches!(gauge, Some((true, _)))
    };
    let last_old = samples
        .iter()
        .filter(|s| leads(s, leader))
        .map(|s| s.at)
        .max();
    let first_new = samples
        .iter()
        .filter(|s| leads(s, follower))
        .map(|s| s.at)
        .min();
    eprintln!(
        "leader election: {} samples every 100 ms, never two leaders; old leader last seen \
         leading at {last_old:?}, new leader first seen leading at {first_new:?}",
        samples.len()
    );
    instances[follower].process.ensure_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_by_another_holder_stops_writes_at_once() -> Result<()> {
    let cp = setup().await?;
    // Renewals every 6 s; the watchdog polls every second.
    let lease_args = [
        "--leader-election-lease-duration",
        "10s",
        "--leader-election-renew-grace",
        "4s",
    ];
    let [port] = free_ports::<1>()?;
    let mut instance = Instance::spawn(&cp, "guard-solo", port, &lease_args)?;
    eventually(Duration::from_secs(30), "leadership", || async {
        Ok(Instance::sample(port).await.filter(|(l, _)| *l).map(|_| ()))
    })
    .await?;
    wait_ips(&cp, &["10.2.0.1"], Duration::from_secs(30)).await?;

    // Someone else takes the Lease (as a replica that saw it expire would).
    let leases: Api<Lease> = Api::namespaced(cp.client(), LEASE_NS);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({"spec": {
        "holderIdentity": "someone-else",
        "renewTime": now,
        "acquireTime": now,
        "leaseDurationSeconds": 60,
    }});
    leases
        .patch(
            "endpoints-guard",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let taken_at = Instant::now();
    eventually(
        Duration::from_secs(10),
        "the instance to step down",
        || async {
            Ok(Instance::sample(port)
                .await
                .filter(|(l, _)| !*l)
                .map(|_| ()))
        },
    )
    .await?;
    let stepped_down = taken_at.elapsed();
    eprintln!("leader election: stepped down {stepped_down:?} after the Lease was taken");
    assert!(
        stepped_down < Duration::from_millis(2500),
        "stepping down took {stepped_down:?}"
    );

    // No more writes: a new ready pod stays out of the Endpoints.
    let (_, writes_before) = Instance::sample(port).await.context("metrics")?;
    add_ready_pod(&cp, "web-1", "10.2.0.2").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (leading, writes_after) = Instance::sample(port).await.context("metrics")?;
    assert!(!leading);
    assert_eq!(writes_before, writes_after, "wrote without the Lease");
    let ep = Api::<Endpoints>::namespaced(cp.client(), NS)
        .get("web")
        .await?;
    assert_eq!(ready_ips(&ep), ["10.2.0.1"]);
    instance.process.ensure_running()?;
    instance.process.stop().await?;
    Ok(())
}
