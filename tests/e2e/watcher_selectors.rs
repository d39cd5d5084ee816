//! hardened-watcher's label and field selectors on a real kube-apiserver:
//! the server applies them to the watcher's LISTs and WATCHes, an object
//! whose labels stop matching leaves the cache (the server's DELETED
//! event), one that starts matching enters it, a resync keeps the cache as
//! it is, and a live read through the selectors finds only what they match.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, ensure};
use eg_harness::{ControlPlane, ControlPlaneOptions};
use hardened_watcher::{Change, ObjectKey, Selectors, Store, Watcher, Whole, live};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use crate::common::eventually;

const NS: &str = "selected";

fn config_map(name: &str, app: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
    }))
    .unwrap_or_default()
}

/// The names in `store`, sorted.
fn names(store: &Store<Whole<ConfigMap>>) -> Vec<String> {
    let mut names: Vec<String> = store.with_cache(|cache| {
        cache
            .iter()
            .map(|cm| cm.0.metadata.name.clone().unwrap_or_default())
            .collect()
    });
    names.sort();
    names
}

async fn cache_holds(store: &Store<Whole<ConfigMap>>, want: &[&str]) -> Result<()> {
    eventually(
        Duration::from_secs(20),
        &format!("the cache holds {want:?}"),
        || async { Ok((names(store) == want).then_some(())) },
    )
    .await
}

async fn relabel(api: &Api<ConfigMap>, name: &str, app: &str) -> Result<()> {
    let patch = json!({"metadata": {"labels": {"app": app}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_server_applies_the_selectors_to_every_request() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace(NS).await?;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(), NS);
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        api.create(&PostParams::default(), &config_map(name, app))
            .await?;
    }
    let candidates = Arc::new(Mutex::new(Vec::new()));
    let seen = candidates.clone();
    let watcher = Watcher::builder(api.clone())
        .labels("app=web")
        .fields("metadata.name!=c")
        .on_change(move |change: &Change<Whole<ConfigMap>>, _| {
            if let Change::DeletionCandidate(cm) = change {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(cm.0.metadata.name.clone().unwrap_or_default());
            }
        })
        .build();
    let store = watcher.store();
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(watcher.run(shutdown));

    cache_holds(&store, &["a"]).await?;
    relabel(&api, "b", "web").await?;
    cache_holds(&store, &["a", "b"]).await?;
    relabel(&api, "a", "db").await?;
    cache_holds(&store, &["b"]).await?;
    let taken = std::mem::take(&mut *candidates.lock().unwrap_or_else(PoisonError::into_inner));
    ensure!(
        taken == ["a"],
        "a left the selector as a deletion: {taken:?}"
    );

    // A resync lists through the same selectors: nothing changes.
    let report = store.resync().await?;
    ensure!(
        report.changes == 0,
        "a resync changed the cache: {report:?}"
    );
    ensure!(
        names(&store) == ["b"],
        "after the resync: {:?}",
        names(&store)
    );

    // A live read through the selectors: b matches, a no longer does, c
    // never did.
    let selectors = Selectors {
        labels: Some("app=web".into()),
        fields: Some("metadata.name!=c".into()),
    };
    let client = cp.client();
    for (name, found) in [("b", true), ("a", false), ("c", false)] {
        let read =
            live::get_selected::<ConfigMap>(&client, &(), &ObjectKey::new(NS, name), &selectors)
                .await?;
        ensure!(
            matches!(read, hardened_watcher::LiveRead::Found(_)) == found,
            "{name}: {read:?}"
        );
    }
    let _ = stop.send(true);
    task.await??;
    Ok(())
}
