//! The watch-chaos scenario matrix: every scenario runs on a fresh real control
//! plane, once with endpoints-guard and once with kube-controller-manager's
//! endpoints controller, both behind the `watch-chaos` proxy. Spurious
//! Endpoints deletions are counted by watches straight to kube-apiserver.
//!
//! `cargo test --test chaos` runs the fast subset; `EG_CHAOS=full` (make
//! chaos) runs them all. Reports: `target/chaos/report.{json,md}` (full) or
//! `target/chaos/fast/` (subset).

mod common;
#[path = "chaos/scenarios.rs"]
mod scenarios;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use common::Guard;
use eg_testsupport::binaries::workspace_root;
use eg_testsupport::chaos::{ChaosProxy, Expected, Observer, Row, watch_convergence, write_report};
use eg_testsupport::{
    ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, Process, ServiceBuilder,
};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use scenarios::{note, scenario};
use serde_json::json;

const NS: &str = "chaos";
const WATCH_CHAOS: &str = env!("CARGO_BIN_EXE_watch-chaos");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Guard,
    Kcm,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Guard => "endpoints-guard",
            Which::Kcm => "kube-controller-manager",
        }
    }
}

enum Controller {
    Guard(Guard),
    Kcm(Process),
}

struct Env {
    cp: ControlPlane,
    proxy: ChaosProxy,
    which: Which,
    controller: Option<Controller>,
    /// Extra kube-controller-manager flags.
    kcm_args: Vec<&'static str>,
}

impl Env {
    async fn new(which: Which, options: ControlPlaneOptions) -> Result<Self> {
        let cp = ControlPlane::start(options).await?;
        let proxy =
            ChaosProxy::start(&cp, std::path::Path::new(WATCH_CHAOS), "watch-chaos").await?;
        cp.create_namespace(NS).await?;
        Ok(Self {
            cp,
            proxy,
            which,
            controller: None,
            kcm_args: Vec::new(),
        })
    }

    async fn start_controller(&mut self) -> Result<()> {
        self.controller = Some(match self.which {
            Which::Guard => Controller::Guard(
                Guard::start(self.proxy.client().await?, &["--resync-interval", "10s"]).await?,
            ),
            Which::Kcm => {
                let kubeconfig = format!("--kubeconfig={}", self.proxy.kubeconfig.display());
                let mut args = vec![
                    kubeconfig.as_str(),
                    "--kube-api-content-type=application/json",
                ];
                args.extend(self.kcm_args.iter().copied());
                Controller::Kcm(
                    self.cp
                        .start_controller_manager("endpoints-controller", &args)?,
                )
            }
        });
        Ok(())
    }

    async fn stop_controller(&mut self) {
        match self.controller.take() {
            Some(Controller::Guard(guard)) => guard.stop().await,
            Some(Controller::Kcm(mut kcm)) => {
                let _ = kcm.stop().await;
            }
            None => {}
        }
    }

    fn prevented(&self) -> f64 {
        match &self.controller {
            Some(Controller::Guard(g)) => ["watch_delete", "missing_from_list", "not_in_cache"]
                .iter()
                .map(|r| {
                    g.metric(&format!(
                        "endpoints_guard_spurious_deletions_prevented_total{{reason=\"{r}\"}}"
                    ))
                })
                .sum(),
            _ => 0.0,
        }
    }

    async fn service(&self, name: &str) -> Result<()> {
        self.cp
            .create_service(
                ServiceBuilder::new(NS, name)
                    .selector("app", name)
                    .port("http", 80, 8080, "TCP"),
            )
            .await
            .map(drop)
    }

    async fn pod(&self, name: &str, app: &str, ip: &str, ready: bool) -> Result<()> {
        self.cp
            .create_pod_with_status(
                PodBuilder::serving(NS, name, app),
                PodStatusSpec::running([ip], ready),
            )
            .await
            .map(drop)
    }

    async fn set_selector(&self, name: &str, app: &str) -> Result<()> {
        let patch = Patch::Merge(json!({"spec": {"selector": {"app": app}}}));
        Api::<Service>::namespaced(self.cp.client(), NS)
            .patch(name, &PatchParams::default(), &patch)
            .await
            .map(drop)
            .with_context(|| format!("patching service {name}"))
    }

    async fn delete_service(&self, name: &str) -> Result<()> {
        Api::<Service>::namespaced(self.cp.client(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .map(drop)
            .with_context(|| format!("deleting service {name}"))
    }

    /// Waits until the namespace matches `expected` (before a fault).
    async fn settle(&self, expected: &Expected) -> Result<()> {
        let client = self.cp.client();
        common::eventually(
            Duration::from_secs(90),
            "the state before the fault",
            || {
                let client = client.clone();
                async move {
                    match expected.check(&client, NS).await? {
                        None => Ok(Some(())),
                        Some(problem) => Err(anyhow::anyhow!(problem)),
                    }
                }
            },
        )
        .await?;
        // Let every watch catch up with the last writes.
        tokio::time::sleep(Duration::from_millis(700)).await;
        Ok(())
    }

    /// Service `name` with one ready pod `<name>-0` at `ip`.
    async fn service_with_pod(&self, name: &str, ip: &str) -> Result<()> {
        self.service(name).await?;
        self.pod(&format!("{name}-0"), name, ip, true).await
    }

    /// Create, delete and create again Service `b` (a new UID), then `c`:
    /// the history a replay brings back.
    async fn churn(&self) -> Result<Expected> {
        self.service_with_pod("b", "10.1.1.1").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.delete_service("b").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.service("b").await?;
        self.service_with_pod("c", "10.1.2.1").await?;
        Ok(Expected::default()
            .service("b", &["10.1.1.1"])
            .service("c", &["10.1.2.1"]))
    }
}

const FAST: [&str; 2] = ["failure-a-delete-oldest-service", "lost-pod-delete"];
const FULL: [&str; 9] = [
    "failure-a-delete-oldest-service",
    "failure-a-old-delete-of-live-service",
    "failure-b-compaction-and-prevkv-nil",
    "lost-service-delete",
    "lost-pod-delete",
    "stale-rv0-list-on-restart",
    "reordered-service-updates",
    "cut-streams-mid-event",
    "apiserver-restart",
];

async fn run(name: &str, which: Which, window: Duration) -> Result<Row> {
    let mut options = ControlPlaneOptions::default();
    if name.starts_with("failure-b") {
        options = options.apiserver_arg("--watch-cache=false");
    }
    let mut env = Env::new(which, options).await?;
    if name.starts_with("stale-rv0") {
        // kube-controller-manager 1.36 starts its informers with a watch-list
        // (sendInitialEvents, RV unset: consistent); with the gate off it makes
        // the classic LIST at resourceVersion=0 that a stale cache answers.
        env.kcm_args.push("--feature-gates=WatchListClient=false");
    }
    let observer = Observer::start(&env.cp.client(), NS);
    let (fault, expected) = scenario(name, &mut env).await?;
    let (converged, seconds, problem) =
        watch_convergence(&env.cp.client(), NS, &expected, fault, window).await;
    let spurious = observer.spurious_deletions();
    let stats = env.proxy.get("/stats").await.unwrap_or_default();
    eprintln!(
        "{name} / {}: spurious {spurious:?}, converged {converged} in {seconds:.1}s {problem:?}; prevented {}; proxy {}",
        which.name(),
        env.prevented(),
        stats["resources"]
    );
    let mut notes = Vec::new();
    if !spurious.is_empty() {
        notes.push(format!(
            "deleted while the Service existed: {}",
            spurious.join(", ")
        ));
    }
    if let Some(problem) = problem {
        notes.push(format!("final state: {problem}"));
    }
    env.stop_controller().await;
    Ok(Row {
        name: name.to_string(),
        controller: which.name().to_string(),
        spurious_deletions: spurious.len(),
        converged,
        converge_seconds: (seconds * 10.0).round() / 10.0,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_matrix() {
    let full = std::env::var("EG_CHAOS").is_ok_and(|v| v == "full");
    let (names, window, dir): (&[&str], _, _) = if full {
        (&FULL, Duration::from_secs(25), "target/chaos")
    } else {
        (&FAST, Duration::from_secs(15), "target/chaos/fast")
    };
    let only = std::env::var("EG_CHAOS_ONLY").ok();
    let mut rows = Vec::new();
    for name in names
        .iter()
        .filter(|n| only.as_deref().is_none_or(|o| n.contains(o)))
    {
        let controllers = match std::env::var("EG_CHAOS_CONTROLLER").as_deref() {
            Ok("guard") => vec![Which::Guard],
            Ok("kcm") => vec![Which::Kcm],
            _ => vec![Which::Guard, Which::Kcm],
        };
        for which in controllers {
            let row = run(name, which, window)
                .await
                .unwrap_or_else(|e| panic!("{name} with {}: {e:#}", which.name()));
            rows.push(row);
        }
    }
    // Whether upstream was hurt is read from its row, not assumed.
    let notes: BTreeMap<String, String> = names
        .iter()
        .map(|n| {
            let (bit, no_harm) = note(n);
            let harmed = rows.iter().any(|r| {
                r.name == *n
                    && r.controller == Which::Kcm.name()
                    && (r.spurious_deletions > 0 || !r.converged)
            });
            let text = if harmed {
                format!("yes: {bit}")
            } else {
                format!("no harm observed: {no_harm}")
            };
            (n.to_string(), text)
        })
        .collect();
    let out = workspace_root().expect("workspace root").join(dir);
    write_report(&out, &rows, &notes).expect("report written");
    println!("{}", eg_testsupport::chaos::markdown(&rows, &notes));
    for row in &rows {
        if row.controller == Which::Guard.name() {
            assert_eq!(
                row.spurious_deletions, 0,
                "endpoints-guard deleted Endpoints of a live Service: {row:?}"
            );
            assert!(row.converged, "endpoints-guard did not converge: {row:?}");
        } else if row.name.starts_with("failure-a") {
            assert!(
                row.spurious_deletions > 0,
                "failure A did not bite upstream, so it proves nothing: {row:?}"
            );
        }
    }
}

/// Regression test for a bug found while building the matrix: when an
/// Endpoints write fails with a long API error, the `FailedToUpdateEndpoint`
/// Warning Event must still be published (events.k8s.io/v1 `note` is limited
/// to 1024 characters; an untruncated note made kube-apiserver reject the
/// Event with 422). The write fails here because the pod has an IP but no
/// `spec.nodeName`, so the address gets `nodeName: ""`, which the API rejects
/// with a long message.
#[tokio::test]
async fn failed_write_event_is_published_even_for_long_errors() {
    use k8s_openapi::api::events::v1::Event;
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    cp.create_namespace(NS).await.expect("namespace");
    let guard = Guard::start(cp.client(), &[]).await.expect("guard starts");
    cp.create_service(
        ServiceBuilder::new(NS, "web")
            .selector("app", "web")
            .port("http", 80, 8080, "TCP"),
    )
    .await
    .expect("service");
    cp.create_pod(
        PodBuilder::new(NS, "web-0")
            .label("app", "web")
            .container_port("http", 8080, "TCP"),
    )
    .await
    .expect("pod");
    cp.set_pod_status(NS, "web-0", PodStatusSpec::ready(["10.1.0.1"]))
        .await
        .expect("status");
    let events: Api<Event> = Api::namespaced(cp.client(), NS);
    let found = common::eventually(
        Duration::from_secs(20),
        "a FailedToUpdateEndpoint Event",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FailedToUpdateEndpoint")))
            }
        },
    )
    .await;
    guard.stop().await;
    found.expect("the failed write is reported as an Event");
}

/// Audit mode observes the upstream controller deleting Endpoints of a live
/// Service. kube-controller-manager's endpoints controller runs behind
/// watch-chaos and gets failure A on command (the steps of the
/// `failure-a-old-delete-of-live-service` scenario): an old DELETE of the
/// live Service `long` is replayed to it, so it deletes `long`'s Endpoints
/// and never re-creates them. endpoints-guard runs in audit mode straight to
/// kube-apiserver (not through the proxy), started once the namespace has
/// settled so that only the fault can move its counter: it must count the
/// deletion and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_mode_observes_upstream_deleting_endpoints_of_live_service() -> Result<()> {
    let started = std::time::Instant::now();
    let mut env = Env::new(Which::Kcm, ControlPlaneOptions::default()).await?;
    let observer = Observer::start(&env.cp.client(), NS);
    env.start_controller().await?;
    env.service_with_pod("long", "10.1.0.1").await?;
    let expected = env.churn().await?.service("long", &["10.1.0.1"]);
    env.settle(&expected).await?;

    let guard = Guard::start(
        env.cp.client(),
        &["--mode", "audit", "--resync-interval", "0"],
    )
    .await?;
    wait_ready(&guard).await?;
    const OBSERVED: &str = "endpoints_guard_observed_spurious_deletions_total";
    assert_eq!(
        guard.metric(OBSERVED),
        0.0,
        "nothing spurious happened before the fault"
    );

    let uid_before = Api::<Service>::namespaced(env.cp.client(), NS)
        .get("long")
        .await?
        .metadata
        .uid;
    env.proxy
        .post(
            "/actions/replay-old-delete",
            json!({"resource": "services", "namespace": NS, "name": "long", "pace_ms": 400}),
        )
        .await?;

    // (1) Upstream really deleted the Endpoints of the live Service: the
    // independent watches saw the DELETE while `long` existed, and they are
    // still gone while the Service is still there.
    common::eventually(
        Duration::from_secs(30),
        "upstream to delete the Endpoints of the live Service long",
        || async {
            let spurious = observer.spurious_deletions();
            Ok(spurious
                .iter()
                .any(|s| s.starts_with("long at "))
                .then_some(()))
        },
    )
    .await?;

    // (2) endpoints-guard counted it.
    common::eventually(
        Duration::from_secs(30),
        "endpoints-guard to count the deletion",
        || async { Ok((guard.metric(OBSERVED) >= 1.0).then_some(())) },
    )
    .await
    .with_context(|| format!("metrics:\n{}", guard.metrics_text()))?;

    let service = Api::<Service>::namespaced(env.cp.client(), NS)
        .get_opt("long")
        .await?;
    assert_eq!(
        service.and_then(|s| s.metadata.uid),
        uid_before,
        "Service long is still the same live Service"
    );
    let endpoints = Api::<Endpoints>::namespaced(env.cp.client(), NS)
        .get_opt("long")
        .await?;
    assert!(
        endpoints.is_none(),
        "upstream never re-creates the Endpoints (and audit mode did not either): {endpoints:?}"
    );

    // (3) endpoints-guard wrote nothing.
    for verb in ["create", "update", "delete"] {
        assert_eq!(
            guard.metric(&format!(
                "endpoints_guard_endpoints_writes_total{{verb=\"{verb}\"}}"
            )),
            0.0,
            "audit mode wrote ({verb})"
        );
    }
    eprintln!(
        "audit observed {} spurious deletion(s); upstream's: {:?}; {:.1}s",
        guard.metric(OBSERVED),
        observer.spurious_deletions(),
        started.elapsed().as_secs_f64()
    );
    guard.stop().await;
    env.stop_controller().await;
    Ok(())
}

/// Waits until the in-process endpoints-guard answers `/readyz` (caches
/// synced), so that it sees the fault as a watch event.
async fn wait_ready(guard: &Guard) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = guard.running.metrics_addr;
    common::eventually(
        Duration::from_secs(30),
        "endpoints-guard /readyz",
        || async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await?;
            stream
                .write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok((answer.split_whitespace().nth(1) == Some("200")).then_some(()))
        },
    )
    .await
}
