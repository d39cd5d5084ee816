//! Shared by the end-to-end test files: run endpoints-guard in-process against a
//! local control plane, and wait for conditions.

use std::future::Future;
use std::time::{Duration, Instant};

use clap::Parser;
use endpoints_guard::config::Config;
use endpoints_guard::controller::{self, Running};
use tokio::sync::watch;

/// endpoints-guard running inside the test process; stops when dropped.
pub struct Guard {
    pub running: Running,
    shutdown: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Guard {
    /// Starts with `--metrics-addr 127.0.0.1:0` plus `args`.
    pub async fn start(client: kube::Client, args: &[&str]) -> anyhow::Result<Guard> {
        let mut argv = vec!["endpoints-guard", "--metrics-addr", "127.0.0.1:0"];
        argv.extend_from_slice(args);
        let cfg = Config::try_parse_from(argv)?;
        let (tx, rx) = watch::channel(false);
        let (running, done) = controller::start(cfg, client, rx).await?;
        Ok(Guard {
            running,
            shutdown: tx,
            task: Some(tokio::spawn(done)),
        })
    }

    pub fn metrics_text(&self) -> String {
        self.running.context.metrics.render().unwrap_or_default()
    }

    /// The value of one metric line (`name{labels}` exactly as exposed), 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics_text(), series)
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

pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
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
