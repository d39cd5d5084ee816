//! A kube-rs `Controller` that runs on the hardened watcher: it keeps a copy
//! of every ConfigMap of a namespace, `<name>-copy`, with the same data.
//!
//! Written for `kube::runtime::watcher`, its stream would be
//!
//! ```text
//! let events = watcher(api, watcher::Config::default()).default_backoff();
//! ```
//!
//! On the hardened watcher it is
//!
//! ```text
//! let events = Watcher::builder(api).resource("configmaps").build().into_event_stream();
//! ```
//!
//! and the rest (reflector, `Controller::for_stream`, reconcile) is
//! unchanged. Every `Delete` it sees was confirmed by a read from etcd.
//!
//! ```text
//! cargo run -p hardened-watcher --example controller -- --namespace default
//! ```
//!
//! Uses `$KUBECONFIG` (or in-cluster, or `~/.kube/config`); `RUST_LOG` for
//! the watcher's own log.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use hardened_watcher::Watcher;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

/// Keep a `<name>-copy` of every ConfigMap of a namespace.
#[derive(Parser, Debug)]
struct Args {
    /// The namespace whose ConfigMaps are copied.
    #[arg(long)]
    namespace: String,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    seconds: Option<u64>,
}

/// The suffix of a copy; copies are not copied again.
const COPY_SUFFIX: &str = "-copy";

/// The field manager of the copies' server-side applies.
const MANAGER: &str = "hardened-watcher-example";

async fn reconcile(cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>) -> Result<Action, kube::Error> {
    let name = cm.name_any();
    if name.ends_with(COPY_SUFFIX) {
        return Ok(Action::await_change());
    }
    let copy_name = format!("{name}{COPY_SUFFIX}");
    // Owned by the original, so that the cluster's garbage collector removes
    // the copy with it.
    let owner = cm.controller_owner_ref(&());
    let copy = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": copy_name, "ownerReferences": owner.into_iter().collect::<Vec<_>>() },
        "data": cm.data,
    });
    api.patch(
        &copy_name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(copy),
    )
    .await?;
    let keys = cm.data.as_ref().map_or(0, |data| data.len());
    println!("RECONCILED {name}: {copy_name} holds its {keys} keys");
    Ok(Action::await_change())
}

fn error_policy(cm: Arc<ConfigMap>, err: &kube::Error, _: Arc<Api<ConfigMap>>) -> Action {
    println!("reconcile of {} failed: {err}", cm.name_any());
    Action::requeue(Duration::from_secs(5))
}

/// What the reflector is told, as a line each.
fn describe(event: &Event<ConfigMap>) -> Option<String> {
    match event {
        Event::Init => Some("INIT: a complete list follows".to_owned()),
        Event::InitDone => Some("INIT DONE".to_owned()),
        Event::Delete(cm) => Some(format!(
            "DELETE {} (a read from etcd agrees)",
            cm.name_any()
        )),
        Event::Apply(_) | Event::InitApply(_) => None,
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let client = Client::try_default().await.context("kubeconfig")?;
    let api: Api<ConfigMap> = Api::namespaced(client, &args.namespace);

    let events = Watcher::builder(api.clone())
        .resource("configmaps")
        .build()
        .into_event_stream()
        .inspect(|event| {
            if let Some(line) = event.as_ref().ok().and_then(describe) {
                println!("{line}");
            }
        });
    let (reader, writer) = reflector::store();
    let configmaps = reflector(writer, events).applied_objects();

    let seconds = args.seconds;
    let stop = async move {
        match seconds {
            Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
            None => {
                // Without a signal handler there is nothing to wait for but
                // the end of the program.
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    Controller::for_stream(configmaps, reader.clone())
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, Arc::new(api))
        .for_each(|_| std::future::ready(()))
        .await;
    println!("stopped with {} ConfigMaps in the reflector", reader.len());
    Ok(())
}
