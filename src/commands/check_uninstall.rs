//! `endpoints-guard check-uninstall`: the chart's pre-delete check in opt-in
//! scope. endpoints-guard publishes the endpoints of every Service that
//! opted in (alone once its selector is gone): uninstalling it first would
//! freeze them, and every endpoint they hold would outlive its pod. It
//! lists the Services it still publishes for and fails while there are any.

use kube::Client;

use super::service_view::Standing;
use super::status::marked_services;
use crate::desired::scope::LABEL_OPT_IN;
use crate::error::{Error, Result};

/// Ok when endpoints-guard publishes for no Service (of `namespace`, or
/// any); else an error naming them and what to do.
pub async fn run(client: &Client, namespace: Option<&str>) -> Result<()> {
    let names: Vec<String> = marked_services(client, namespace)
        .await?
        .iter()
        .filter(|view| view.standing() != Standing::NotOptedIn)
        .map(|view| format!("{} ({})", view.name, view.standing()))
        .collect();
    if names.is_empty() {
        tracing::info!("no Service is opted in");
        return Ok(());
    }
    Err(Error::Config(format!(
        "{} Service(s) still opted in: {}. endpoints-guard publishes their endpoints; opt each out first (endpoints-guard opt-out NAMESPACE/NAME, or hand-back --all; docs/opt-in.md: give it its selector back, then remove the label {LABEL_OPT_IN}), or uninstall with --no-hooks to leave their endpoints as they are",
        names.len(),
        names.join(", ")
    )))
}
