//! kube-apiserver's command line, and waiting until it serves.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use crate::process::Process;
use crate::{ControlPlaneOptions, Pki, SERVICE_CLUSTER_IP_RANGE};

pub(crate) fn apiserver_args(
    options: &ControlPlaneOptions,
    pki: &Pki,
    port: u16,
    etcd_servers: &str,
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let bind = options.bind_address;
    let mut args = vec![
        format!("--bind-address={bind}"),
        format!("--advertise-address={bind}"),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", path(&pki.serving_cert)),
        format!("--tls-private-key-file={}", path(&pki.serving_key)),
        format!("--client-ca-file={}", path(&pki.ca_cert)),
        format!("--service-account-key-file={}", path(&pki.sa_public_key)),
        format!(
            "--service-account-signing-key-file={}",
            path(&pki.sa_private_key)
        ),
        format!("--service-account-issuer=https://{bind}:{port}"),
        "--authorization-mode=RBAC".to_string(),
        format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
        format!("--etcd-servers={etcd_servers}"),
        "--profiling=false".to_string(),
        "--v=1".to_string(),
    ];
    if bind.is_loopback() {
        // No service-account controller runs, so namespaces never get their
        // `default` ServiceAccount, and the ServiceAccount admission plugin
        // would reject every pod for lacking it.
        args.push("--disable-admission-plugins=ServiceAccount".to_string());
        // The apiserver cannot publish 127.0.0.1 as the `kubernetes`
        // Service's endpoint (loopback is invalid there) and would log an
        // error every few seconds trying; the Service itself is still made.
        args.push("--endpoint-reconciler-type=none".to_string());
    } else {
        // Pods reach kube-apiserver through the `kubernetes` Service, whose
        // endpoint the lease reconciler publishes (the advertise address),
        // with the token the ServiceAccount admission plugin mounts (the
        // real node's kube-controller-manager creates the accounts).
        args.push("--endpoint-reconciler-type=lease".to_string());
        // A real node's kubelet on the same address: exec and container logs
        // go through it, each side checking the other against the one CA.
        args.extend([
            format!(
                "--kubelet-client-certificate={}",
                path(&pki.kubelet_client_cert)
            ),
            format!("--kubelet-client-key={}", path(&pki.kubelet_client_key)),
            format!("--kubelet-certificate-authority={}", path(&pki.ca_cert)),
            // The node's name resolves nowhere; its InternalIP is what the
            // serving certificate names.
            "--kubelet-preferred-address-types=InternalIP".to_string(),
        ]);
    }
    match options.priority_and_fairness {
        // API priority and fairness only slows startup down where nothing
        // is measured under load.
        None => args.push("--enable-priority-and-fairness=false".to_string()),
        // On, with the production defaults but seat totals small enough for
        // two cores to exhaust.
        Some(limits) => args.extend([
            "--enable-priority-and-fairness=true".to_string(),
            format!("--max-requests-inflight={}", limits.readonly),
            format!("--max-mutating-requests-inflight={}", limits.mutating),
        ]),
    }
    if let Some(interval) = options.etcd_compaction_interval {
        args.push(format!(
            "--etcd-compaction-interval={}ms",
            interval.as_millis()
        ));
    }
    args.extend(options.apiserver_args.iter().cloned());
    args
}

pub(crate) async fn wait_ready(
    client: &kube::Client,
    process: &mut Process,
    timeout: Duration,
) -> Result<()> {
    process
        .wait_until(timeout, Duration::from_millis(200), || probe(client))
        .await
}

/// `/readyz` says ok and the `default` namespace exists.
async fn probe(client: &kube::Client) -> Result<()> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .context("building GET /readyz")?;
    let answer = tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
        .await
        .context("GET /readyz timed out")?
        .context("GET /readyz")?;
    if answer.trim() != "ok" {
        bail!("/readyz: {answer}");
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    tokio::time::timeout(Duration::from_secs(5), namespaces.get_opt("default"))
        .await
        .context("GET namespace default timed out")?
        .context("GET namespace default")?
        .ok_or_else(|| anyhow!("namespace default not created yet"))?;
    Ok(())
}
