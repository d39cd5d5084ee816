//! endpoints-guard: parse the flags, set up logging, check the API server, run
//! until SIGTERM or Ctrl-C, shut down cleanly.

use anyhow::Context as _;
use clap::Parser;
use endpoints_guard::commands;
use endpoints_guard::config::{Config, LogFormat};
use endpoints_guard::{controller, startup};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

// glibc's allocator took about a fifth of the controller's CPU in churn at
// size M (perf: malloc_consolidate, _int_malloc, unlink_chunk, free), most of
// it merging freed small blocks whenever a large buffer was asked for.
// jemalloc keeps small sizes in their own slabs, for less CPU at the same
// peak RSS (glibc, jemalloc and two mimalloc builds: docs/bench-runs.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cfg = Config::parse();
    init_tracing(cfg.log_format);
    let result = runtime(cfg.worker_threads)
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(run(cfg)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line an operator can act on: parser errors (YAML, JSON) span
            // several lines with a source excerpt; fold them.
            let line = format!("{err:#}")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            tracing::error!("{line}");
            eprintln!("endpoints-guard: {line}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// One thread: a current-thread runtime; more: a multi-thread one.
fn runtime(threads: u16) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(threads));
        builder
    };
    builder.enable_all().build()
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    if let Some(command) = &cfg.command {
        let client = startup::client(&cfg).await?;
        commands::run(&client, command, cfg.namespace.as_deref()).await?;
        return Ok(());
    }
    cfg.validate()
        .map_err(|why| anyhow::anyhow!("configuration: {why}"))?;
    let clients = startup::clients(&cfg).await?;
    startup::preflight(&clients.work, &cfg).await?;
    let rules = startup::kube_rules(&clients.work, &cfg).await?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (_running, done) = controller::start(cfg, clients, rules, shutdown_rx)
        .await
        .context("starting the controller")?;
    let done = tokio::spawn(done);
    wait_for_signal().await?;
    tracing::info!("signal received; stopping");
    let _ = shutdown_tx.send(true);
    done.await.context("controller task")?;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        res = tokio::signal::ctrl_c() => res.context("waiting for Ctrl-C")?,
    }
    Ok(())
}
