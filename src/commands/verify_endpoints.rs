//! `endpoints-guard verify-endpoints`: the chart's `helm test`. Waits until a
//! Service's Endpoints and EndpointSlices list ready addresses written by
//! endpoints-guard — the API server records it as the field manager of its
//! writes ([`crate::startup::FIELD_MANAGER`]) — and reports what is missing
//! when the time is up.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::config::VerifyArgs;
use crate::desired::scope::{ANNOTATION_SELECTOR, LABEL_OPT_IN, LABEL_SKIP_MIRROR};
use crate::desired::slices::LABEL_SLICE_MANAGED_BY;
use crate::desired::{LABEL_MANAGED_BY, MANAGER};
use crate::error::{Error, Result};
use crate::settings::Controller;
use crate::startup::FIELD_MANAGER;

/// How often the objects are read again.
const POLL: Duration = Duration::from_secs(2);

/// The name of the opted-in copy `--opt-in-copy` checks.
fn copy_name(service: &str) -> String {
    let mut name: String = service.chars().take(63 - "-opt-in-check".len()).collect();
    name.push_str("-opt-in-check");
    name
}

/// Ok once every checked object is as wanted; else an error naming what is
/// missing, after `args.timeout`. With `--opt-in-copy`, on a copy of the
/// Service opted in, deleted again whatever the outcome.
pub async fn run(client: &Client, args: &VerifyArgs) -> Result<()> {
    if !args.opt_in_copy {
        return wait_verified(client, args).await;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), &args.namespace);
    let original = services
        .get(&args.service)
        .await
        .map_err(|e| Error::kube("reading the Service to copy", &args.service, e))?;
    let selector = original
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    let ports = original.spec.as_ref().and_then(|s| s.ports.clone());
    let name = copy_name(&args.service);
    let copy: Service = serde_json::from_value(json!({
        "metadata": {"name": name,
            "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
            "annotations": {ANNOTATION_SELECTOR: serde_json::to_string(&selector).unwrap_or_default()}},
        "spec": {"ports": ports},
    }))
    .map_err(|e| Error::Config(format!("the opted-in copy: {e}")))?;
    // A copy left by an earlier run that was killed goes first.
    let _ = services.delete(&name, &DeleteParams::default()).await;
    services
        .create(&PostParams::default(), &copy)
        .await
        .map_err(|e| Error::kube("creating the opted-in copy", &name, e))?;
    let checked = VerifyArgs {
        service: name.clone(),
        ..args.clone()
    };
    let verified = wait_verified(client, &checked).await;
    let deleted = services
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| Error::kube("deleting the opted-in copy", &name, e));
    verified.and(deleted.map(drop))
}

async fn wait_verified(client: &Client, args: &VerifyArgs) -> Result<()> {
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let missing = check(client, args).await?;
        if missing.is_empty() {
            tracing::info!(namespace = %args.namespace, service = %args.service, "Endpoints and EndpointSlices verified");
            return Ok(());
        }
        if tokio::time::Instant::now() + POLL > deadline {
            return Err(Error::Config(format!(
                "Service {}/{} after {:?}: {}",
                args.namespace,
                args.service,
                args.timeout,
                missing.join("; ")
            )));
        }
        tracing::info!(missing = %missing.join("; "), "waiting");
        tokio::time::sleep(POLL).await;
    }
}

/// What is not there yet (empty: all is).
async fn check(client: &Client, args: &VerifyArgs) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    let writer = |meta: &ObjectMeta| {
        args.any_writer || (written_by_us(meta) && (!args.opt_in_copy || managed_by_us(meta)))
    };
    if args.controllers.contains(&Controller::Endpoints) {
        let api: Api<Endpoints> = Api::namespaced(client.clone(), &args.namespace);
        let endpoints = api
            .get_opt(&args.service)
            .await
            .map_err(|e| Error::kube("reading the Endpoints", &args.service, e))?;
        match endpoints {
            None => missing.push("no Endpoints".to_string()),
            Some(ep) if !writer(&ep.metadata) => {
                missing.push(format!(
                    "Endpoints not written (and labelled) by {FIELD_MANAGER}"
                ));
            }
            Some(ep) => {
                let ready = ep
                    .subsets
                    .iter()
                    .flatten()
                    .flat_map(|s| s.addresses.iter().flatten())
                    .count();
                if ready == 0 {
                    missing.push("Endpoints without a ready address".to_string());
                }
            }
        }
    }
    if args.controllers.contains(&Controller::Endpointslices) {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &args.namespace);
        let selector = format!("kubernetes.io/service-name={}", args.service);
        let slices = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::kube("listing the EndpointSlices", &args.service, e))?;
        let ready = slices
            .items
            .iter()
            .filter(|slice| writer(&slice.metadata))
            .flat_map(|slice| slice.endpoints.iter().flatten())
            .filter(|endpoint| {
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
                ready != Some(false)
            })
            .count();
        if ready == 0 {
            missing.push(if args.any_writer {
                "no EndpointSlice with a ready endpoint".to_string()
            } else {
                format!("no EndpointSlice written by {FIELD_MANAGER} with a ready endpoint")
            });
        }
    }
    Ok(missing)
}

/// Whether the object's managed-by label (of Endpoints or slices) is
/// endpoints-guard's own.
fn managed_by_us(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|labels| {
        [LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY]
            .iter()
            .any(|key| labels.get(*key).map(String::as_str) == Some(MANAGER))
    })
}

/// Whether endpoints-guard is among the field managers of the object.
pub fn written_by_us(meta: &ObjectMeta) -> bool {
    meta.managed_fields
        .iter()
        .flatten()
        .any(|entry| entry.manager.as_deref() == Some(FIELD_MANAGER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn meta(managers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            managed_fields: Some(
                managers
                    .iter()
                    .map(|m| ManagedFieldsEntry {
                        manager: Some((*m).to_string()),
                        ..ManagedFieldsEntry::default()
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_copy_name_is_a_dns_label() {
        assert_eq!(copy_name("m"), "m-opt-in-check");
        assert_eq!(copy_name(&"a".repeat(63)).len(), 63);
    }

    #[test]
    fn the_writer_is_the_field_manager() {
        assert!(written_by_us(&meta(&[
            "kube-controller-manager",
            "endpoints-guard"
        ])));
        assert!(!written_by_us(&meta(&["kube-controller-manager"])));
        assert!(!written_by_us(&ObjectMeta::default()));
        assert_eq!(
            crate::startup::USER_AGENT.split('/').next(),
            Some(FIELD_MANAGER)
        );
    }
}
