//! Runs one command beside a local control plane (etcd, kube-apiserver):
//! starts it, runs the command with `HARDENED_WATCHER_TEST_KUBECONFIG` set
//! to its admin kubeconfig, stops it, and exits as the command did. How
//! `make test` gives the hardened-watcher crate's own tests, which know
//! nothing of this repository, a real API server:
//!
//! ```text
//! cargo run -p eg-harness --bin eg-with-controlplane -- cargo test -p hardened-watcher
//! ```

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use eg_harness::{ControlPlane, ControlPlaneOptions};

/// The variable the hardened-watcher crate's tests read.
const KUBECONFIG_VAR: &str = "HARDENED_WATCHER_TEST_KUBECONFIG";

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let mut command = std::env::args_os().skip(1);
    let Some(program) = command.next() else {
        bail!("usage: eg-with-controlplane PROGRAM [ARGS...]");
    };
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let status = tokio::process::Command::new(&program)
        .args(command)
        .env(KUBECONFIG_VAR, cp.kubeconfig_path())
        .status()
        .await
        .with_context(|| format!("running {}", program.to_string_lossy()))?;
    // The control plane stops when dropped, before the exit code is returned.
    drop(cp);
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
