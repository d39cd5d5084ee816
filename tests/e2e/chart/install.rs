//! `helm install` on a real control plane whose kube-apiserver runs the
//! admission plugins hardened and OpenShift-like clusters enable, then
//! endpoints-guard with the chart's ServiceAccount token: it reconciles
//! (Endpoints and EndpointSlices) and is denied the rest; the `helm test`
//! check passes on the metrics Service once endpoints-guard wrote it, and
//! not before.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use super::*;
use crate::common::endpoints_guard;

/// Admission plugins on top of kube-apiserver's defaults, as hardened and
/// OpenShift-like clusters run them (docs/rbac.md). PodSecurity, Priority,
/// LimitRanger and ResourceQuota are on by default; listed to stay on.
const HARDENED_ADMISSION: &str = "--enable-admission-plugins=NodeRestriction,PodSecurity,\
OwnerReferencesPermissionEnforcement,AlwaysPullImages,DenyServiceExternalIPs,\
LimitRanger,ResourceQuota,PodTolerationRestriction,Priority";

/// The chart's pod as the Deployment would create it, on `node`.
fn deployment_pod(deployment: &Deployment, name: &str, node: &str) -> Result<Pod> {
    let template = deployment
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .context("Deployment without a template")?;
    let mut metadata = template.metadata.unwrap_or_default();
    metadata.name = Some(name.to_string());
    metadata.namespace = Some(NAMESPACE.to_string());
    let mut spec = template.spec.context("template without a spec")?;
    spec.node_name = Some(node.to_string());
    Ok(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

/// Runs `endpoints-guard --kubeconfig <kubeconfig> <args>` to its end: whether
/// it succeeded, and its stderr.
async fn run_verify(kubeconfig: &Path, args: &[String]) -> Result<(bool, String)> {
    let out = tokio::process::Command::new(endpoints_guard())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

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
    let cp = ControlPlane::start(ControlPlaneOptions::default().apiserver_arg(HARDENED_ADMISSION))
        .await?;
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
        "--set",
        "metrics.readers[0].kind=ServiceAccount,metrics.readers[0].name=prometheus,metrics.readers[0].namespace=monitoring",
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

    // The release namespace under the restricted Pod Security profile; the
    // Deployment's pod and the `helm test` Pod are admitted there.
    let restricted = Patch::Merge(serde_json::json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
    }}}));
    Api::<Namespace>::all(client.clone())
        .patch(NAMESPACE, &PatchParams::default(), &restricted)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let loose = PodBuilder::new(NAMESPACE, "not-restricted").build();
    assert_eq!(
        api_code(&pods.create(&PostParams::default(), &loose).await),
        Some(403),
        "PodSecurity must refuse a pod outside the restricted profile"
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(RELEASE)
        .await?;
    pods.create(
        &PostParams::default(),
        &deployment_pod(&deployment, "endpoints-guard-0", "node-a")?,
    )
    .await
    .context("the Deployment's pod under the restricted profile and the hardened admission")?;
    cp.set_pod_status(
        NAMESPACE,
        "endpoints-guard-0",
        PodStatusSpec::ready(["10.1.0.9"]),
    )
    .await?;
    // The `helm test` hook: its ServiceAccount, Role, RoleBinding and Pod.
    let hooks = documents(&stdout(Command::new(helm()).args([
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--set",
        "mode=enforce,scope=all",
        "--show-only",
        "templates/tests/verify-endpoints.yaml",
    ]))?)?;
    let test_sa: ServiceAccount = serde_yaml::from_value(find(&hooks, "ServiceAccount")?.clone())?;
    let test_sa_name = test_sa.metadata.name.clone().context("test SA name")?;
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &test_sa)
        .await?;
    Api::<Role>::namespaced(client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_yaml::from_value(find(&hooks, "Role")?.clone())?,
        )
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_yaml::from_value(find(&hooks, "RoleBinding")?.clone())?,
        )
        .await?;
    let mut test_pod: Pod = serde_yaml::from_value(find(&hooks, "Pod")?.clone())?;
    let test_args = test_pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.args.clone())
        .context("the test Pod's args")?;
    if let Some(spec) = test_pod.spec.as_mut() {
        spec.node_name = Some("node-a".to_string());
    }
    pods.create(&PostParams::default(), &test_pod)
        .await
        .context("the helm test Pod under the restricted profile")?;
    let test_token = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create_token_request(&test_sa_name, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")?;
    let test_kubeconfig = cp.kubeconfig_for_token("chart-test", &test_token)?;
    // Before endpoints-guard runs, nobody wrote the metrics Service's objects:
    // the check fails.
    let mut quick: Vec<String> = test_args
        .iter()
        .filter(|a| !a.starts_with("--timeout"))
        .cloned()
        .collect();
    quick.push("--timeout=1s".to_string());
    let (passed, stderr) = run_verify(&test_kubeconfig, &quick).await?;
    assert!(
        !passed,
        "helm test passed before endpoints-guard ran: {stderr}"
    );
    assert!(stderr.contains("no Endpoints"), "{stderr}");

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
    let [port, secure_port] = free_ports()?;
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
        // /metrics over HTTPS with a self-signed certificate, the chart's
        // RBAC asking the API server who calls.
        "--secure-metrics-addr",
        &format!("127.0.0.1:{secure_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut guard = Process::spawn("endpoints-guard", &endpoints_guard(), &args, &log)?;

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
    // What `helm test` runs, with the test ServiceAccount's token: passes.
    let (passed, stderr) = run_verify(&test_kubeconfig, &test_args).await?;
    assert!(
        passed,
        "helm test failed after endpoints-guard wrote the objects: {stderr}"
    );
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
    // The leader watches its own Lease, by name, and no other.
    let own_leases: Api<Lease> = Api::namespaced(sa.clone(), NAMESPACE);
    own_leases
        .list(&ListParams::default().fields("metadata.name=endpoints-guard"))
        .await
        .context("listing its own Lease by name is granted")?;
    assert_eq!(
        api_code(&own_leases.list(&ListParams::default()).await),
        Some(403),
        "list every Lease"
    );
    let log_text = std::fs::read_to_string(&log)?;
    assert!(
        !log_text.contains("watching the leader Lease failed"),
        "the leader could not watch its Lease: {}",
        guard.log_tail(20)
    );
    // /metrics: the chart's metrics reader gets it; the test ServiceAccount
    // (authenticated, no role) is refused; no token is unauthenticated.
    cp.create_namespace("monitoring").await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "monitoring");
    let reader: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "prometheus"}}))?;
    accounts.create(&PostParams::default(), &reader).await?;
    let reader_token = accounts
        .create_token_request("prometheus", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")?;
    let body = scrape(secure_port, Some(&reader_token))
        .await
        .with_context(|| guard.log_tail(20))?;
    assert!(body.contains("endpoints_guard_build_info{"), "{body}");
    assert!(body.contains("process_resident_memory_bytes"), "{body}");
    assert_eq!(
        api_code(
            &scrape(secure_port, Some(&test_token))
                .await
                .map_err(into_kube)
        ),
        Some(403)
    );
    assert_eq!(
        api_code(&scrape(secure_port, None).await.map_err(into_kube)),
        Some(401)
    );
    guard.ensure_running()?;
    guard.stop().await?;

    // Opt-in scope, the chart's default: `helm test` opts a copy of the
    // metrics Service in and passes once endpoints-guard's own objects list
    // its ready pods; the copy is gone afterwards.
    let hooks = documents(&stdout(Command::new(helm()).args([
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--show-only",
        "templates/tests/verify-endpoints.yaml",
    ]))?)?;
    let roles = Api::<Role>::namespaced(client.clone(), NAMESPACE);
    let role: Role = serde_yaml::from_value(find(&hooks, "Role")?.clone())?;
    let role_name = role.metadata.name.clone().context("test Role name")?;
    roles.delete(&role_name, &Default::default()).await?;
    roles.create(&PostParams::default(), &role).await?;
    let opt_in_args = serde_yaml::from_value::<Pod>(find(&hooks, "Pod")?.clone())?
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .context("the opt-in test Pod's args")?;
    assert!(
        opt_in_args.contains(&"--opt-in-copy".to_string()),
        "{opt_in_args:?}"
    );
    let mut opt_in_guard = Process::spawn(
        "endpoints-guard",
        &endpoints_guard(),
        &args
            .iter()
            .cloned()
            .chain(["--scope".to_string(), "opt-in".to_string()])
            .collect::<Vec<_>>(),
        &cp.log_dir().join("endpoints-guard-chart-sa-opt-in.log"),
    )?;
    let (passed, stderr) = run_verify(&test_kubeconfig, &opt_in_args).await?;
    assert!(
        passed,
        "helm test in opt-in scope failed: {stderr}\n{}",
        opt_in_guard.log_tail(20)
    );
    let copies = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("endpoints-guard/opt-in=true"))
        .await?;
    assert!(copies.items.is_empty(), "the opted-in copy was left behind");
    opt_in_guard.ensure_running()?;
    opt_in_guard.stop().await?;
    Ok(())
}

/// GET https://127.0.0.1:`port`/metrics with a bearer `token` (the
/// self-signed certificate not checked), through a kube client.
async fn scrape(port: u16, token: Option<&str>) -> Result<String> {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    config.accept_invalid_certs = true;
    config.auth_info.token = token.map(|t| t.to_string().into());
    let client = kube::Client::try_from(config)?;
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// The kube error inside, for [`api_code`].
fn into_kube(err: anyhow::Error) -> kube::Error {
    match err.downcast::<kube::Error>() {
        Ok(err) => err,
        Err(other) => kube::Error::Service(other.into()),
    }
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
