//! The binary as an operator meets it: one clear line and a non-zero exit for a
//! bad kubeconfig, an unreachable API server and missing permissions; a clean
//! exit on SIGTERM.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::endpoints_guard;
use eg_harness::process::free_port;
use eg_harness::{ControlPlane, ControlPlaneOptions};

fn run(args: &[&str]) -> Output {
    Command::new(endpoints_guard())
        .args(args)
        .env_remove("KUBECONFIG")
        .env("EG_METRICS_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .output()
        .expect("endpoints-guard runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last line on stderr is the one for the operator.
fn final_line(out: &Output) -> String {
    stderr(out).lines().last().unwrap_or_default().to_string()
}

#[test]
fn help_lists_the_flags() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kubeconfig",
        "--workers",
        "--metrics-addr",
        "--log-format",
        "--namespace",
        "--mode",
        "--resync-interval",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn missing_kubeconfig_is_one_clear_line() {
    let out = run(&["--kubeconfig", "/nonexistent/kubeconfig"]);
    assert!(!out.status.success());
    let line = final_line(&out);
    assert!(
        line.contains("cannot read kubeconfig /nonexistent/kubeconfig"),
        "{line}"
    );
}

/// Flags that cannot work together fail before anything is read or dialled:
/// here the kubeconfig does not even exist.
#[test]
fn bad_leader_election_flags_fail_before_any_connection() {
    // Built (if it must be) before the clock starts.
    endpoints_guard();
    let started = Instant::now();
    let out = run(&[
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--leader-elect",
        "--leader-election-lease-duration",
        "5s",
        "--leader-election-renew-grace",
        "5s",
    ]);
    assert!(!out.status.success());
    let line = final_line(&out);
    assert!(
        line.contains("renew grace") && !line.contains("kubeconfig"),
        "{line}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn malformed_kubeconfig_is_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, "clusters: [this is: not a kubeconfig").expect("write");
    let out = run(&["--kubeconfig", path.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let line = final_line(&out);
    assert!(
        line.contains("kubeconfig") && line.contains(path.to_str().unwrap_or_default()),
        "{line}"
    );
}

#[test]
fn unreachable_api_server_gives_up_after_the_startup_timeout() {
    let port = free_port().expect("port");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("write");
    endpoints_guard();
    let start = Instant::now();
    let out = run(&[
        "--kubeconfig",
        path.to_str().unwrap_or_default(),
        "--startup-timeout",
        "2s",
    ]);
    assert!(!out.status.success());
    assert!(start.elapsed() < Duration::from_secs(20));
    let line = final_line(&out);
    assert!(
        line.contains("cannot reach the API server within 2s"),
        "{line}"
    );
}

/// A ServiceAccount with no RBAC: the API answers 403, and the binary says what
/// it may not do. Then, with admin credentials, SIGTERM stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_then_graceful_shutdown() -> anyhow::Result<()> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::Api;
    use kube::api::PostParams;

    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let sa: ServiceAccount = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "nobody", "namespace": "default"}}),
    )?;
    Api::<ServiceAccount>::namespaced(cp.client(), "default")
        .create(&PostParams::default(), &sa)
        .await?;
    let request: TokenRequest = serde_json::from_value(
        serde_json::json!({"spec": {"audiences": [], "expirationSeconds": 3600}}),
    )?;
    let token = Api::<ServiceAccount>::namespaced(cp.client(), "default")
        .create_token_request("nobody", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .unwrap_or_default();
    let kubeconfig = cp.kubeconfig_for_token("nobody", &token)?;
    let out = run(&["--kubeconfig", kubeconfig.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let line = final_line(&out);
    assert!(
        line.contains("forbidden: these credentials may not list services cluster-wide"),
        "{line}"
    );

    let mut child = Command::new(endpoints_guard())
        .args([
            "--kubeconfig",
            cp.kubeconfig_path().to_str().unwrap_or_default(),
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(child.try_wait()?.is_none(), "still running");
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on our own, not yet reaped child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        anyhow::ensure!(Instant::now() < deadline, "no exit 15 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        pipe.read_to_string(&mut err)?;
    }
    assert!(status.success(), "exit status {status:?}; stderr:\n{err}");
    assert!(err.contains("signal received; stopping"), "{err}");
    Ok(())
}

/// An API server outside the releases whose rules endpoints-guard has: one
/// line naming the range and the flag that overrides the choice. The server
/// is a stand-in that answers `/version` as Kubernetes 1.33 and every list
/// with nothing, so the start-up checks before it pass.
#[test]
fn a_server_outside_the_supported_releases_is_one_clear_line() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let body = if request_line.starts_with("GET /version") {
                r#"{"major":"1","minor":"33","gitVersion":"v1.33.7","platform":"linux/amd64"}"#
            } else {
                r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList","metadata":{},"items":[]}"#
            };
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("write");
    let out = run(&["--kubeconfig", path.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let line = final_line(&out);
    assert!(
        line.contains("Kubernetes 1.33")
            && line.contains("1.34–1.37")
            && line.contains("--kube-rules 1.34|1.35|1.36|1.37"),
        "{line}"
    );
}

/// The rules follow the API server's own minor unless `--kube-rules` says
/// otherwise; a gate locked on that release cannot be turned off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_follow_the_api_server_unless_given() -> anyhow::Result<()> {
    use clap::Parser;
    use endpoints_guard::config::Config;
    use endpoints_guard::desired::KubeRelease;
    use endpoints_guard::startup::kube_rules;

    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    let config = |args: &[&str]| {
        Config::try_parse_from(std::iter::once("endpoints-guard").chain(args.iter().copied()))
    };
    // The release the harness runs (KUBE_VERSION), e.g. v1.34.4 → 1.34.
    let served = &cp.binaries().version;
    let rules = kube_rules(&client, &config(&[])?).await?;
    assert!(
        served.starts_with(&format!("v{}.", rules.release())),
        "{served}: rules of {}",
        rules.release()
    );
    let guard = crate::common::Guard::start(client.clone(), &[]).await?;
    assert_eq!(
        guard.running.rules(),
        rules,
        "the controller runs with them"
    );
    guard.stop().await;

    let other = KubeRelease::ALL
        .into_iter()
        .find(|r| *r != rules.release())
        .expect("another release");
    let given = kube_rules(&client, &config(&["--kube-rules", &other.to_string()])?).await?;
    assert_eq!(given.release(), other);
    let locked = kube_rules(
        &client,
        &config(&[
            "--kube-rules=1.35",
            "--feature-gates=PreferSameTrafficDistribution=false",
        ])?,
    )
    .await;
    assert!(locked.is_err_and(|e| e.to_string().contains("locked on")));
    Ok(())
}
