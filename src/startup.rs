//! Start-up checks that turn the usual misconfigurations into one clear line each:
//! a kubeconfig that cannot be read, an API server that cannot be reached, and
//! credentials that may not do what the controller needs.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::Client;
use kube::api::ListParams;
use kube::client::{ClientBuilder, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::{Config, Mode};
use crate::controller;
use crate::error::{Error, Result};
use crate::ratelimit::RateLimitLayer;
use crate::reconcile::kinds::{Kind, KindVisitor, for_each_kind};

/// The controller's two API clients, on one configuration (credentials,
/// headers, the client rate limit's one bucket).
#[derive(Clone)]
pub struct Clients {
    /// Watches, writes, Events, the Lease, the resync: kube's client, HTTP/1.1.
    pub main: Client,
    /// The ghost scan's reads (`src/reconcile/ghost_scan.rs`): HTTP/2 when
    /// the server offers it in TLS, else HTTP/1.1. A round of reads then
    /// crosses one connection together, at about half the CPU per read of
    /// HTTP/1.1's connection per read in flight (`eg-readcost`,
    /// docs/bench.md).
    pub reads: Client,
}

impl Clients {
    /// Both roles on one client (tests that hand the controller a client).
    pub fn single(client: Client) -> Self {
        Self {
            reads: client.clone(),
            main: client,
        }
    }
}

/// Builds the clients from `--kubeconfig`/`$KUBECONFIG`, else in-cluster,
/// else `~/.kube/config`.
pub async fn clients(cfg: &Config) -> Result<Clients> {
    let kube_config = kube_config(cfg).await?;
    let limit = RateLimitLayer::new(cfg.kube_api_qps, cfg.kube_api_burst);
    let url = kube_config.cluster_url.clone();
    let cannot = |e: kube::Error| Error::Config(format!("cannot build a client for {url}: {e}"));
    let main = ClientBuilder::try_from(kube_config.clone()).map_err(cannot)?;
    let reads = multiplexed(&kube_config).map_err(cannot)?;
    Ok(Clients {
        main: with_limit(main, limit.as_ref()),
        reads: match reads {
            Some(reads) => with_limit(reads, limit.as_ref()),
            None => with_limit(
                ClientBuilder::try_from(kube_config).map_err(cannot)?,
                limit.as_ref(),
            ),
        },
    })
}

/// The main client alone (`verify-endpoints`).
pub async fn client(cfg: &Config) -> Result<Client> {
    Ok(clients(cfg).await?.main)
}

async fn kube_config(cfg: &Config) -> Result<kube::Config> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut kube_config = match &cfg.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| {
                Error::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| {
                    Error::Config(format!("kubeconfig {} is not usable: {e}", path.display()))
                })?
        }
        None => kube::Config::infer().await.map_err(|e| {
            Error::Config(format!(
                "no Kubernetes configuration found (not in a cluster, no --kubeconfig, no $KUBECONFIG, no ~/.kube/config): {e}"
            ))
        })?,
    };
    // The API server names the writer of each field after the user agent's
    // first word (metadata.managedFields[].manager), and audit logs show it.
    kube_config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    Ok(kube_config)
}

/// kube's client stack, boxed (what `ClientBuilder::try_from` builds).
type GenericService = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<DynBody>>,
    tower::BoxError,
>;

/// `builder` behind the client rate limit, when there is one.
fn with_limit(builder: ClientBuilder<GenericService>, limit: Option<&RateLimitLayer>) -> Client {
    match limit {
        Some(limit) => builder.with_layer(limit).build(),
        None => builder.build(),
    }
}

/// How long a multiplexed connection may stay silent before a PING, and how
/// long the PING's answer may take before the connection counts as dead.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that offers HTTP/2 in TLS (ALPN `h2`, then `http/1.1`), with
/// kube's credentials and headers; `None` through a proxy (kube's client
/// handles the proxies).
fn multiplexed(config: &kube::Config) -> kube::Result<Option<ClientBuilder<GenericService>>> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;

    if config.proxy_url.is_some() {
        return Ok(None);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|e| kube::Error::Service(format!("tls-server-name {name}: {e}").into()))?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => tls,
    };
    let connector = tls.enable_all_versions().wrap_connector(http);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .build(connector);
    // Outermost first; the client's errors are boxed before the auth layer,
    // whose token refresh fails with a boxed error of its own.
    let service: GenericService = tower::ServiceBuilder::new()
        .boxed()
        .map_response(|answer: http::Response<hyper::body::Incoming>| {
            answer.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(
                    body,
                    tower::BoxError::from,
                )) as Box<DynBody>
            })
        })
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(Some(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    )))
}

/// The user agent of every API request; its first word, `endpoints-guard`, is
/// the field manager of what the controller writes.
pub const USER_AGENT: &str = concat!("endpoints-guard/", env!("CARGO_PKG_VERSION"));

/// The field manager the API server records for this controller's writes.
pub const FIELD_MANAGER: &str = "endpoints-guard";

/// Waits up to `timeout` for the API server to answer, then checks that the
/// credentials may list and watch what the controller reads.
pub async fn preflight(client: &Client, cfg: &Config) -> Result<()> {
    let deadline = Instant::now() + cfg.startup_timeout;
    let mut delay = Duration::from_millis(250);
    loop {
        match client.apiserver_version().await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 401 => {
                return Err(Error::Config(format!(
                    "the API server rejected the credentials (401 Unauthorized): {}",
                    status.message
                )));
            }
            // /version is readable by every authenticated user; 403 there means
            // the server is reachable, the permission checks below say more.
            Err(kube::Error::Api(status)) if status.code == 403 => break,
            Err(err) if Instant::now() + delay < deadline => {
                tracing::warn!(error = %err, "API server not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(err) => {
                return Err(Error::Config(format!(
                    "cannot reach the API server within {:?}: {err}",
                    cfg.startup_timeout
                )));
            }
        }
    }
    let mut checks = ListChecks {
        client,
        cfg,
        checks: Vec::new(),
    };
    for_each_kind(&mut checks);
    // One at a time, in order: the first refusal is the one reported.
    for check in checks.checks {
        check.await?;
    }
    if cfg.mode == Mode::Audit {
        tracing::info!("audit mode: nothing will be written");
    }
    Ok(())
}

/// The list check of every kind, to be awaited in order.
struct ListChecks<'a> {
    client: &'a Client,
    cfg: &'a Config,
    checks: Vec<BoxFuture<'a, Result<()>>>,
}

impl<'a> KindVisitor for ListChecks<'a> {
    fn visit<K: Kind>(&mut self) {
        self.checks
            .push(Box::pin(check_list::<K>(self.client, self.cfg)));
    }
}

/// Lists one object of kind `K`, if the running controllers watch it.
async fn check_list<K: Kind>(client: &Client, cfg: &Config) -> Result<()> {
    if !K::needed(cfg.controller_set()) {
        return Ok(());
    }
    let resource = K::RESOURCE;
    let namespace = cfg.namespace.as_deref();
    let api = controller::api::<K>(client, namespace);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            let scope = match api.namespace() {
                Some(ns) => format!("in namespace {ns}"),
                None => "cluster-wide".to_string(),
            };
            Err(Error::Config(format!(
                "forbidden: these credentials may not list {resource} {scope} ({}); grant the ClusterRole from deploy/ or the Helm chart",
                status.message
            )))
        }
        Err(err) => Err(Error::Config(format!("listing {resource} failed: {err}"))),
    }
}
