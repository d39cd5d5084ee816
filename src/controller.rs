//! Wiring: the caches and their watchers (each delivering its changes to a
//! handler), the workers, the periodic resync, the ghost scan and the metrics
//! server; run until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::watch as signal;
use tokio::task::JoinSet;
use tracing::{Instrument, debug_span, error, info, warn};

use crate::config::{Config, Wire};
use crate::desired::Rules;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::reconcile::kinds::{Kind, KindVisitor, for_each_kind};
use crate::reconcile::latency::WriteClock;
use crate::reconcile::publish::{self, Action};
use crate::reconcile::queue::{Retry, Taken};
use crate::reconcile::{Context, Policy, Stores, Work, enqueue_all, ghost_scan, resync};
use crate::server::{self, auth, tls};
use crate::settings::Controller;
use crate::shutdown::stopped;
use crate::startup::Clients;
use hardened_watcher::{Change, WatchObserver, Watcher};

/// What every watcher is started with.
struct Watching<'a> {
    ctx: &'a Arc<Context>,
    namespace: Option<&'a str>,
    /// Objects per LIST page.
    page_limit: u32,
    /// The share of the time a scheduled full resync's pages take.
    paced_list_share: f64,
    wire: Wire,
    observer: Arc<dyn WatchObserver>,
    shutdown: &'a signal::Receiver<bool>,
    tasks: &'a mut JoinSet<()>,
}

impl KindVisitor for Watching<'_> {
    /// Spawns the watcher of kind `K` if the running controllers need it: its
    /// cache, filled from the namespace (or the cluster), every change handed
    /// to [`Kind::on_change`]. It ends on shutdown.
    fn visit<K: Kind>(&mut self) {
        if !K::needed(self.ctx.controllers()) {
            return;
        }
        let handler = self.ctx.clone();
        let on_change = move |change: &Change<K::Cached>, received: Instant| {
            K::on_change(&handler, change, received);
        };
        let mut builder = Watcher::builder(K::api(&self.ctx.client, self.namespace))
            .project(K::project)
            .store(K::store(&self.ctx.stores).clone())
            .on_change(on_change)
            .observer(self.observer.clone())
            .page_limit(self.page_limit)
            .resync_list_share(self.paced_list_share);
        if self.wire == Wire::Protobuf
            && let Some(decode) = K::protobuf()
        {
            builder = builder.protobuf(decode);
        }
        let watcher = builder.build();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            // A watcher ends on shutdown, or when it cannot start: the reason
            // is logged rather than dropped.
            if let Err(err) = watcher.run(shutdown).await {
                error!(resource = K::RESOURCE, error = %err, "watcher stopped");
            }
        });
    }
}

/// A running controller: where its metrics server listens, its metrics and
/// the Kubernetes release whose rules it follows.
pub struct Running {
    pub metrics_addr: SocketAddr,
    /// Where /metrics is served over HTTPS (`--secure-metrics-addr`), if it is.
    pub secure_metrics_addr: Option<SocketAddr>,
    context: Arc<Context>,
}

impl Running {
    pub fn metrics(&self) -> &Metrics {
        &self.context.metrics
    }

    /// The rules endpoints-guard computes Endpoints and EndpointSlices by.
    pub fn rules(&self) -> Rules {
        self.context.policy.rules
    }
}

/// Starts everything, following `rules` ([`crate::startup::kube_rules`]),
/// and returns once the server is bound; `done` resolves when the controller
/// has stopped after `shutdown` turned true.
pub async fn start(
    cfg: Config,
    clients: Clients,
    rules: Rules,
    shutdown: signal::Receiver<bool>,
) -> Result<(Running, impl Future<Output = ()>)> {
    let metrics = Arc::new(Metrics::new()?);
    metrics
        .server_newer_than_rules
        .set(i64::from(rules.server_newer_minor().is_some()));
    let controllers = cfg.controller_set();
    let stores = Stores::for_controllers(controllers);
    let reporter = Reporter {
        controller: "endpoints-guard".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let client = clients.work;
    let leadership = crate::leader::Leadership::start(
        cfg.leader_settings().map_err(crate::error::Error::Config)?,
        &clients.lease,
        metrics.clone(),
        shutdown.clone(),
    )?;
    let (events, event_publisher) = crate::reconcile::events::channel(
        Recorder::new(client.clone(), reporter),
        metrics.events_dropped.clone(),
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics: metrics.clone(),
        events,
        stores: stores.clone(),
        leader: leadership.receiver(),
        policy: Policy {
            mode: cfg.mode,
            scope: cfg.scope,
            rules,
            managed_by: cfg.managed_by(),
            max_endpoints_per_slice: usize::from(cfg.max_endpoints_per_slice),
            opt_out_grace: cfg.opt_out_grace,
        },
        endpoints: Work::new(cfg.max_retries),
        slices: Work::new(cfg.max_retries),
        opt_in_states: Default::default(),
    });

    let (ready_tx, ready_rx) = signal::channel(false);
    let health = server::Health { ready: ready_rx };
    let mut tasks = JoinSet::new();
    tasks.spawn(event_publisher.run());
    let (metrics_addr, secure_metrics_addr) = match cfg.secure_metrics_addr {
        None => {
            let (addr, serve) =
                server::bind(cfg.metrics_addr, metrics.clone(), health, shutdown.clone()).await?;
            tasks.spawn(serve);
            (addr, None)
        }
        Some(secure) => {
            let (resolver, reload) =
                tls::load(&cert_source(&cfg), tls::RELOAD_PERIOD, shutdown.clone())?;
            let authorizer = Arc::new(auth::Authorizer::new(client.clone()));
            let (secure, serve_secure) = server::bind_secure(
                secure,
                metrics.clone(),
                authorizer,
                tls::server_config(resolver)?,
                shutdown.clone(),
            )
            .await?;
            let (addr, serve) =
                server::bind_probes(cfg.metrics_addr, health, secure, shutdown.clone()).await?;
            tasks.spawn(serve_secure);
            tasks.spawn(serve);
            if let Some(reload) = reload {
                tasks.spawn(reload);
            }
            (addr, Some(secure))
        }
    };
    let running: Vec<&str> = controllers.iter().map(Controller::metric_label).collect();
    info!(%metrics_addr, ?secure_metrics_addr, mode = ?cfg.mode, workers = cfg.workers, controllers = ?running, rules = %rules.release(), "endpoints-guard starting");

    for_each_kind(&mut Watching {
        ctx: &ctx,
        namespace: cfg.namespace.as_deref(),
        page_limit: cfg.list_page_size,
        paced_list_share: cfg.paced_list_share,
        wire: cfg.wire,
        observer: metrics.clone(),
        shutdown: &shutdown,
        tasks: &mut tasks,
    });
    tasks.spawn(hardened_watcher::share_rewinds(ctx.stores.watched()));

    let workers = cfg.workers;
    let resync = resync::Timing {
        interval: cfg.resync_interval,
        full_interval: cfg.full_resync_interval,
        paced_list_share: cfg.paced_list_share,
    };
    let ghost_scan = ghost_scan::Pace {
        qps: cfg.ghost_scan_qps,
        period: cfg.ghost_scan_period,
    };
    let ctx_main = ctx.clone();
    let mut shutdown_main = shutdown.clone();
    let main = async move {
        let ctx = ctx_main;
        // Workers start once every cache holds a full consistent list: reconciling
        // on a partial cache would compute Endpoints from half the pods.
        tokio::select! {
            () = ctx.stores.wait_synced() => {}
            () = stopped(&mut shutdown_main) => {
                shutdown_queues(&ctx);
                tasks.shutdown().await;
                leadership.stopped().await;
                return;
            }
        }
        resync::sweep(&ctx);
        tasks.spawn(track_readiness(
            ctx.clone(),
            ready_tx,
            shutdown_main.clone(),
        ));
        if leadership.elected() {
            tasks.spawn(requeue_on_election(ctx.clone()));
        }
        info!("caches synced; reconciling");

        for controller in ctx.controllers().iter() {
            for worker in 0..workers {
                let ctx = ctx.clone();
                // At debug level: at the default filter a disabled span costs
                // nothing per poll, and every log line of a reconcile names
                // its Service and controller itself.
                let span = debug_span!("worker", %controller, worker);
                tasks.spawn(async move { work(ctx, controller).await }.instrument(span));
            }
        }
        tasks.spawn(periodic(ctx.clone(), resync, shutdown_main.clone()));
        tasks.spawn(ghost_scan::run(
            ctx.clone(),
            ghost_scan,
            ghost_scan::CompactionAudit {
                every: cfg.compaction_audit_interval,
                page_size: cfg.list_page_size,
                list_share: cfg.paced_list_share,
                full_every: cfg.compaction_audit_full_every,
            },
            shutdown_main.clone(),
        ));
        stopped(&mut shutdown_main).await;
        info!("shutting down");
        shutdown_queues(&ctx);
        tasks.shutdown().await;
        leadership.stopped().await;
    };
    Ok((
        Running {
            metrics_addr,
            secure_metrics_addr,
            context: ctx,
        },
        main,
    ))
}

/// The HTTPS metrics server's certificate: the files given, else a
/// self-signed one for localhost, the loopback addresses and the pod's name.
fn cert_source(cfg: &Config) -> tls::CertSource {
    match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(cert), Some(key)) => tls::CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => {
            let mut names = vec![
                "localhost".to_string(),
                "127.0.0.1".to_string(),
                "::1".to_string(),
            ];
            names.extend(std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()));
            tls::CertSource::SelfSigned(names)
        }
    }
}

fn shutdown_queues(ctx: &Context) {
    for controller in Controller::ALL {
        ctx.work(controller).queue.shutdown();
    }
}

/// `/readyz` follows the caches: ready while every watched cache holds a
/// complete consistent list, not ready while one is listed again from
/// scratch after a store rewind (the workers wait meanwhile).
async fn track_readiness(
    ctx: Arc<Context>,
    ready: signal::Sender<bool>,
    mut shutdown: signal::Receiver<bool>,
) {
    let mut followed = ctx.stores.synced_signals();
    loop {
        let now = followed.iter_mut().all(|rx| *rx.borrow_and_update());
        if ready.send_replace(now) != now {
            info!(ready = now, "readiness changed");
        }
        let changes = followed.iter_mut().map(|rx| Box::pin(rx.changed()));
        tokio::select! {
            _ = futures::future::select_all(changes) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// Every Service is queued each time this instance becomes leader, so it
/// repairs what happened while another instance led or nobody did.
async fn requeue_on_election(ctx: Arc<Context>) {
    let mut rx = ctx.leader.clone();
    loop {
        if rx.wait_for(|l| *l).await.is_err() {
            return;
        }
        let count = enqueue_all(&ctx);
        info!(
            services = count,
            "leading: every Service queued for a reconcile"
        );
        if rx.wait_for(|l| !*l).await.is_err() {
            return;
        }
        // Only the leader reconciles: what this replica saw of opted-in
        // Services would soon be wrong, and its gauges with it.
        ctx.opt_in_states.clear(&ctx.opt_in_gauges());
    }
}

/// Why [`periodic`] woke up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Due {
    Tick,
    /// This instance became leader.
    Elected,
}

/// The resync every `interval` (none when zero), in full when
/// [`resync::Timing::depth`] says so, and housekeeping of deletion evidence
/// with it (every five minutes when there is no resync).
///
/// Only the leader resyncs: a replica that does not lead acts on nothing it
/// caches, and every relist it made would cost kube-apiserver and etcd as
/// much as the leader's. A replica that becomes leader resyncs in full at
/// once, catching up on whatever its watches missed while it followed, and
/// then every interval from there.
async fn periodic(ctx: Arc<Context>, timing: resync::Timing, mut shutdown: signal::Receiver<bool>) {
    let interval = timing.interval;
    // The caches were just listed in full.
    let mut last_full = Instant::now();
    let tick = if interval.is_zero() {
        Duration::from_secs(300)
    } else {
        interval
    };
    let mut ticker = tokio::time::interval(tick);
    // A resync longer than the interval (a paced full one at 100,000 pods)
    // is followed by the interval, not by the ticks it missed at once.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut leader = ctx.leader.clone();
    leader.mark_unchanged();
    loop {
        let due = tokio::select! {
            _ = ticker.tick() => Due::Tick,
            Ok(()) = leader.changed() => {
                if !*leader.borrow_and_update() {
                    continue;
                }
                Due::Elected
            }
            () = stopped(&mut shutdown) => return,
        };
        if !interval.is_zero() && ctx.leading() {
            if due == Due::Elected {
                info!("leading: resyncing in full to catch up on what the watches missed");
                ticker.reset();
            }
            let depth = timing.depth(due == Due::Elected, last_full.elapsed());
            match resync::resync_once(&ctx, depth, timing.list_timeout(depth)).await {
                Ok(()) if depth.is_full() => last_full = Instant::now(),
                Ok(()) => {}
                Err(err) => {
                    ctx.metrics.resync_failures.inc();
                    warn!(error = %err, ?depth, "resync failed; trying again next interval");
                }
            }
        }
        if due == Due::Tick {
            resync::housekeeping(&ctx);
        }
    }
}

/// One worker of `controller`: takes keys from its queue until shutdown.
async fn work(ctx: Arc<Context>, controller: Controller) {
    let queue = ctx.work(controller).queue.clone();
    let label = controller.metric_label();
    // Series resolved once: a label lookup hashes its values on every call.
    let depth = ctx.metrics.queue_depth.with_label_values(&[label]);
    let duration = ctx.metrics.reconcile_duration.with_label_values(&[label]);
    let succeeded = ctx.metrics.reconciles.with_label_values(&[label, "ok"]);
    let failed = ctx.metrics.reconciles.with_label_values(&[label, "error"]);
    let clock = WriteClock::new(&ctx.metrics, controller);
    while let Some(Taken { key, received }) = queue.next().await {
        // Replicas that do not hold the Lease keep keys queued and read nothing;
        // nobody reconciles while a cache is listed again after a store rewind.
        ctx.wait_until_leading().await;
        ctx.stores.wait_synced().await;
        depth.set(queue.len() as i64);
        let start = Instant::now();
        let span = debug_span!("reconcile", service = %key);
        let timer = clock.timer(received);
        let result = publish::reconcile(&ctx, controller, &key, &timer)
            .instrument(span)
            .await
            .settle(&ctx, controller, &key);
        duration.observe(start.elapsed().as_secs_f64());
        match result {
            Ok(action) => {
                succeeded.inc();
                queue.forget(&key);
                if let Action::RequeueAfter(delay) = action {
                    queue.add_after(key.clone(), delay);
                }
            }
            Err(err) => {
                failed.inc();
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&[label, err.metric_label()])
                    .inc();
                match queue.retry(key.clone(), received) {
                    Retry::After(delay) => {
                        ctx.metrics.queue_retries.with_label_values(&[label]).inc();
                        warn!(%key, %controller, error = %err, retry_in = ?delay, "reconcile failed");
                    }
                    Retry::GaveUp => {
                        ctx.metrics.queue_dropped.with_label_values(&[label]).inc();
                        error!(%key, %controller, error = %err, "reconcile failed too often; dropped until the next change or the next resync");
                    }
                }
            }
        }
        queue.done(&key);
        // A reconcile with nothing to write never waits, and neither does
        // `next` while keys are queued: without this a worker would run a
        // resync's thousand keys back to back and hold the runtime's one
        // thread, so the watch event of a pod that flips meanwhile would not
        // even be read (and its key could not go ahead) until they are done.
        tokio::task::yield_now().await;
    }
}
