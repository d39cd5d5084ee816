//! `endpoints-guard check-uninstall`: the chart's pre-delete check in opt-in
//! scope. endpoints-guard is the only writer of the endpoints of a Service
//! that opted in and lost its selector: uninstalling it first would freeze
//! them, and every endpoint they hold would outlive its pod. It lists the
//! Services still opted in and fails while there are any.

use k8s_openapi::api::core::v1::Service;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::desired::scope::LABEL_OPT_IN;
use crate::error::{Error, Result};

/// Ok when no Service (of `namespace`, or any) is opted in; else an error
/// naming them and what to do.
pub async fn run(client: &Client, namespace: Option<&str>) -> Result<()> {
    let api: Api<Service> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Any value but "false": an invalid one is opted in too (frozen).
    let selector = format!("{LABEL_OPT_IN},{LABEL_OPT_IN}!=false");
    let services = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| Error::kube("listing opted-in Services", selector.clone(), e))?;
    let names: Vec<String> = services
        .items
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    if names.is_empty() {
        tracing::info!("no Service is opted in");
        return Ok(());
    }
    Err(Error::Config(format!(
        "{} Service(s) still opted in: {}. endpoints-guard is the only writer of their endpoints; opt each out first (docs/opt-in.md: give it its selector back, then remove the label {LABEL_OPT_IN}), or uninstall with --no-hooks to leave their endpoints as they are",
        names.len(),
        names.join(", ")
    )))
}
