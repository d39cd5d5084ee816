//! endpoints-guard as a child process (the real binary), so its RSS, CPU,
//! file descriptors and threads can be read from /proc/<pid>.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};

use eg_harness::loopback;
use eg_harness::process::{Process, free_port};

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
        loopback::get(self.metrics_port, path).await
    }

    /// Waits until /readyz answers 200 (caches synced).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let port = self.metrics_port;
        self.process
            .wait_until(timeout, Duration::from_millis(200), || async move {
                loopback::get(port, "/readyz").await.map(drop)
            })
            .await
    }
}
