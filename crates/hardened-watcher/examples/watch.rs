//! Watches any resource with the hardened watcher and prints every change it
//! delivers and everything it repaired: relists, stale events ignored,
//! rewinds of the store, ghosts, drift. A deletion candidate is confirmed the
//! way a controller should before acting on it: a GET from etcd decides.
//!
//! ```text
//! cargo run -p hardened-watcher --example watch -- pods
//! cargo run -p hardened-watcher --example watch -- deployments.apps --namespace default --resync 60s
//! ```
//!
//! Uses `$KUBECONFIG` (or in-cluster, or `~/.kube/config`); `RUST_LOG` for
//! the watcher's own log.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use hardened_watcher::{
    Change, Confirmation, DeletionSource, DriftKind, Identity, LiveRead, RestartReason,
    StaleReason, WatchObserver, Watcher, live,
};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::discovery::Discovery;
use tokio::sync::{mpsc, watch};

/// Watch a resource, print what changed and what was repaired.
#[derive(Parser, Debug)]
struct Args {
    /// Plural resource name, with its API group if it has one: `pods`,
    /// `configmaps`, `deployments.apps`.
    resource: String,
    /// Only this namespace (default: all).
    #[arg(long)]
    namespace: Option<String>,
    /// A consistent relist this often (e.g. `30s`); differences the watch
    /// does not explain are reported as drift.
    #[arg(long, value_parser = parse_seconds)]
    resync: Option<Duration>,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = parse_seconds)]
    duration: Option<Duration>,
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let digits = text.trim_end_matches('s');
    digits
        .parse()
        .map(Duration::from_secs)
        .map_err(|_| format!("{text:?}: want seconds, like 30s"))
}

/// Prints what the watcher reports.
struct Printer;

impl WatchObserver for Printer {
    fn restart(&self, resource: &str, reason: RestartReason) {
        println!("{resource}: watch restarted ({})", reason.metric_label());
    }
    fn relist(&self, resource: &str) {
        println!("{resource}: consistent list applied as a diff");
    }
    fn stale_ignored(&self, resource: &str, reason: StaleReason) {
        println!(
            "{resource}: repaired: a stale event was ignored ({})",
            reason.metric_label()
        );
    }
    fn rv_regression(&self, resource: &str) {
        println!(
            "{resource}: an event's resourceVersion was below the resume point; resume point kept"
        );
    }
    fn undecodable(&self, resource: &str) {
        println!("{resource}: an undecodable object was skipped");
    }
    fn deletion_candidate(&self, resource: &str, source: DeletionSource) {
        println!(
            "{resource}: deletion candidate ({}), to confirm",
            source.metric_label()
        );
    }
    fn drift(&self, resource: &str, kind: DriftKind) {
        println!(
            "{resource}: repaired: drift the watch missed ({})",
            kind.metric_label()
        );
    }
    fn store_rewind(&self, resource: &str) {
        println!(
            "{resource}: repaired: the store was rewound (etcd restored?); the cache started over from a consistent list"
        );
    }
    fn ghost(&self, resource: &str) {
        println!("{resource}: repaired: the API server's watch cache disagreed with etcd");
    }
}

async fn find(client: &Client, resource: &str) -> Result<ApiResource> {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("API discovery")?;
    discovery
        .groups()
        .filter(|g| g.name() == group)
        .flat_map(|g| g.recommended_resources())
        .map(|(ar, _)| ar)
        .find(|ar| ar.plural == plural)
        .ok_or_else(|| anyhow!("no resource {resource:?} on this API server"))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let client = Client::try_default().await.context("kubeconfig")?;
    let ar = find(&client, &args.resource).await?;
    let api: Api<DynamicObject> = match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };

    // Changes are printed at once; deletion candidates are confirmed by a
    // live read on another task (the change handler must not block the watcher).
    let (candidates, mut to_confirm) = mpsc::unbounded_channel::<Arc<Identity>>();
    let on_change = move |change: &Change<Identity>, _arrived| match change {
        Change::Added(o) => println!("ADDED {} rv={}", o.key, o.resource_version),
        Change::Updated { new, .. } => println!("UPDATED {} rv={}", new.key, new.resource_version),
        Change::DeletionCandidate(o) => {
            println!(
                "DELETION CANDIDATE {} (last rv={})",
                o.key, o.resource_version
            );
            let _ = candidates.send(o.clone());
        }
    };
    let (stop, shutdown) = watch::channel(false);
    let watcher = Watcher::builder_with(api, ar.clone())
        .project(|o: DynamicObject| Identity::of(&o))
        .resource(args.resource.as_str())
        .on_change(on_change)
        .observer(Arc::new(Printer))
        .build();
    let store = watcher.store();
    let watcher = tokio::spawn(watcher.run(shutdown.clone()));

    let confirm = {
        let (store, client, ar) = (store.clone(), client.clone(), ar.clone());
        tokio::spawn(async move {
            while let Some(candidate) = to_confirm.recv().await {
                let stamp = store.read_stamp();
                match live::get::<DynamicObject>(&client, &ar, &candidate.key).await {
                    Ok(LiveRead::Gone) => {
                        store.confirm_deleted(
                            &candidate.key,
                            &candidate.uid,
                            Confirmation::LiveRead,
                        );
                        println!("CONFIRMED GONE {} (a GET from etcd agrees)", candidate.key);
                    }
                    Ok(LiveRead::Found(obj)) => {
                        if let Some(summary) = Identity::of(&obj) {
                            store.restore(summary, &stamp);
                        }
                        println!(
                            "repaired: {} still exists; put back in the cache",
                            candidate.key
                        );
                    }
                    Err(err) => println!("could not confirm {}: {err}", candidate.key),
                }
            }
        })
    };

    let resync = args.resync.map(|every| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match store.resync().await {
                    Ok(report) => println!("resync: the list changed {} objects", report.changes),
                    Err(err) => println!("resync failed: {err}"),
                }
            }
        })
    });

    match args.duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => tokio::signal::ctrl_c().await.context("Ctrl-C")?,
    }
    if let Some(resync) = resync {
        resync.abort();
    }
    let _ = stop.send(true);
    watcher.await??;
    confirm.abort();
    println!(
        "{}: {} objects in the cache",
        args.resource,
        store.with_cache(|cache| cache.len())
    );
    Ok(())
}
