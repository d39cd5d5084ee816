//! Shared by the end-to-end test files: run endpoints-guard in-process against a
//! local control plane, and wait for conditions.

use std::future::Future;
use std::time::{Duration, Instant};

use clap::Parser;
use eg_harness::{ControlPlane, ready_ips};
use endpoints_guard::config::Config;
use endpoints_guard::controller::{self, Running};
use endpoints_guard::startup;
use k8s_openapi::api::core::v1::Endpoints;
use kube::Api;
use tokio::sync::watch;

/// endpoints-guard running inside the test process; stops when dropped.
pub struct Guard {
    pub running: Running,
    shutdown: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Guard {
    /// Starts with `--metrics-addr 127.0.0.1:0` plus `args`. Only the
    /// Endpoints controller runs unless `args` name `--controllers`: the
    /// tests of Endpoints then measure it alone, as their counterpart in
    /// kube-controller-manager runs alone. With `EG_TEST_LOG` set (a
    /// `RUST_LOG` filter, e.g. `endpoints_guard=info`), its log goes to the
    /// test's output.
    pub async fn start(client: kube::Client, args: &[&str]) -> anyhow::Result<Guard> {
        if let Ok(filter) = std::env::var("EG_TEST_LOG") {
            // One subscriber per process: the first Guard of any test installs
            // it, and every later one logs through it.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let mut argv = vec!["endpoints-guard", "--metrics-addr", "127.0.0.1:0"];
        if !args.iter().any(|a| a.starts_with("--controllers")) {
            argv.extend(["--controllers", "endpoints"]);
        }
        argv.extend_from_slice(args);
        let cfg = Config::try_parse_from(argv)?;
        // The rules of the control plane's release, as the binary picks them.
        let rules = startup::kube_rules(&client, &cfg).await?;
        let (tx, rx) = watch::channel(false);
        let (running, done) = controller::start(cfg, client.into(), rules, rx).await?;
        Ok(Guard {
            running,
            shutdown: tx,
            task: Some(tokio::spawn(done)),
        })
    }

    pub fn metrics_text(&self) -> String {
        self.running.metrics().render().unwrap_or_default()
    }

    /// The sum of the samples of `name{labels}` that carry those labels, 0
    /// when none.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics_text(), series)
    }

    /// Asserts that no Endpoints were written (created, updated or deleted),
    /// as audit mode must.
    pub fn assert_wrote_nothing(&self) {
        for verb in ["create", "update", "delete"] {
            assert_eq!(
                self.metric(&format!(
                    "endpoints_guard_endpoints_writes_total{{verb=\"{verb}\"}}"
                )),
                0.0,
                "audit mode wrote ({verb})"
            );
        }
    }

    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The sum of the samples of `series` (see
/// [`eg_workload::metrics::sample_sum`]: labels given must be present,
/// others are added up), 0 when none.
pub fn metric_value(text: &str, series: &str) -> f64 {
    eg_workload::metrics::sample_sum(text, series).unwrap_or(0.0)
}

/// Waits until Endpoints `ns`/`name` exist with exactly the ready addresses
/// `want`, in order; returns them.
pub async fn wait_endpoint_ips(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    want: &[&str],
    timeout: Duration,
) -> anyhow::Result<Endpoints> {
    let api: Api<Endpoints> = Api::namespaced(cp.client(), ns);
    eventually(
        timeout,
        &format!("Endpoints {ns}/{name} with {want:?}"),
        || async { Ok(api.get_opt(name).await?.filter(|ep| ready_ips(ep) == want)) },
    )
    .await
}

/// `write` until it succeeds, for up to 2 minutes (the first error after
/// that): kube-apiserver answers 500 for a while when its etcd client must
/// move off a stopped member, and a client tries again.
pub async fn retried<F, Fut>(mut write: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match write().await {
            Ok(()) => return Ok(()),
            Err(err) if Instant::now() > deadline => return Err(err),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Whether `err` is the API's 409: the object exists (a retried create
/// whose first try went through).
pub fn already_exists(err: &anyhow::Error) -> bool {
    api_code(err) == Some(409)
}

/// Whether `err` is the API's 404: a delete tried again finds it done.
pub fn not_found(err: &anyhow::Error) -> bool {
    api_code(err) == Some(404)
}

fn api_code(err: &anyhow::Error) -> Option<u16> {
    match err.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout`
/// with `what` and the last observation.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "timed out after {timeout:?} waiting for {what} (last error: {last_err:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The endpoints-guard binary, brought up to date for this test run
/// ([`eg_harness::binaries::endpoints_guard`]).
pub fn endpoints_guard() -> std::path::PathBuf {
    match eg_harness::binaries::endpoints_guard() {
        Ok(path) => path,
        Err(err) => panic!("{err:#}"),
    }
}

/// A token of ServiceAccount `namespace/name`, an hour long, as the kubelet
/// would project it.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    use anyhow::Context;
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")
}
