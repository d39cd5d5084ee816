//! The `watch` example against a real local control plane: it lists, prints
//! a ConfigMap's changes as they come, confirms its deletion by a read from
//! etcd, and resyncs.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eg_testsupport::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// `cargo test` builds the examples beside the tests: target/<profile>/examples.
fn example() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target/<profile> above the test")?;
    let path = profile.join("examples").join("watch");
    if !path.is_file() {
        bail!(
            "{} is missing: `cargo test -p hardened-watcher` builds it",
            path.display()
        );
    }
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_example_prints_changes_and_confirms_a_deletion() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace("ex").await?;
    let child = tokio::process::Command::new(example()?)
        .args([
            "configmaps",
            "--namespace",
            "ex",
            "--resync",
            "3s",
            "--duration",
            "12s",
        ])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the example")?;
    // Let it list first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), "ex");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}))?;
    api.create(&PostParams::default(), &cm).await?;
    api.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await?;
    api.delete("cm", &DeleteParams::default()).await?;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("the example did not stop after --duration")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "configmaps: consistent list applied as a diff",
        "ADDED ex/cm",
        "UPDATED ex/cm",
        "DELETION CANDIDATE ex/cm",
        "CONFIRMED GONE ex/cm (a GET from etcd agrees)",
        "resync: the list changed",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    Ok(())
}
