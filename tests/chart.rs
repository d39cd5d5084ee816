//! The chart, deploy/ and the kind e2e script: lint, drift, flags, rendering,
//! shellcheck, and `helm install` on a real control plane, then endpoints-guard
//! with the chart's ServiceAccount token: it reconciles and is denied the rest.

#[allow(dead_code)] // Each test binary uses a different part of the shared helpers.
mod common;
#[path = "chart/render.rs"]
mod render;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::CommandFactory;
use common::eventually;
use eg_testsupport::process::{Process, free_port};
use eg_testsupport::{
    ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder,
};
use endpoints_guard::config::Config;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use render::{container, documents, find, helm, root, run, stdout, strings, template};
use serde_yaml::Value;

const CHART: &str = "charts/endpoints-guard";
const RELEASE: &str = "endpoints-guard";
const NAMESPACE: &str = "endpoints-guard";

#[test]
fn helm_lint_passes_with_and_without_the_optional_parts() -> Result<()> {
    run(Command::new(helm()).args(["lint", CHART]))?;
    run(Command::new(helm()).args([
        "lint",
        CHART,
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true,chaos.enabled=true,createNamespace=true",
    ]))?;
    Ok(())
}

#[test]
fn deploy_manifests_match_helm_template() -> Result<()> {
    let dir = tempfile::tempdir()?;
    run(Command::new("bash")
        .arg("hack/render-manifests.sh")
        .arg(dir.path()))?;
    for file in ["endpoints-guard.yaml", "monitoring.yaml"] {
        let want = std::fs::read_to_string(dir.path().join(file))?;
        let have = std::fs::read_to_string(root().join("deploy").join(file))
            .with_context(|| format!("reading deploy/{file}"))?;
        assert!(
            want == have,
            "deploy/{file} drifted from `helm template`: run `make deploy-manifests` and commit the result"
        );
    }
    // And the script renders what plain `helm template` renders.
    let plain = template(&["createNamespace=true"])?;
    let file = std::fs::read_to_string(root().join("deploy/endpoints-guard.yaml"))?;
    let body: String = file
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(body, plain);
    Ok(())
}

#[test]
fn every_flag_is_reachable_from_values() -> Result<()> {
    let rendered = template(&[
        "watchNamespace=team-a",
        "extraArgs={--context=ctx,--kubeconfig=/k}",
    ])?;
    let docs = documents(&rendered)?;
    let args = strings(&container(find(&docs, "Deployment")?, "endpoints-guard")?["args"]);
    // --kubeconfig and --context (only useful outside a cluster) come from extraArgs.
    for arg in Config::command().get_arguments() {
        let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else {
            continue;
        };
        let flag = format!("--{long}");
        let set = args
            .iter()
            .any(|a| a == &flag || a.starts_with(&format!("{flag}=")));
        assert!(
            set,
            "{flag} is not set by templates/deployment.yaml: {args:?}"
        );
    }
    // The Deployment's args parse as a command line.
    let mut argv = vec!["endpoints-guard".to_string()];
    argv.extend(args);
    <Config as clap::Parser>::try_parse_from(&argv)?;
    Ok(())
}

#[test]
fn rendered_objects_are_hardened_and_least_privilege() -> Result<()> {
    let docs = documents(&template(&[])?)?;
    let deployment = find(&docs, "Deployment")?;
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(2));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let main = container(deployment, "endpoints-guard")?;
    let hardened: Value = serde_yaml::from_str(
        "{runAsNonRoot: true, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, \
         privileged: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}",
    )?;
    assert_eq!(main["securityContext"], hardened);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(main[probe]["httpGet"]["path"].as_str(), Some(path));
    }
    assert!(main["resources"]["requests"]["cpu"].is_string());
    let args = strings(&main["args"]);
    assert!(args.contains(&"--leader-elect".to_string()), "{args:?}");
    assert!(
        args.contains(&"--mode=audit".to_string()),
        "audit is the default: {args:?}"
    );
    assert!(
        container(deployment, "watch-chaos").is_err(),
        "the chaos sidecar must be off by default"
    );

    let rules = &find(&docs, "ClusterRole")?["rules"];
    let mut granted = Vec::new();
    for rule in rules.as_sequence().into_iter().flatten() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                let mut verbs = strings(&rule["verbs"]);
                verbs.sort();
                granted.push(format!("{group}/{resource}: {}", verbs.join(",")));
            }
        }
    }
    granted.sort();
    assert_eq!(
        granted,
        [
            "/endpoints: create,delete,get,list,update,watch",
            "/events: create,patch",
            "/nodes: get,list,watch",
            "/pods: get,list,watch",
            "/services: get,list,watch",
            "discovery.k8s.io/endpointslices: create,delete,get,list,update,watch",
            "events.k8s.io/events: create,patch",
        ]
    );
    let role = find(&docs, "Role")?;
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(NAMESPACE));
    assert_eq!(strings(&role["rules"][0]["resources"]), ["leases"]);
    Ok(())
}

#[test]
fn values_are_checked() -> Result<()> {
    // Bad enum, no replicas, two writers without leader election.
    for bad in [
        "mode=yolo",
        "replicaCount=0",
        "leaderElection.enabled=false",
    ] {
        assert!(template(&[bad]).is_err(), "{bad} accepted");
    }
    template(&["leaderElection.enabled=false", "replicaCount=1"])?;
    // The controllers list picks the flags and the RBAC rules.
    assert!(template(&["controllers={endpoints,yolo}"]).is_err());
    let endpoints_only = documents(&template(&["controllers={endpoints}"])?)?;
    let args =
        strings(&container(find(&endpoints_only, "Deployment")?, "endpoints-guard")?["args"]);
    assert!(
        args.contains(&"--controllers=endpoints".to_string()),
        "{args:?}"
    );
    let rules = serde_yaml::to_string(&find(&endpoints_only, "ClusterRole")?["rules"])?;
    assert!(
        !rules.contains("endpointslices") && !rules.contains("nodes"),
        "{rules}"
    );
    let monitoring = documents(&template(&[
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ])?)?;
    let rule = find(&monitoring, "PrometheusRule")?;
    let alerts: Vec<String> = rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    for want in [
        "EndpointsGuardSpuriousDeletionsPrevented",
        "EndpointsGuardObservedSpuriousDeletions",
        "EndpointsGuardResyncDrift",
        "EndpointsGuardResyncStale",
        "EndpointsGuardNotReady",
    ] {
        assert!(
            alerts.iter().any(|a| a == want),
            "missing alert {want}: {alerts:?}"
        );
    }
    let dashboard = find(&monitoring, "ConfigMap")?;
    let json = dashboard["data"]["endpoints-guard.json"]
        .as_str()
        .context("no dashboard JSON")?;
    let parsed: serde_json::Value = serde_json::from_str(json)?;
    assert!(parsed["panels"].as_array().is_some_and(|p| !p.is_empty()));
    find(&monitoring, "ServiceMonitor")?;
    Ok(())
}

#[test]
fn kind_config_disables_the_upstream_endpoints_controller() -> Result<()> {
    let text = stdout(Command::new("bash").args(["hack/e2e-kind.sh", "kind-config"]))?;
    let config: Value = serde_yaml::from_str(&text)?;
    assert_eq!(config["kind"].as_str(), Some("Cluster"));
    assert_eq!(
        config["apiVersion"].as_str(),
        Some("kind.x-k8s.io/v1alpha4")
    );
    let patches = strings(&config["kubeadmConfigPatches"]);
    let patch: Value = serde_yaml::from_str(patches.first().context("no kubeadmConfigPatches")?)?;
    assert_eq!(patch["kind"].as_str(), Some("ClusterConfiguration"));
    assert_eq!(
        patch["controllerManager"]["extraArgs"]["controllers"].as_str(),
        Some("*,-endpoints-controller,-endpointslice-controller")
    );
    let roles: Vec<&str> = config["nodes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|n| n["role"].as_str())
        .collect();
    assert_eq!(roles, ["control-plane", "worker", "worker"]);
    Ok(())
}

#[test]
fn kind_e2e_installs_the_watch_chaos_sidecar() -> Result<()> {
    let rendered = stdout(
        Command::new("bash")
            .args(["hack/e2e-kind.sh", "helm-template"])
            .env(
                "EG_CHAOS_FAULTS",
                "services:old-delete-rv pods:drop-deletes",
            )
            .env("IMAGE", "endpoints-guard:e2e-test"),
    )?;
    let docs = documents(&rendered)?;
    let deployment = find(&docs, "Deployment")?;
    let chaos = container(deployment, "watch-chaos")?;
    assert_eq!(chaos["image"].as_str(), Some("endpoints-guard:e2e-test"));
    assert_eq!(strings(&chaos["command"]), ["/usr/local/bin/watch-chaos"]);
    let chaos_args = strings(&chaos["args"]);
    for want in [
        "--fault=services:old-delete-rv",
        "--fault=pods:drop-deletes",
        "--listen=127.0.0.1:8001",
    ] {
        assert!(
            chaos_args.iter().any(|a| a == want),
            "{want} missing: {chaos_args:?}"
        );
    }
    let main = container(deployment, "endpoints-guard")?;
    let args = strings(&main["args"]);
    assert!(args.contains(&"--mode=enforce".to_string()), "{args:?}");
    assert!(
        args.contains(&"--kubeconfig=/etc/endpoints-guard/chaos/client.kubeconfig".to_string()),
        "endpoints-guard must talk to the proxy: {args:?}"
    );
    assert_eq!(main["imagePullPolicy"].as_str(), Some("Never"));
    let configmap = find(&docs, "ConfigMap")?;
    let client: Value = serde_yaml::from_str(
        configmap["data"]["client.kubeconfig"]
            .as_str()
            .context("no client.kubeconfig")?,
    )?;
    assert_eq!(
        client["clusters"][0]["cluster"]["server"].as_str(),
        Some("http://127.0.0.1:8001")
    );
    Ok(())
}

#[test]
fn hack_scripts_are_shellcheck_clean() -> Result<()> {
    if Command::new("shellcheck")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("shellcheck not installed: skipped (`make lint-shell` installs it and runs it)");
        return Ok(());
    }
    let scripts: Vec<PathBuf> = std::fs::read_dir(root().join("hack"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    run(Command::new("shellcheck").args(&scripts))?;
    Ok(())
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
    let written = eventually(
        Duration::from_secs(60),
        "demo/web Endpoints written with the chart's token",
        || async {
            let ep = endpoints.get_opt("web").await?;
            let ips: Vec<String> = ep
                .iter()
                .flat_map(|e| e.subsets.iter().flatten())
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| a.ip.clone())
                .collect();
            Ok((ips == ["10.1.0.5"]).then_some(()))
        },
    )
    .await;
    if let Err(err) = written {
        guard.ensure_running()?;
        return Err(err.context(guard.log_tail(40)));
    }
    // The EndpointSlice controller (on by default) is granted what it needs too.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "demo");
    let sliced = eventually(
        Duration::from_secs(60),
        "demo/web EndpointSlice written with the chart's token",
        || async {
            let listed = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await?;
            let addresses: Vec<String> = listed
                .items
                .iter()
                .flat_map(|slice| slice.endpoints.iter().flatten())
                .flat_map(|endpoint| endpoint.addresses.iter().cloned())
                .collect();
            Ok((addresses == ["10.1.0.5"]).then_some(()))
        },
    )
    .await;
    if let Err(err) = sliced {
        guard.ensure_running()?;
        return Err(err.context(guard.log_tail(40)));
    }
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
