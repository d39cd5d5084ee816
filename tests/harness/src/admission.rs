//! Denying writes the way a cluster's own policy would: a
//! ValidatingAdmissionPolicy (GA since v1.30, on by default) that refuses
//! every create and update of Endpoints in one namespace.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Endpoints;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::ControlPlane;

const POLICY: &str = "eg-deny-endpoints-writes";

impl ControlPlane {
    /// From now on, every create or update of Endpoints in `namespace` is
    /// refused (by anyone). Returns once a probe write is refused: policies
    /// take a moment to load.
    pub async fn deny_endpoints_writes(&self, namespace: &str) -> Result<()> {
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": POLICY},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["endpoints"],
                }]},
                "validations": [{
                    "expression": "false",
                    "message": "Endpoints writes are denied by eg-harness",
                }],
            },
        }))?;
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": POLICY},
            "spec": {
                "policyName": POLICY,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace,
                }}},
            },
        }))?;
        let client = self.client();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .context("creating the ValidatingAdmissionPolicy")?;
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .context("creating the ValidatingAdmissionPolicyBinding")?;
        // Probe with a dry-run create until it is refused.
        let probe: Endpoints = serde_json::from_value(json!({"metadata": {"name": "eg-probe"}}))?;
        let endpoints: Api<Endpoints> = Api::namespaced(client, namespace);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match endpoints.create(&dry_run, &probe).await {
                Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                    return Ok(());
                }
                _ if Instant::now() > deadline => {
                    bail!("the ValidatingAdmissionPolicy did not take effect within 30 s")
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Removes the policy of [`ControlPlane::deny_endpoints_writes`].
    pub async fn allow_endpoints_writes(&self) -> Result<()> {
        let client = self.client();
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete(POLICY, &DeleteParams::default())
            .await
            .context("deleting the ValidatingAdmissionPolicyBinding")?;
        Api::<ValidatingAdmissionPolicy>::all(client)
            .delete(POLICY, &DeleteParams::default())
            .await
            .context("deleting the ValidatingAdmissionPolicy")?;
        Ok(())
    }
}
