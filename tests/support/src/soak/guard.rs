//! endpoints-guard as a child process (the real binary), so its RSS, CPU,
//! file descriptors and threads can be read from /proc/<pid>.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::loopback;
use crate::process::{Process, free_port};

/// A running endpoints-guard.
pub struct GuardProcess {
    pub process: Process,
    pub metrics_port: u16,
}

impl GuardProcess {
    /// Starts `binary --kubeconfig <kubeconfig> --metrics-addr 127.0.0.1:<free> <args>`,
    /// logging to `log`.
    pub fn start(binary: &Path, kubeconfig: &Path, args: &[&str], log: &Path) -> Result<Self> {
        let metrics_port = free_port()?;
        let mut argv = vec![
            "--kubeconfig".to_string(),
            kubeconfig.display().to_string(),
            "--metrics-addr".to_string(),
            format!("127.0.0.1:{metrics_port}"),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let process = Process::spawn("endpoints-guard", binary, &argv, log)?;
        Ok(Self {
            process,
            metrics_port,
        })
    }

    pub fn pid(&self) -> Result<u32> {
        self.process.pid().context("endpoints-guard is not running")
    }

    /// GET `path` on its metrics server: the body of a 200 answer.
    pub async fn get(&self, path: &str) -> Result<String> {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            loopback::request(self.metrics_port, "GET", path, "text/plain", ""),
        )
        .await
        .context("request to endpoints-guard timed out")??;
        match answer {
            (200, body) => Ok(body),
            (code, body) => Err(anyhow!("GET {path}: {code} {body}")),
        }
    }

    /// Waits until /readyz answers 200 (caches synced).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.process.ensure_running()?;
            if self.get("/readyz").await.is_ok() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!("endpoints-guard not ready after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
