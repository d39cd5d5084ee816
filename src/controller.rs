//! Wiring: caches and their watchers, the dispatch of changes to the queue, the
//! workers, the periodic resync and the metrics server; run until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch as signal};
use tokio::task::JoinSet;
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::Config;
use crate::desired::PodInfo;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::reconcile::objects::{CachedEndpoints, without_managed_fields};
use crate::reconcile::queue::Retry;
use crate::reconcile::resync::{self, Apis};
use crate::reconcile::{Context, Shared, Stores, WorkQueue, handlers, sync};
use crate::server;
use crate::watch::{self, Cached, Change, WatchConfig, WatchContext, WatchObserver};

fn apis(client: &Client, cfg: &Config) -> Apis {
    match &cfg.namespace {
        Some(ns) => Apis {
            services: Api::namespaced(client.clone(), ns),
            pods: Api::namespaced(client.clone(), ns),
            endpoints: Api::namespaced(client.clone(), ns),
            page_size: cfg.list_page_size,
        },
        None => Apis {
            services: Api::all(client.clone()),
            pods: Api::all(client.clone()),
            endpoints: Api::all(client.clone()),
            page_size: cfg.list_page_size,
        },
    }
}

/// A running controller: where its metrics server listens, and its context (the
/// tests read caches and metrics through it).
pub struct Running {
    pub metrics_addr: SocketAddr,
    pub context: Arc<Context>,
}

/// Starts everything and returns once the server is bound; `done` resolves when
/// the controller has stopped after `shutdown` turned true.
pub async fn start(
    cfg: Config,
    client: Client,
    shutdown: signal::Receiver<bool>,
) -> Result<(Running, impl Future<Output = ()>)> {
    let metrics = Arc::new(Metrics::new()?);
    let stores = Stores::new();
    let queue = WorkQueue::new();
    let reporter = Reporter {
        controller: "endpoints-guard".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let leadership =
        crate::leader::Leadership::start(&cfg, &client, metrics.clone(), shutdown.clone())?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics: metrics.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        mode: cfg.mode,
        stores: stores.clone(),
        queue: queue.clone(),
        trigger_times: Default::default(),
        leader: leadership.receiver(),
    });

    let (ready_tx, ready_rx) = signal::channel(false);
    let (metrics_addr, serve) = server::bind(
        cfg.metrics_addr,
        metrics.clone(),
        server::Health { ready: ready_rx },
        shutdown.clone(),
    )
    .await?;
    info!(%metrics_addr, mode = ?cfg.mode, workers = cfg.workers, "endpoints-guard starting");

    let apis = apis(&client, &cfg);
    let observer: Arc<dyn WatchObserver> = metrics.clone();
    let mut tasks = JoinSet::new();
    tasks.spawn(serve);

    let (svc_tx, svc_rx) = mpsc::unbounded_channel::<Change<Service>>();
    let (pod_tx, pod_rx) = mpsc::unbounded_channel::<Change<PodInfo>>();
    let (ep_tx, ep_rx) = mpsc::unbounded_channel::<Change<CachedEndpoints>>();
    let (svc_synced_tx, mut svc_synced) = signal::channel(false);
    let (pod_synced_tx, mut pod_synced) = signal::channel(false);
    let (ep_synced_tx, mut ep_synced) = signal::channel(false);

    let config = |resource| WatchConfig {
        page_limit: cfg.list_page_size,
        ..WatchConfig::new(resource)
    };
    tasks.spawn(log_exit(watch::run(
        apis.services.clone(),
        without_managed_fields::<Service>,
        WatchContext {
            config: config("services"),
            cache: stores.services.inner().clone(),
            changes: svc_tx,
            observer: observer.clone(),
            synced: svc_synced_tx,
        },
        shutdown.clone(),
    )));
    tasks.spawn(log_exit(watch::run(
        apis.pods.clone(),
        |pod: Pod| PodInfo::from_pod(&pod),
        WatchContext {
            config: config("pods"),
            cache: stores.pods.inner().clone(),
            changes: pod_tx,
            observer: observer.clone(),
            synced: pod_synced_tx,
        },
        shutdown.clone(),
    )));
    tasks.spawn(log_exit(watch::run(
        apis.endpoints.clone(),
        CachedEndpoints::new,
        WatchContext {
            config: config("endpoints"),
            cache: stores.endpoints.inner().clone(),
            changes: ep_tx,
            observer: observer.clone(),
            synced: ep_synced_tx,
        },
        shutdown.clone(),
    )));

    // Changes become queue keys as they arrive; each resource has its own task so
    // a burst of pod changes never delays Service changes.
    tasks.spawn(dispatch(
        ctx.clone(),
        svc_rx,
        "services",
        |c| &c.stores.services,
        |ctx, change| handlers::on_service(ctx, change),
    ));
    tasks.spawn(dispatch(
        ctx.clone(),
        pod_rx,
        "pods",
        |c| &c.stores.pods,
        |ctx, change| handlers::on_pod(ctx, change),
    ));
    tasks.spawn(dispatch(
        ctx.clone(),
        ep_rx,
        "endpoints",
        |c| &c.stores.endpoints,
        handlers::on_endpoints,
    ));

    let workers = cfg.workers;
    let resync_interval = cfg.resync_interval;
    let ctx_main = ctx.clone();
    let shutdown_main = shutdown.clone();
    let main = async move {
        let ctx = ctx_main;
        // Workers start once every cache holds a full consistent list: reconciling
        // on a partial cache would compute Endpoints from half the pods.
        let synced = async {
            let _ = svc_synced.wait_for(|s| *s).await;
            let _ = pod_synced.wait_for(|s| *s).await;
            let _ = ep_synced.wait_for(|s| *s).await;
        };
        tokio::select! {
            _ = synced => {}
            _ = stopped(shutdown_main.clone()) => {
                queue.shutdown();
                tasks.shutdown().await;
                leadership.stopped().await;
                return;
            }
        }
        resync::sweep(&ctx, false);
        if leadership.elected() {
            tasks.spawn(crate::leader::requeue_on_election(ctx.clone()));
        }
        let _ = ready_tx.send(true);
        info!("caches synced; reconciling");

        for worker in 0..workers {
            let ctx = ctx.clone();
            tasks.spawn(async move { work(ctx).await }.instrument(info_span!("worker", worker)));
        }
        if !resync_interval.is_zero() {
            let ctx = ctx.clone();
            let shutdown = shutdown_main.clone();
            tasks.spawn(async move {
                let mut ticker = tokio::time::interval(resync_interval);
                ticker.tick().await;
                loop {
                    tokio::select! {
                        _ = ticker.tick() => {}
                        _ = stopped(shutdown.clone()) => return,
                    }
                    if let Err(err) = resync::resync_once(&ctx, &apis).await {
                        ctx.metrics.resync_failures.inc();
                        warn!(error = %err, "full resync failed; trying again next interval");
                    }
                }
            });
        }
        stopped(shutdown_main).await;
        info!("shutting down");
        ctx.queue.shutdown();
        tasks.shutdown().await;
        leadership.stopped().await;
    };
    Ok((
        Running {
            metrics_addr,
            context: ctx,
        },
        main,
    ))
}

/// Hands each change of one cache to its handler, in order, and keeps that
/// cache's size gauges current.
async fn dispatch<T: Cached>(
    ctx: Arc<Context>,
    mut changes: mpsc::UnboundedReceiver<Change<T>>,
    resource: &'static str,
    cache: fn(&Context) -> &Shared<T>,
    handle: fn(&Arc<Context>, &Change<T>),
) {
    while let Some(change) = changes.recv().await {
        handle(&ctx, &change);
        record_cache_size(&ctx, resource, cache(&ctx));
    }
}

/// Keeps `endpoints_guard_cache_objects` and `endpoints_guard_cache_tombstones` current.
fn record_cache_size<T: Cached>(ctx: &Context, resource: &'static str, cache: &Shared<T>) {
    let (live, tombstones) = {
        let c = cache.read();
        (c.len(), c.tombstone_count())
    };
    let gauge = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    ctx.metrics
        .cache_objects
        .with_label_values(&[resource])
        .set(gauge(live));
    ctx.metrics
        .cache_tombstones
        .with_label_values(&[resource])
        .set(gauge(tombstones));
}

/// Resolves once shutdown is signalled (or its sender is gone).
async fn stopped(mut shutdown: signal::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A watcher only ends on shutdown or when its consumer is gone; either way the
/// reason is logged rather than dropped.
async fn log_exit(watcher: impl Future<Output = std::result::Result<(), watch::WatchError>>) {
    if let Err(err) = watcher.await {
        warn!(error = %err, "watcher stopped");
    }
}

async fn work(ctx: Arc<Context>) {
    while let Some(key) = ctx.queue.next().await {
        // Replicas that do not hold the Lease keep keys queued and read nothing.
        ctx.wait_until_leading().await;
        ctx.metrics
            .queue_depth
            .with_label_values(&["services"])
            .set(ctx.queue.len() as i64);
        let start = Instant::now();
        let result = sync::reconcile(&ctx, &key)
            .instrument(info_span!("reconcile", service = %key))
            .await;
        ctx.metrics
            .reconcile_duration
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                ctx.metrics.reconciles.with_label_values(&["ok"]).inc();
                ctx.queue.forget(&key);
            }
            Err(err) => {
                ctx.metrics.reconciles.with_label_values(&["error"]).inc();
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&[err.metric_label()])
                    .inc();
                match ctx.queue.retry(key.clone()) {
                    Retry::After(delay) => {
                        ctx.metrics.queue_retries.inc();
                        warn!(%key, error = %err, retry_in = ?delay, "reconcile failed");
                    }
                    Retry::GaveUp => {
                        ctx.metrics.queue_dropped.inc();
                        error!(%key, error = %err, "reconcile failed too often; dropped until the next change or resync");
                    }
                }
            }
        }
        ctx.queue.done(&key);
    }
}
