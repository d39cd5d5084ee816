//! `endpoints-guard status`: every Service that carries an opt-in, or still
//! has something of endpoints-guard's: where it stands, who publishes its
//! ready endpoints, and the last Warning endpoints-guard reported on it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::ListParams;
use kube::{Api, Client};

use super::service_view::{ServiceView, Standing};
use crate::desired::MANAGER;
use crate::desired::scope::OptInState;
use crate::desired::slices::LABEL_SLICE_MANAGED_BY;
use crate::error::{Error, Result};
use crate::reconcile::opt_in::SELECTOR_RESTORED;

/// The component endpoints-guard's Events are reported by.
const REPORTER: &str = "endpoints-guard";

/// Every Service (of `namespace`, or all) that carries an opt-in label or
/// annotation, or that a slice of endpoints-guard's names.
pub async fn marked_services(client: &Client, namespace: Option<&str>) -> Result<Vec<ServiceView>> {
    let services: Api<Service> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let listed = services
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("listing Services", namespace.unwrap_or("all"), e))?;
    let ours = services_with_our_slices(client, namespace).await?;
    let mut views = Vec::new();
    for service in listed.items {
        let key = (
            service.metadata.namespace.clone().unwrap_or_default(),
            service.metadata.name.clone().unwrap_or_default(),
        );
        let opt_in = crate::desired::scope::OptIn::of(&service);
        if opt_in.is_marked() || ours.contains_key(&key) {
            views.push(ServiceView::of(client, service).await?);
        }
    }
    Ok(views)
}

/// (namespace, Service name) of every slice of endpoints-guard's.
async fn services_with_our_slices(
    client: &Client,
    namespace: Option<&str>,
) -> Result<BTreeMap<(String, String), usize>> {
    let api: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let selector = format!("{LABEL_SLICE_MANAGED_BY}={MANAGER}");
    let listed = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            Error::kube(
                "listing endpoints-guard's EndpointSlices",
                selector.clone(),
                e,
            )
        })?;
    let mut by_service = BTreeMap::new();
    for slice in listed.items {
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::desired::slices::LABEL_SERVICE_NAME))
            .cloned()
            .unwrap_or_default();
        *by_service
            .entry((slice.metadata.namespace.unwrap_or_default(), service))
            .or_default() += 1;
    }
    Ok(by_service)
}

/// Prints one line per Service; an error only when the API cannot be read.
pub async fn run(client: &Client, namespace: Option<&str>) -> Result<()> {
    let views = marked_services(client, namespace).await?;
    let warnings = last_warnings(client, &views).await?;
    println!("SERVICE\tSTATE\tPUBLISHERS (ready addresses)\tENDPOINTS BY\tLAST WARNING");
    for view in &views {
        let publishers = view
            .publishers()
            .iter()
            .map(|(manager, ready)| format!("{manager}={ready}"))
            .collect::<Vec<_>>()
            .join(",");
        let warning = warnings
            .get(&(view.name.namespace.clone(), view.name.name.clone()))
            .cloned()
            .unwrap_or_else(|| "-".to_string());
        // Beside upstream after a takeover is known to the controller alone;
        // its Event tells it here.
        let standing = match view.standing() {
            Standing::State(OptInState::BesideUpstream)
                if warning.starts_with(SELECTOR_RESTORED) =>
            {
                Standing::State(OptInState::SelectorRestored)
            }
            other => other,
        };
        println!(
            "{}\t{}\t{}\t{}\t{}",
            view.name,
            standing,
            if publishers.is_empty() {
                "-".to_string()
            } else {
                publishers
            },
            view.endpoints_manager().unwrap_or_else(|| "-".to_string()),
            warning
        );
    }
    if views.is_empty() {
        println!("(no Service carries an opt-in)");
    }
    Ok(())
}

/// The newest Warning endpoints-guard reported on each Service, as
/// "Reason: note", by (namespace, name).
async fn last_warnings(
    client: &Client,
    views: &[ServiceView],
) -> Result<BTreeMap<(String, String), String>> {
    let namespaces: std::collections::BTreeSet<&str> =
        views.iter().map(|v| v.name.namespace.as_str()).collect();
    let mut newest: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for namespace in namespaces {
        let api: Api<Event> = Api::namespaced(client.clone(), namespace);
        let listed = api
            .list(&ListParams::default().fields("type=Warning,involvedObject.kind=Service"))
            .await
            .map_err(|e| Error::kube("listing Events", namespace, e))?;
        for event in listed.items {
            let reporter = event
                .reporting_component
                .as_deref()
                .or(event.source.as_ref().and_then(|s| s.component.as_deref()));
            if reporter != Some(REPORTER) {
                continue;
            }
            let key = (
                namespace.to_string(),
                event.involved_object.name.clone().unwrap_or_default(),
            );
            let at = event
                .event_time
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| event.last_timestamp.as_ref().map(|t| t.0.to_string()))
                .unwrap_or_default();
            let text = format!(
                "{}: {}",
                event.reason.unwrap_or_default(),
                event.message.unwrap_or_default()
            );
            if newest.get(&key).is_none_or(|(seen, _)| *seen < at) {
                newest.insert(key, (at, text));
            }
        }
    }
    Ok(newest.into_iter().map(|(k, (_, text))| (k, text)).collect())
}
