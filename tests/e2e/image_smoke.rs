//! `make image-smoke` (hack/image-smoke.sh builds the image, then runs this
//! with `EG_IMAGE_SMOKE=1`): the runtime image, run by Docker as the chart runs
//! it (read-only root, uid/gid 65532, every capability dropped, no new
//! privileges) on the host network against a local control plane. Its only
//! credentials are a token of the chart's ServiceAccount, bound to the chart's
//! roles from deploy/endpoints-guard.yaml, mounted where in-cluster config
//! reads it. It must become ready, take the leader Lease, reconcile the demo
//! Service (Endpoints and EndpointSlice) and serve `/metrics`.
//!
//! Without `EG_IMAGE_SMOKE=1` (plain `cargo test`, `make test`) it passes
//! without doing anything: CI may have no Docker. See docs/image-smoke.md.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{eventually, metric_value};
use anyhow::{Context, Result, bail};
use eg_harness::loopback;
use eg_harness::process::free_port;
use eg_harness::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;

/// The chart's release name: its namespace, ServiceAccount, roles and Lease.
const RELEASE: &str = "endpoints-guard";
/// The demo pod's address, which Endpoints and EndpointSlice must list.
const POD_IP: &str = "10.1.0.5";
/// What the Deployment's `POD_NAME` would be; the Lease holder must be it.
const POD_NAME: &str = "endpoints-guard-image-smoke";
/// Where in-cluster config reads the token, CA and namespace.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_runs_as_the_chart_runs_it() -> Result<()> {
    if std::env::var("EG_IMAGE_SMOKE").as_deref() != Ok("1") {
        eprintln!(
            "image_smoke: skipped: set EG_IMAGE_SMOKE=1 with an image built (run 'make image-smoke')"
        );
        return Ok(());
    }
    let image =
        std::env::var("EG_IMAGE_SMOKE_IMAGE").unwrap_or_else(|_| "endpoints-guard:smoke".into());
    let start = Instant::now();
    let step = Instant::now();
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    say(format!(
        "control plane ready at {} in {:.1?}",
        cp.server_url(),
        step.elapsed()
    ));

    let step = Instant::now();
    let applied = apply_chart_rbac(&client).await?;
    let token = crate::common::service_account_token(&client, RELEASE, RELEASE).await?;
    let secrets = tempfile::Builder::new()
        .prefix("eg-image-smoke-sa-")
        .tempdir()?;
    write_service_account_dir(secrets.path(), &token, cp.ca_pem())?;
    say(format!(
        "applied from deploy/endpoints-guard.yaml: {}; token of ServiceAccount {RELEASE}/{RELEASE} in {} ({:.1?})",
        applied.join(", "),
        secrets.path().display(),
        step.elapsed()
    ));

    // The demo: a Service and one ready pod on a Node the EndpointSlice
    // controller knows.
    cp.create_namespace("demo").await?;
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "node-a"}}))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    cp.simple_service("demo", "web").await?;
    cp.running_pod("demo", "web-0", "web", POD_IP, true).await?;

    let port = free_port()?;
    let apiserver_port = cp
        .server_url()
        .rsplit(':')
        .next()
        .context("the API server URL has no port")?
        .to_string();
    let step = Instant::now();
    let container = Container::run(
        &image,
        &[
            "--network",
            "host",
            "--read-only",
            "--user",
            "65532:65532",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-v",
            &format!("{}:{SA_DIR}:ro", secrets.path().display()),
            "-e",
            "KUBERNETES_SERVICE_HOST=127.0.0.1",
            "-e",
            &format!("KUBERNETES_SERVICE_PORT={apiserver_port}"),
            "-e",
            &format!("POD_NAME={POD_NAME}"),
        ],
        &[
            "--mode=enforce",
            &format!("--metrics-addr=127.0.0.1:{port}"),
            "--log-format=json",
            // The Lease's namespace comes from the mounted namespace file.
            "--leader-elect",
            "--leader-election-lease-duration=15s",
            "--leader-election-renew-grace=5s",
        ],
    )?;
    say(format!(
        "started container {} of {image} in {:.1?}",
        container.short_id(),
        step.elapsed()
    ));
    let result = check(&client, &container, port, start).await;
    if result.is_err() {
        eprintln!("--- image-smoke: container log\n{}", container.logs());
    }
    result?;
    let step = Instant::now();
    let code = container.stop()?;
    say(format!(
        "docker stop: exit code {code} after {:.1?}",
        step.elapsed()
    ));
    if code != 0 {
        eprintln!("--- image-smoke: container log\n{}", container.logs());
        bail!("endpoints-guard exited with {code} on SIGTERM, want 0");
    }
    say(format!("passed in {:.1?}", start.elapsed()));
    Ok(())
}

async fn check(client: &Client, container: &Container, port: u16, start: Instant) -> Result<()> {
    // The process as the kernel sees it: what Docker was told, enforced.
    let status = container.process_status()?;
    for (field, want) in [
        ("Uid", "65532"),
        ("Gid", "65532"),
        ("CapEff", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
    ] {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .with_context(|| format!("/proc/<pid>/status has no {field}"))?;
        let values: Vec<&str> = line.split_whitespace().skip(1).collect();
        if values.is_empty() || values.iter().any(|v| *v != want) {
            bail!("container process: {line:?}, want every value {want}");
        }
    }
    let read_only = container.inspect("{{.HostConfig.ReadonlyRootfs}}")?;
    if read_only != "true" {
        bail!("ReadonlyRootfs is {read_only}");
    }
    say("process runs as 65532:65532, no capabilities, no_new_privs, read-only root".into());

    let step = Instant::now();
    let ready = eventually(Duration::from_secs(60), "/readyz 200", || async {
        container.ensure_running()?;
        Ok(loopback::get(port, "/readyz").await.ok())
    })
    .await;
    ready?;
    say(format!(
        "/readyz 200 after {:.1?} ({:.1?} since the start)",
        step.elapsed(),
        start.elapsed()
    ));

    let step = Instant::now();
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "demo");
    eventually(
        Duration::from_secs(60),
        "demo/web Endpoints listing the pod",
        || async {
            container.ensure_running()?;
            let ips: Vec<String> = endpoints
                .get_opt("web")
                .await?
                .iter()
                .flat_map(|e| e.subsets.iter().flatten())
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| a.ip.clone())
                .collect();
            Ok((ips == [POD_IP]).then_some(()))
        },
    )
    .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "demo");
    eventually(
        Duration::from_secs(60),
        "demo/web EndpointSlice listing the pod",
        || async {
            container.ensure_running()?;
            let listed = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await?;
            let ips: Vec<String> = listed
                .items
                .iter()
                .flat_map(|slice| slice.endpoints.iter().flatten())
                .flat_map(|endpoint| endpoint.addresses.iter().cloned())
                .collect();
            Ok((ips == [POD_IP]).then_some(()))
        },
    )
    .await?;
    say(format!(
        "demo/web Endpoints and EndpointSlice list {POD_IP} after {:.1?}",
        step.elapsed()
    ));

    let holder = Api::<Lease>::namespaced(client.clone(), RELEASE)
        .get(RELEASE)
        .await
        .context("the Lease endpoints-guard/endpoints-guard")?
        .spec
        .and_then(|s| s.holder_identity);
    if holder.as_deref() != Some(POD_NAME) {
        bail!("Lease {RELEASE}/{RELEASE} held by {holder:?}, want {POD_NAME}");
    }
    say(format!("Lease {RELEASE}/{RELEASE} held by {POD_NAME}"));

    let metrics = loopback::get(port, "/metrics").await?;
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("endpoints_guard_"))
        .count();
    let created = metric_value(
        &metrics,
        "endpoints_guard_endpoints_writes_total{verb=\"create\"}",
    );
    if series == 0 || created < 1.0 {
        bail!(
            "/metrics: {series} endpoints_guard_ samples, {created} Endpoints created; want some and ≥ 1"
        );
    }
    say(format!(
        "/metrics: {series} endpoints_guard_ samples, {created} Endpoints created"
    ));
    Ok(())
}

fn say(line: String) {
    println!("image-smoke: {line}");
}

/// Creates the chart's Namespace, ServiceAccount and roles from the rendered
/// manifests, as `kubectl apply -f deploy/endpoints-guard.yaml` would (the
/// Deployment, Service and PodDisruptionBudget are left out: Docker runs the
/// pod here). Returns `Kind/name` of each.
async fn apply_chart_rbac(client: &Client) -> Result<Vec<String>> {
    let path = eg_harness::binaries::workspace_root()?.join("deploy/endpoints-guard.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = value["metadata"]["namespace"].as_str().unwrap_or(RELEASE);
        match kind.as_str() {
            "Namespace" => create(Api::<Namespace>::all(client.clone()), value).await?,
            "ClusterRole" => create(Api::<ClusterRole>::all(client.clone()), value).await?,
            "ClusterRoleBinding" => {
                create(Api::<ClusterRoleBinding>::all(client.clone()), value).await?
            }
            "ServiceAccount" => {
                create(
                    Api::<ServiceAccount>::namespaced(client.clone(), namespace),
                    value,
                )
                .await?
            }
            "Role" => create(Api::<Role>::namespaced(client.clone(), namespace), value).await?,
            "RoleBinding" => {
                create(
                    Api::<RoleBinding>::namespaced(client.clone(), namespace),
                    value,
                )
                .await?
            }
            _ => continue,
        }
        applied.push(format!("{kind}/{name}"));
    }
    for want in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        if !applied.iter().any(|a| a.starts_with(&format!("{want}/"))) {
            bail!("{} has no {want}", path.display());
        }
    }
    Ok(applied)
}

async fn create<K>(api: Api<K>, value: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value)?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {object:?}"))?;
    Ok(())
}

/// `token`, `ca.crt` and `namespace`, readable by uid 65532 (the folder is
/// mounted read-only).
fn write_service_account_dir(dir: &Path, token: &str, ca_pem: &str) -> Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for (name, text) in [("token", token), ("ca.crt", ca_pem), ("namespace", RELEASE)] {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// A detached `docker run`, removed (`docker rm -f`) when dropped.
struct Container {
    id: String,
}

impl Container {
    fn run(image: &str, docker_args: &[&str], args: &[&str]) -> Result<Container> {
        let mut cmd = Command::new("docker");
        cmd.args(["run", "-d"])
            .args(docker_args)
            .arg(image)
            .args(args);
        let out = cmd.output().context("running docker")?;
        if !out.status.success() {
            bail!(
                "docker run failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Container {
            id: String::from_utf8(out.stdout)?.trim().to_string(),
        })
    }

    fn short_id(&self) -> &str {
        &self.id[..self.id.len().min(12)]
    }

    fn inspect(&self, format: &str) -> Result<String> {
        docker(&["inspect", "-f", format, &self.id])
    }

    fn ensure_running(&self) -> Result<()> {
        if self.inspect("{{.State.Running}}")? != "true" {
            bail!(
                "the container stopped (exit code {}); its log:\n{}",
                self.inspect("{{.State.ExitCode}}")?,
                self.logs()
            );
        }
        Ok(())
    }

    /// /proc/<pid>/status of endpoints-guard, seen from the host.
    fn process_status(&self) -> Result<String> {
        self.ensure_running()?;
        let pid = self.inspect("{{.State.Pid}}")?;
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))
    }

    fn logs(&self) -> String {
        match Command::new("docker").args(["logs", &self.id]).output() {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(err) => format!("(docker logs failed: {err})"),
        }
    }

    /// `docker stop` (SIGTERM, then SIGKILL after 20 s); the exit code.
    fn stop(&self) -> Result<i64> {
        docker(&["stop", "-t", "20", &self.id])?;
        Ok(self.inspect("{{.State.ExitCode}}")?.parse()?)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.id]).output();
    }
}

fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .context("running docker")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}
