//! The chart, deploy/ and the kind e2e script: lint, drift, flags, rendering,
//! shellcheck, and `helm install` on a real control plane, then endpoints-guard
//! with the chart's ServiceAccount token: it reconciles and is denied the rest.

mod install;
mod package;
mod rbac;
mod render;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::eventually;
use anyhow::{Context, Result};
use clap::CommandFactory;
use eg_harness::process::{Process, free_ports};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder};
use endpoints_guard::config::Config;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use render::{
    container, documents, find, find_all, helm, root, run, stdout, strings, template, template_with,
};
use serde_yaml::Value;

const CHART: &str = "charts/endpoints-guard";
const RELEASE: &str = "endpoints-guard";
const NAMESPACE: &str = "endpoints-guard";

#[test]
fn helm_lint_passes_with_and_without_the_optional_parts() -> Result<()> {
    run(Command::new(helm()).args(["lint", "--strict", CHART]))?;
    run(Command::new(helm()).args([
        "lint",
        "--strict",
        CHART,
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true,chaos.enabled=true,chaos.image.repository=example.invalid/watch-chaos,createNamespace=true",
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
    // And the script renders what plain `helm template` renders, less the
    // `helm test` hooks.
    let plain = template_with(&["--skip-tests", "--no-hooks"], &["createNamespace=true"])?;
    assert!(
        !plain.contains("helm.sh/hook"),
        "a hook in deploy/endpoints-guard.yaml"
    );
    let file = std::fs::read_to_string(root().join("deploy/endpoints-guard.yaml"))?;
    let body: String = file
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(body, plain);
    Ok(())
}

/// The chart's README (its values table) and runbook.md are what `make
/// chart-readme` makes of values.yaml's comments and docs/runbook.md, and
/// `helm show readme` prints the README.
#[test]
fn the_chart_readme_and_runbook_are_generated() -> Result<()> {
    for (path, want) in eg_chart::chart_docs::expected(&root())? {
        let have = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        assert!(
            have == want,
            "{} differs from what `make chart-readme` makes: run it and commit the result",
            path.display()
        );
    }
    let readme = std::fs::read_to_string(root().join(CHART).join("README.md"))?;
    let shown = stdout(Command::new(helm()).args(["show", "readme", CHART]))?;
    assert_eq!(shown.trim_end(), readme.trim_end());
    Ok(())
}

#[test]
fn every_flag_is_reachable_from_values() -> Result<()> {
    let rendered = template(&[
        "watchNamespace=team-a",
        "extraArgs={--context=ctx,--kubeconfig=/k}",
        "metrics.tls.secretName=eg-tls",
        "managedBy=own",
        // Both render nothing at their defaults: the server's version decides.
        "kubeRules=1.34",
        "featureGates.PreferSameTrafficDistribution=false",
        // Renders --disable-compression only when off.
        "compressResponses=false",
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
    for default in ["--mode=enforce", "--scope=opt-in"] {
        assert!(
            args.contains(&default.to_string()),
            "opt-in scope, enforcing, is the default: {args:?}"
        );
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--managed-by")),
        "the scope picks the managed-by value: {args:?}"
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
            "/endpoints/restricted: create",
            "/endpoints: create,delete,get,list,update,watch",
            "/events: create,patch,update",
            "/nodes: get,list,watch",
            "/pods: get,list,watch",
            "/services/finalizers: update",
            "/services: get,list,watch",
            "discovery.k8s.io/endpointslices: create,delete,get,list,update,watch",
            "events.k8s.io/events: create,patch,update",
        ]
    );
    let role = find(&docs, "Role")?;
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(NAMESPACE));
    assert_eq!(strings(&role["rules"][0]["resources"]), ["leases"]);
    // Watching is granted on its own Lease only.
    assert_eq!(strings(&role["rules"][1]["verbs"]), ["list", "watch"]);
    assert_eq!(
        strings(&role["rules"][1]["resourceNames"]),
        ["endpoints-guard"]
    );
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
    // Opt-in scope writes its own managed-by value and runs both controllers.
    for bad in [
        "managedBy=upstream",
        "controllers={endpoints}",
        "scope=some",
    ] {
        assert!(template(&[bad]).is_err(), "{bad} accepted in opt-in scope");
    }
    template(&["scope=all", "managedBy=upstream"])?;
    // The controllers list picks the flags and the RBAC rules.
    assert!(template(&["scope=all", "controllers={endpoints,yolo}"]).is_err());
    let endpoints_only = documents(&template(&["scope=all", "controllers={endpoints}"])?)?;
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

/// In opt-in scope `helm uninstall` first runs a pre-delete Job, the
/// controller's own image and ServiceAccount under the restricted profile,
/// that fails while a Service is opted in; in all scope (nothing opts in)
/// or when turned off, there is none.
#[test]
fn uninstall_is_checked_in_opt_in_scope() -> Result<()> {
    let docs = documents(&template(&["watchNamespace=team-a"])?)?;
    let job = find(&docs, "Job")?;
    let annotations = &job["metadata"]["annotations"];
    assert_eq!(annotations["helm.sh/hook"].as_str(), Some("pre-delete"));
    assert_eq!(job["spec"]["backoffLimit"].as_i64(), Some(0));
    let pod = &job["spec"]["template"]["spec"];
    let deployment = find(&docs, "Deployment")?;
    assert_eq!(
        pod["serviceAccountName"],
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
    );
    assert_eq!(pod["restartPolicy"].as_str(), Some("Never"));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    // The metrics Service and the PodDisruptionBudget select the
    // Deployment's pods by these labels: the check's pod is not one.
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    let selected = selector
        .as_mapping()
        .context("the Deployment's selector")?
        .iter()
        .all(|(key, value)| labels[key.as_str().unwrap_or_default()] == *value);
    assert!(!selected, "the check's pod {labels:?} matches {selector:?}");
    let check = &pod["containers"][0];
    assert_eq!(
        check["image"],
        container(deployment, "endpoints-guard")?["image"]
    );
    assert_eq!(
        check["securityContext"]["capabilities"]["drop"],
        serde_yaml::from_str::<Value>("[ALL]")?
    );
    let args = strings(&check["args"]);
    assert_eq!(args, ["--namespace=team-a", "check-uninstall"]);
    let mut argv = vec!["endpoints-guard".to_string()];
    argv.extend(args);
    let cfg = <Config as clap::Parser>::try_parse_from(&argv)?;
    assert!(
        matches!(
            cfg.command,
            Some(endpoints_guard::config::Command::CheckUninstall)
        ),
        "{cfg:?}"
    );
    for values in [&["scope=all"][..], &["uninstallCheck.enabled=false"][..]] {
        let docs = documents(&template(values)?)?;
        assert!(find(&docs, "Job").is_err(), "{values:?}: a Job");
    }
    Ok(())
}

/// `apiServer.host`/`port` give every pod of the chart a direct address of
/// the API server, in the variables in-cluster clients read; unset, none of
/// them carries it (the `kubernetes` Service's, which the kubelet sets).
#[test]
fn a_direct_api_server_address_reaches_every_container() -> Result<()> {
    let env_of = |container: &Value| -> Vec<(String, String)> {
        container["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e["name"].as_str()?;
                name.starts_with("KUBERNETES_SERVICE_").then(|| {
                    (
                        name.to_string(),
                        e["value"].as_str().unwrap_or_default().to_string(),
                    )
                })
            })
            .collect()
    };
    let containers = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .flat_map(|d| {
                let spec = match d["kind"].as_str() {
                    Some("Deployment") | Some("Job") => &d["spec"]["template"]["spec"],
                    Some("Pod") => &d["spec"],
                    _ => return Vec::new(),
                };
                spec["containers"]
                    .as_sequence()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    };
    let direct = documents(&template(&[
        "apiServer.host=10.1.2.3",
        "apiServer.port=8443",
        "chaos.enabled=true",
        "chaos.image.repository=example.invalid/watch-chaos",
    ])?)?;
    let all = containers(&direct);
    // The controller, the watch-chaos sidecar, the uninstall check, the test.
    assert_eq!(all.len(), 4, "{all:?}");
    for container in &all {
        assert_eq!(
            env_of(container),
            [
                (
                    "KUBERNETES_SERVICE_HOST".to_string(),
                    "10.1.2.3".to_string()
                ),
                ("KUBERNETES_SERVICE_PORT".to_string(), "8443".to_string()),
            ],
            "{}",
            container["name"].as_str().unwrap_or_default()
        );
    }
    let default = documents(&template(&[
        "chaos.enabled=true",
        "chaos.image.repository=example.invalid/watch-chaos",
    ])?)?;
    for container in containers(&default) {
        assert!(env_of(&container).is_empty(), "{container:?}");
    }
    assert!(template(&["apiServer.host=a b"]).is_err());
    Ok(())
}

/// The fault injector never ships in what operators run: the Dockerfile's
/// default stage holds endpoints-guard alone, and the chart's sidecar takes
/// an image of its own, which it refuses to guess.
#[test]
fn watch_chaos_stays_out_of_the_production_image() -> Result<()> {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile"))?;
    let last_stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .context("no stage")?;
    assert!(
        last_stage.contains("endpoints-guard") && !last_stage.contains("watch-chaos"),
        "the default stage:\n{last_stage}"
    );
    assert!(
        dockerfile.contains(" AS watch-chaos\n"),
        "no watch-chaos stage"
    );
    let refused = template(&["chaos.enabled=true"]);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("chaos.image.repository")),
        "{refused:?}"
    );
    let docs = documents(&template(&[
        "chaos.enabled=true",
        "chaos.image.repository=registry.example/watch-chaos",
        "chaos.image.tag=t1",
    ])?)?;
    let deployment = find(&docs, "Deployment")?;
    assert_eq!(
        container(deployment, "watch-chaos")?["image"].as_str(),
        Some("registry.example/watch-chaos:t1")
    );
    let production = documents(&template(&[])?)?;
    assert!(container(find(&production, "Deployment")?, "watch-chaos").is_err());
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
    assert_eq!(
        chaos["image"].as_str(),
        Some("endpoints-guard-watch-chaos:e2e-test"),
        "the test-only image, not the controller's"
    );
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
    // The arguments parse; extraArgs (hack/kind-values.yaml) override what
    // the chart sets.
    let mut argv = vec!["endpoints-guard".to_string()];
    argv.extend(args.iter().cloned());
    let cfg = <Config as clap::Parser>::try_parse_from(&argv)?;
    assert_eq!(
        cfg.managed_by(),
        endpoints_guard::desired::ManagedBy::Own,
        "{args:?}"
    );
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
