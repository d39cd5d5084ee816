//! Start-up checks that turn the usual misconfigurations into one clear line each:
//! a kubeconfig that cannot be read, an API server that cannot be reached,
//! credentials that may not do what the controller needs, and a server
//! release whose rules this controller does not have; and the choice of
//! those rules.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::Client;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::Config;
use crate::desired::{KubeRelease, Rules, ServerRelease};
use crate::error::{Error, Result};
use crate::ratelimit::RateLimitLayer;
use crate::reconcile::kinds::{Kind, KindVisitor, for_each_kind};
use crate::settings::Mode;

/// The controller's clients: one for its work, limited by
/// `--kube-api-qps`, and one for the leader Lease without that limit, so
/// that a burst of lists or writes never delays a renewal (as
/// kube-controller-manager's leader election has a client of its own).
#[derive(Clone)]
pub struct Clients {
    pub work: Client,
    pub lease: Client,
}

impl From<Client> for Clients {
    /// One client for both (no client-side limit to keep the Lease from).
    fn from(client: Client) -> Self {
        Clients {
            lease: client.clone(),
            work: client,
        }
    }
}

/// [`client`], and the Lease's own client beside it.
pub async fn clients(cfg: &Config) -> Result<Clients> {
    let work = client(cfg).await?;
    if RateLimitLayer::new(cfg.kube_api_qps, cfg.kube_api_burst).is_none() {
        return Ok(work.into());
    }
    let unlimited = Config {
        kube_api_qps: 0.0,
        ..cfg.clone()
    };
    Ok(Clients {
        work,
        lease: client(&unlimited).await?,
    })
}

/// Builds a client from `--kubeconfig`/`$KUBECONFIG`, else in-cluster, else
/// `~/.kube/config`.
pub async fn client(cfg: &Config) -> Result<Client> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..KubeConfigOptions::default()
    };
    let kube_config = match &cfg.kubeconfig {
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
    let mut kube_config = kube_config;
    kube_config.disable_compression |= cfg.disable_compression;
    // The API server names the writer of each field after the user agent's
    // first word (metadata.managedFields[].manager), and audit logs show it.
    kube_config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let url = kube_config.cluster_url.clone();
    let builder = kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| Error::Config(format!("cannot build a client for {url}: {e}")))?;
    Ok(
        match RateLimitLayer::new(cfg.kube_api_qps, cfg.kube_api_burst) {
            Some(limit) => builder.with_layer(&limit).build(),
            None => builder.build(),
        },
    )
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

/// The rules the controller follows: those of `--kube-rules` if given, else
/// those of the API server's own minor (an error outside the supported
/// range, naming it and the flag), with `--feature-gates`.
pub async fn kube_rules(client: &Client, cfg: &Config) -> Result<Rules> {
    let picked = match cfg.kube_rules {
        Some(release) => {
            tracing::info!(rules = %release, "rules of Kubernetes {release} (--kube-rules)");
            ServerRelease {
                release,
                newer_minor: None,
            }
        }
        None => {
            // Readable by every authenticated user; where a server refuses
            // it anyway, the flag is the way out.
            let info = client.apiserver_version().await.map_err(|err| {
                Error::Config(format!(
                    "cannot read the API server's version to pick the rules ({err}): pass --kube-rules {}",
                    KubeRelease::choices()
                ))
            })?;
            let picked = KubeRelease::of_server(&info.major, &info.minor, &info.git_version)
                .map_err(Error::Config)?;
            let release = picked.release;
            match picked.newer_minor {
                None => {
                    tracing::info!(rules = %release, server = %info.git_version, "rules of Kubernetes {release}, the API server's")
                }
                Some(_) => tracing::warn!(
                    rules = %release,
                    server = %info.git_version,
                    "the API server is newer than the newest rules here: following those of Kubernetes {release}; \
                     upgrade endpoints-guard, or pass --kube-rules to silence this"
                ),
            }
            picked
        }
    };
    let rules = Rules::with_gates(picked.release, cfg.feature_gates).map_err(Error::Config)?;
    Ok(match picked.newer_minor {
        Some(minor) => rules.for_newer_server(minor),
        None => rules,
    })
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
    let api = K::api(client, namespace);
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
