//! `helm install` on a real control plane, then endpoints-guard with the
//! chart's ServiceAccount token: it reconciles (Endpoints and EndpointSlices)
//! and is denied the rest.

use super::*;

/// Just enough of the Prometheus operator's CRDs for the API server to accept
/// a ServiceMonitor and a PrometheusRule (their schemas are not checked).
fn minimal_crd(plural: &str, kind: &str) -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))?)
}

fn api_code<T>(result: &kube::Result<T>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_then_run_with_the_charts_service_account() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();

    // The monitoring objects are installed too, against minimal CRDs.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (plural, kind) in [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    ] {
        crds.create(&PostParams::default(), &minimal_crd(plural, kind)?)
            .await?;
    }
    eventually(Duration::from_secs(30), "CRDs established", || async {
        let list = crds.list(&ListParams::default()).await?;
        let established = list.items.iter().filter(|crd| {
            let mut conditions = crd
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten());
            conditions.any(|c| c.type_ == "Established" && c.status == "True")
        });
        Ok((established.count() == 2).then_some(()))
    })
    .await?;

    let kubeconfig = cp.kubeconfig_path().display().to_string();
    run(Command::new(helm()).args([
        "install",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true,mode=enforce",
    ]))
    .context("helm install: every object must pass server-side validation")?;
    // No kubelet here: the Deployment exists but never becomes available.
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(RELEASE)
        .await?;
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(2));

    // A token for the chart's ServiceAccount, as a pod of the Deployment would get.
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create_token_request(RELEASE, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")?;

    cp.create_namespace("demo").await?;
    // The pod's Node: the EndpointSlice controller leaves out pods on Nodes it
    // does not know, as upstream's does.
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    cp.create_service(
        ServiceBuilder::new("demo", "web")
            .selector("app", "web")
            .port("http", 80, 8080, "TCP"),
    )
    .await?;
    cp.create_pod_with_status(
        PodBuilder::serving("demo", "web-0", "web"),
        PodStatusSpec::ready(["10.1.0.5"]),
    )
    .await?;

    let token_kubeconfig = cp.kubeconfig_for_token("chart-sa", &token)?;
    let port = free_port()?;
    let log = cp.log_dir().join("endpoints-guard-chart-sa.log");
    let args: Vec<String> = [
        "--kubeconfig",
        &token_kubeconfig.display().to_string(),
        "--mode",
        "enforce",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--leader-elect",
        "--leader-election-namespace",
        NAMESPACE,
        "--leader-election-lease-duration",
        "4s",
        "--leader-election-renew-grace",
        "2s",
        "--resync-interval",
        "5s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut guard = Process::spawn(
        "endpoints-guard",
        Path::new(env!("CARGO_BIN_EXE_endpoints-guard")),
        &args,
        &log,
    )?;

    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "demo");
    until_published(
        &mut guard,
        "demo/web Endpoints written with the chart's token",
        || async {
            let ep = endpoints.get_opt("web").await?;
            Ok(ep
                .iter()
                .flat_map(|e| e.subsets.iter().flatten())
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| a.ip.clone())
                .collect())
        },
    )
    .await?;
    // The EndpointSlice controller (on by default) is granted what it needs too.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "demo");
    until_published(
        &mut guard,
        "demo/web EndpointSlice written with the chart's token",
        || async {
            let listed = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await?;
            Ok(listed
                .items
                .iter()
                .flat_map(|slice| slice.endpoints.iter().flatten())
                .flat_map(|endpoint| endpoint.addresses.iter().cloned())
                .collect())
        },
    )
    .await?;
    let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get("endpoints-guard")
        .await?;
    assert!(
        lease.spec.and_then(|s| s.holder_identity).is_some(),
        "nobody holds the Lease"
    );
    // The same token is refused what the roles do not grant.
    let sa = cp.client_for_token(&token).await?;
    let secrets: Api<Secret> = Api::namespaced(sa.clone(), "demo");
    assert_eq!(
        api_code(&secrets.get("anything").await),
        Some(403),
        "get secrets"
    );
    let all_secrets: Api<Secret> = Api::all(sa.clone());
    assert_eq!(
        api_code(&all_secrets.list(&ListParams::default()).await),
        Some(403),
        "list secrets"
    );
    let services: Api<Service> = Api::namespaced(sa.clone(), "demo");
    let mut svc = services
        .get("web")
        .await
        .context("reading services is granted")?;
    svc.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("x".into(), "y".into());
    assert_eq!(
        api_code(&services.replace("web", &PostParams::default(), &svc).await),
        Some(403),
        "update services"
    );
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(
        api_code(&services.patch("web", &PatchParams::default(), &patch).await),
        Some(403),
        "patch services"
    );
    let other_leases: Api<Lease> = Api::namespaced(sa.clone(), "kube-system");
    assert_eq!(
        api_code(&other_leases.get("kube-controller-manager").await),
        Some(403),
        "leases elsewhere"
    );
    guard.ensure_running()?;
    guard.stop().await?;
    Ok(())
}

/// Waits until `addresses` reads exactly the demo pod's IP; on a timeout the
/// error carries the tail of the controller's log.
async fn until_published<F, Fut>(guard: &mut Process, what: &str, mut addresses: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<String>>>,
{
    let published = eventually(Duration::from_secs(60), what, || {
        let read = addresses();
        async move { Ok((read.await? == ["10.1.0.5"]).then_some(())) }
    })
    .await;
    if let Err(err) = published {
        guard.ensure_running()?;
        return Err(err.context(guard.log_tail(40)));
    }
    Ok(())
}
