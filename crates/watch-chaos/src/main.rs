//! watch-chaos: a reverse proxy in front of kube-apiserver that makes watches
//! fail the way they fail in production. Point any controller at it (with the
//! kubeconfig it writes) and turn faults on with `--fault` or the control API.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use watch_chaos::{self as chaos, FaultSpec, Upstream};

/// A chaos proxy for Kubernetes watches (JSON and protobuf).
#[derive(Debug, Parser)]
#[command(name = "watch-chaos", version, about, long_about = None)]
struct Args {
    /// kubeconfig of the real API server (its CA, and its client certificate
    /// or token, re-read from `tokenFile` every minute). Default: $KUBECONFIG,
    /// then ~/.kube/config, then the in-cluster configuration
    /// (KUBERNETES_SERVICE_HOST/PORT and the pod's ServiceAccount token).
    #[arg(long, env = "KUBECONFIG")]
    upstream_kubeconfig: Option<PathBuf>,

    /// Context of the upstream kubeconfig (default: its current context).
    #[arg(long)]
    context: Option<String>,

    /// Where clients connect (plain HTTP; loopback).
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: SocketAddr,

    /// Where the control API listens.
    #[arg(long, default_value = "127.0.0.1:8002")]
    control: SocketAddr,

    /// Writes a kubeconfig for clients (`server: http://<listen>`) here.
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,

    /// A fault in force from the start: RESOURCE:FAULT[:key=value,...], e.g.
    /// `services:old-delete-rv`, `pods:drop-deletes`, `*:delay:delay_ms=500`.
    /// Faults: old-delete-rv, drop-deletes, duplicate, reorder, prevkv-nil,
    /// error-410, cut-mid-event, refuse, delay, stale-list.
    #[arg(long = "fault", value_parser = FaultSpec::parse_flag)]
    faults: Vec<FaultSpec>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("watch-chaos: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let upstream = Upstream::from_kubeconfig(args.upstream_kubeconfig.as_deref(), args.context)
        .await
        .context("loading the upstream configuration")?;
    let base = upstream.base().to_string();
    let running = chaos::start(upstream, args.listen, args.control, args.faults)
        .await
        .context("starting the proxy")?;
    if let Some(path) = &args.write_kubeconfig {
        std::fs::write(path, chaos::client_kubeconfig(running.proxy_addr))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    tracing::info!(
        proxy = %running.proxy_addr,
        control = %running.control_addr,
        upstream = %base,
        "watch-chaos listening"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        res = tokio::signal::ctrl_c() => res.context("waiting for Ctrl-C")?,
    }
    tracing::info!("stopping");
    Ok(())
}
