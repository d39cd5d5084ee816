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

/// utime + stime of `pid`, in seconds (fields 14 and 15 of /proc/<pid>/stat).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let rest = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("{path}: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("{path}: short"))?
            .parse::<u64>()
            .with_context(|| format!("{path}: field {}", i + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(total as f64
        / if per_second > 0 {
            per_second as f64
        } else {
            100.0
        })
}
