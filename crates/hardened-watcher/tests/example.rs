//! The examples against a real kube-apiserver (backed by etcd: the live reads
//! that confirm deletions must reach it). The API server is the one of the
//! kubeconfig named by `HARDENED_WATCHER_TEST_KUBECONFIG`; without it the
//! tests say so and pass without running. The repository's `make test`
//! starts a local control plane and sets it; any disposable cluster does
//! (each test works in a namespace of its own and deletes it).
//!
//! - `watch`: lists, prints a ConfigMap's changes as they come, confirms its
//!   deletion by a read from etcd, and resyncs.
//! - `controller`: a kube-rs `Controller` on the watcher's event stream keeps
//!   a copy of each ConfigMap, and sees a deletion only once etcd agrees.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// Names the kubeconfig of the API server the tests run against.
const KUBECONFIG_VAR: &str = "HARDENED_WATCHER_TEST_KUBECONFIG";

/// The kubeconfig to use, or `None` (and why, printed) to skip.
fn kubeconfig() -> Option<PathBuf> {
    match std::env::var_os(KUBECONFIG_VAR) {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            // Straight to stderr: the test harness captures `println!` of a
            // passing test, and a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {KUBECONFIG_VAR} is not set; set it to the kubeconfig of a real \
                 kube-apiserver with etcd (the repository's `make test` does)"
            );
            None
        }
    }
}

async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A namespace of the test's own, deleted at the test's end (`delete`), so
/// that a shared cluster is left as it was.
struct TestNamespace {
    api: Api<Namespace>,
    name: String,
}

impl TestNamespace {
    async fn create(client: &kube::Client, prefix: &str) -> Result<Self> {
        let api: Api<Namespace> = Api::all(client.clone());
        let name = format!("{prefix}-{}", std::process::id());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns).await?;
        Ok(Self { api, name })
    }

    async fn delete(self) -> Result<()> {
        self.api
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}

/// `cargo test` builds the examples beside the tests: target/<profile>/examples.
fn example(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target/<profile> above the test")?;
    let path = profile.join("examples").join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: `cargo test -p hardened-watcher` builds it",
            path.display()
        );
    }
    Ok(path)
}

fn spawn(name: &str, args: &[&str], kubeconfig: &Path) -> Result<tokio::process::Child> {
    tokio::process::Command::new(example(name)?)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the {name} example"))
}

/// Waits for the example to stop by itself; its stdout.
async fn output(child: tokio::process::Child) -> Result<String> {
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .context("the example did not stop after its time")??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout)
}

fn configmap(name: &str, value: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "data": {"a": value}}),
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_example_prints_changes_and_confirms_a_deletion() -> Result<()> {
    let Some(kubeconfig) = kubeconfig() else {
        return Ok(());
    };
    let client = client(&kubeconfig).await?;
    let ns = TestNamespace::create(&client, "hw-watch").await?;
    let child = spawn(
        "watch",
        &[
            "configmaps",
            "--namespace",
            &ns.name,
            "--resync",
            "3s",
            "--duration",
            "12s",
        ],
        &kubeconfig,
    )?;
    // Let it list first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &configmap("cm", "1")?)
        .await?;
    api.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await?;
    api.delete("cm", &DeleteParams::default()).await?;
    let stdout = output(child).await?;
    let cm = format!("{}/cm", ns.name);
    for line in [
        "configmaps: consistent list applied as a diff".to_owned(),
        format!("ADDED {cm}"),
        format!("UPDATED {cm}"),
        format!("DELETION CANDIDATE {cm}"),
        format!("CONFIRMED GONE {cm} (a GET from etcd agrees)"),
        "resync: the list changed".to_owned(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }
    ns.delete().await
}

/// Polls until `cm-copy` holds `a: want`.
async fn copy_holds(api: &Api<ConfigMap>, want: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let copy = api.get_opt("cm-copy").await?;
        let value = copy
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|data| data.get("a"))
            .cloned();
        if value.as_deref() == Some(want) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("cm-copy holds a={value:?}, not {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_example_reconciles_on_the_event_stream() -> Result<()> {
    let Some(kubeconfig) = kubeconfig() else {
        return Ok(());
    };
    let client = client(&kubeconfig).await?;
    let ns = TestNamespace::create(&client, "hw-controller").await?;
    let child = spawn(
        "controller",
        &["--namespace", &ns.name, "--seconds", "20"],
        &kubeconfig,
    )?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &configmap("cm", "1")?)
        .await?;
    copy_holds(&api, "1").await?;
    api.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await?;
    copy_holds(&api, "2").await?;
    api.delete("cm", &DeleteParams::default()).await?;
    let stdout = output(child).await?;
    for line in [
        "INIT: a complete list follows",
        "INIT DONE",
        "RECONCILED cm: cm-copy holds its 1 keys",
        "DELETE cm (a read from etcd agrees)",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    ns.delete().await
}
