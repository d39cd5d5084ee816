//! `make demo`: start a local control plane, run the endpoints-guard binary
//! against it, create a small workload, and show what came of it: the Endpoints,
//! and a few metric lines. Asks nothing, exits 0 when everything worked.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eg_testsupport::binaries::workspace_root;
use eg_testsupport::process::{Process, free_port};
use eg_testsupport::{
    ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder,
};
use k8s_openapi::api::core::v1::Endpoints;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn controller_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("EG_BINARY") {
        return Ok(PathBuf::from(path));
    }
    let path = workspace_root()?.join("target/release/endpoints-guard");
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --release` (make demo does)",
            path.display()
        );
    }
    Ok(path)
}

/// A plain HTTP/1.0 GET on loopback: status code and body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await?;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((buf.as_str(), ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

fn step(text: &str) {
    println!("\n==> {text}");
}

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    step("starting a local control plane (etcd + kube-apiserver on 127.0.0.1)");
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    println!(
        "    API server {}  (logs in {})",
        cp.server_url(),
        cp.log_dir().display()
    );

    step("starting endpoints-guard");
    let port = free_port()?;
    let binary = controller_binary()?;
    let args: Vec<String> = [
        "--kubeconfig",
        &cp.kubeconfig_path().display().to_string(),
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--resync-interval",
        "30s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut guard = Process::spawn(
        "endpoints-guard",
        &binary,
        &args,
        &cp.log_dir().join("endpoints-guard.log"),
    )?;
    println!("    {} {}", binary.display(), args.join(" "));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = http_get(port, "/readyz").await {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "endpoints-guard did not become ready; its log:\n{}",
                guard.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("    ready (/readyz answers 200)");

    step("creating namespace demo: Service web (ports http, metrics) and three pods");
    cp.create_namespace("demo").await?;
    cp.create_service(
        ServiceBuilder::new("demo", "web")
            .selector("app", "web")
            .named_port("http", 80, "http", "TCP")
            .port("metrics", 9090, 9090, "TCP"),
    )
    .await?;
    for (name, ip, ready) in [
        ("web-0", "10.0.0.10", true),
        ("web-1", "10.0.0.11", true),
        ("web-2", "10.0.0.12", false),
    ] {
        cp.create_pod(
            PodBuilder::new("demo", name)
                .label("app", "web")
                .container_port("http", 8080, "TCP")
                .node_name("node-a"),
        )
        .await?;
        let status = if ready {
            PodStatusSpec::ready([ip])
        } else {
            PodStatusSpec::not_ready([ip])
        };
        cp.set_pod_status("demo", name, status).await?;
        println!(
            "    pod {name} ip {ip} {}",
            if ready { "Ready" } else { "not ready" }
        );
    }

    step("Endpoints demo/web as endpoints-guard wrote them");
    let api: Api<Endpoints> = Api::namespaced(cp.client(), "demo");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ep = loop {
        if let Some(ep) = api.get_opt("web").await? {
            let s = ep.subsets.as_ref().and_then(|s| s.first());
            let ready = s.and_then(|s| s.addresses.as_ref()).map_or(0, Vec::len);
            let not_ready = s
                .and_then(|s| s.not_ready_addresses.as_ref())
                .map_or(0, Vec::len);
            if ready == 2 && not_ready == 1 {
                break ep;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "Endpoints demo/web did not converge; endpoints-guard log:\n{}",
                guard.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut shown = ep.clone();
    shown.metadata.managed_fields = None;
    print!(
        "{}",
        serde_yaml::to_string(&shown).context("rendering Endpoints")?
    );

    step("a few metric lines from /metrics");
    let (_, metrics) = http_get(port, "/metrics").await?;
    for line in metrics.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("endpoints_guard_endpoints_writes_total")
                || l.starts_with("endpoints_guard_cache_objects")
                || l.starts_with("endpoints_guard_reconciles_total")
                || l.starts_with("endpoints_guard_spurious_deletions_prevented_total"))
    }) {
        println!("    {line}");
    }

    step("stopping endpoints-guard (SIGTERM) and the control plane");
    guard.stop().await?;
    drop(cp);
    println!("\ndemo finished in {:.0}s", started.elapsed().as_secs_f64());
    Ok(())
}
