//! Start-up checks that turn the usual misconfigurations into one clear line each:
//! a kubeconfig that cannot be read, an API server that cannot be reached, and
//! credentials that may not do what the controller needs.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::config::{Config, Mode};
use crate::error::{Error, Result};

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
    let url = kube_config.cluster_url.clone();
    Client::try_from(kube_config)
        .map_err(|e| Error::Config(format!("cannot build a client for {url}: {e}")))
}

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
    let scope = cfg.namespace.as_deref();
    check_list::<Service>(client, scope, "services").await?;
    check_list::<Pod>(client, scope, "pods").await?;
    check_list::<Endpoints>(client, scope, "endpoints").await?;
    if cfg.mode == Mode::Audit {
        tracing::info!("audit mode: nothing will be written");
    }
    Ok(())
}

async fn check_list<K>(client: &Client, namespace: Option<&str>, resource: &str) -> Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            let scope = namespace.map_or("cluster-wide".to_string(), |ns| {
                format!("in namespace {ns}")
            });
            Err(Error::Config(format!(
                "forbidden: these credentials may not list {resource} {scope} ({}); grant the ClusterRole from deploy/ or the Helm chart",
                status.message
            )))
        }
        Err(err) => Err(Error::Config(format!("listing {resource} failed: {err}"))),
    }
}
