//! Kubeconfig files and kube::Clients for the local control plane.

use std::path::Path;

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

/// How a kubeconfig's user authenticates.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Credentials<'a> {
    /// A client certificate and key, by path.
    ClientCert { cert: &'a Path, key: &'a Path },
    /// A bearer token (e.g. a ServiceAccount token).
    Token(&'a str),
}

/// Renders a kubeconfig with one cluster, user and context, all named `name`.
pub(crate) fn render(
    name: &str,
    server: &str,
    ca_cert: &Path,
    credentials: Credentials<'_>,
) -> Result<String> {
    let user: Value = match credentials {
        Credentials::ClientCert { cert, key } => json!({
            "client-certificate": cert.display().to_string(),
            "client-key": key.display().to_string(),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": name,
            "cluster": {
                "server": server,
                "certificate-authority": ca_cert.display().to_string(),
            },
        }],
        "users": [{ "name": name, "user": user }],
        "contexts": [{ "name": name, "context": { "cluster": name, "user": name } }],
        "current-context": name,
    });
    serde_yaml::to_string(&config).context("rendering a kubeconfig")
}

/// Writes a kubeconfig rendered by [`render`] to `path`.
pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing kubeconfig {}", path.display()))
}

/// A kube::Client for a kubeconfig rendered by [`render`].
pub(crate) async fn client(text: &str) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::from_yaml(text).context("parsing a generated kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading a generated kubeconfig")?;
    kube::Client::try_from(config).context("building a kube::Client")
}
