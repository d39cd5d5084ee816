//! The chart as a package (issue 22 §3–§5): its metadata, `helm package`,
//! use as a dependency of another chart with `global` values, the image by
//! digest, kustomize over deploy/, scheduling and disruption defaults, the
//! `helm test` hook, the ServiceMonitor's fields, the alerts' switches, labels
//! and runbook links, Go durations in the values, /metrics over HTTPS by default and
//! the opt-in NetworkPolicy.

use super::*;

fn chart_yaml() -> Result<Value> {
    let text = std::fs::read_to_string(root().join(CHART).join("Chart.yaml"))?;
    Ok(serde_yaml::from_str(&text)?)
}

/// Chart.yaml carries what is true and nothing else: no home, sources,
/// icon or maintainer, since the project owns no address to give for them
/// (tests/e2e/addresses.rs checks every file for addresses).
#[test]
fn chart_metadata_is_complete_and_packages() -> Result<()> {
    let chart = chart_yaml()?;
    for key in ["description", "kubeVersion"] {
        assert!(chart[key].as_str().is_some(), "Chart.yaml without {key}");
    }
    for key in ["home", "sources", "icon", "maintainers"] {
        assert!(
            chart[key].is_null(),
            "Chart.yaml has {key}: {:?}",
            chart[key]
        );
    }
    let annotations = &chart["annotations"];
    for key in ["artifacthub.io/license", "artifacthub.io/category"] {
        assert!(
            annotations[key].as_str().is_some(),
            "Chart.yaml without {key}"
        );
    }
    let version = chart["version"].as_str().context("version")?;
    let app_version = chart["appVersion"].as_str().context("appVersion")?;
    assert_ne!(
        version, app_version,
        "the chart's version is its own, not the app's"
    );
    // `make chart-package`: lint --strict, then helm package.
    let dir = tempfile::tempdir()?;
    run(Command::new("bash")
        .arg("hack/package-chart.sh")
        .arg(dir.path()))?;
    let package = dir.path().join(format!("endpoints-guard-{version}.tgz"));
    assert!(package.is_file(), "no {}", package.display());
    // Who has only the package has the README and the runbook.
    let readme = std::fs::read_to_string(root().join(CHART).join("README.md"))?;
    let shown = stdout(Command::new(helm()).args(["show", "readme"]).arg(&package))?;
    assert_eq!(shown.trim_end(), readme.trim_end());
    let listing = stdout(Command::new("tar").arg("-tzf").arg(&package))?;
    assert!(
        listing.lines().any(|l| l == "endpoints-guard/runbook.md"),
        "{listing}"
    );
    // The package renders like the folder.
    let from_package = stdout(
        Command::new(helm())
            .args(["template", RELEASE])
            .arg(&package)
            .args(["--namespace", NAMESPACE]),
    )?;
    assert_eq!(from_package, template(&[])?);
    Ok(())
}

/// Chart.yaml's `kubeVersion` starts at the oldest release endpoints-guard
/// has the rules of (`KubeRelease`, the releases pinned for the tests in
/// `tests/controlplane/kubernetes/`) and has no upper bound (a newer minor
/// runs with the newest rules): an older minor does not render, a newer
/// one does.
#[test]
fn kube_version_is_the_supported_range() -> Result<()> {
    use endpoints_guard::desired::KubeRelease;
    let chart = chart_yaml()?;
    let (oldest, newest) = (KubeRelease::OLDEST.minor(), KubeRelease::NEWEST.minor());
    assert_eq!(
        chart["kubeVersion"].as_str(),
        Some(format!(">=1.{oldest}.0-0").as_str())
    );
    let pinned: Vec<u32> = eg_harness::binaries::pinned_minors(&root())?
        .iter()
        .map(|m| m.1)
        .collect();
    let supported: Vec<u32> = KubeRelease::ALL.iter().map(|r| r.minor()).collect();
    assert_eq!(pinned, supported, "pinned releases against --kube-rules");
    let renders = |version: &str| template_with(&["--kube-version", version], &[]).is_ok();
    for inside in [
        format!("1.{oldest}.0"),
        format!("1.{newest}.9"),
        format!("1.{}.0", newest + 1),
    ] {
        assert!(renders(&inside), "{inside} refused");
    }
    let older = format!("1.{}.9", oldest - 1);
    assert!(!renders(&older), "{older} accepted");
    Ok(())
}

/// A parent chart that depends on this one through `file://`, rendered with
/// `global:` values (which every chart of a parent receives) and values for
/// the dependency under its name.
#[test]
fn the_chart_works_as_a_dependency_with_global_values() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let parent = dir.path().join("platform");
    std::fs::create_dir_all(parent.join("templates"))?;
    let chart_dir = root().join(CHART);
    std::fs::write(
        parent.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: endpoints-guard\n    version: \"{}\"\n    repository: \"file://{}\"\n",
            chart_yaml()?["version"].as_str().context("version")?,
            chart_dir.display()
        ),
    )?;
    std::fs::write(
        parent.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\n  labels:\n    team: platform\nendpoints-guard:\n  mode: enforce\n  image:\n    repository: registry.example.com/endpoints-guard\n",
    )?;
    std::fs::write(
        parent.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: platform\ndata:\n  registry: {{ .Values.global.imageRegistry }}\n",
    )?;
    // Helm's own folders in the temporary one: no repository is consulted.
    let home = dir.path().join("helm-home");
    run(Command::new(helm())
        .arg("dependency")
        .arg("update")
        .arg(&parent)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data")))?;
    let rendered = stdout(
        Command::new(helm())
            .args(["template", "platform"])
            .arg(&parent)
            .args(["--namespace", "platform", "--set", "global.extra=1"]),
    )?;
    let docs = documents(&rendered)?;
    let deployment = find(&docs, "Deployment")?;
    assert_eq!(
        deployment["metadata"]["name"].as_str(),
        Some("platform-endpoints-guard")
    );
    let main = container(deployment, "endpoints-guard")?;
    assert_eq!(
        main["image"].as_str(),
        Some("registry.example.com/endpoints-guard:0.1.0")
    );
    assert!(strings(&main["args"]).contains(&"--mode=enforce".to_string()));
    find(&docs, "ConfigMap")?;
    // The dependency's schema is enforced there (so `global` passing is the
    // schema accepting it): a value it does not know is refused.
    let refused = run(Command::new(helm())
        .args(["template", "platform"])
        .arg(&parent)
        .args(["--set", "endpoints-guard.notAValue=1"]));
    assert!(refused.is_err(), "the schema accepts unknown values");
    Ok(())
}

#[test]
fn the_image_is_pinned_by_digest_when_given() -> Result<()> {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let docs = documents(&template(&[
        "image.repository=registry.example.com/eg",
        &format!("image.digest={digest}"),
        "image.tag=ignored",
    ])?)?;
    let main = container(find(&docs, "Deployment")?, "endpoints-guard")?;
    let want = format!("registry.example.com/eg@{digest}");
    assert_eq!(main["image"].as_str(), Some(want.as_str()));
    assert!(
        template(&["image.digest=latest"]).is_err(),
        "a digest that is not one"
    );
    Ok(())
}

/// `kustomize edit set image endpoints-guard=...` rewrites the images whose
/// name is `endpoints-guard`: the one deploy/endpoints-guard.yaml runs.
#[test]
fn deploy_kustomization_sets_the_rendered_image() -> Result<()> {
    let text = std::fs::read_to_string(root().join("deploy/kustomization.yaml"))?;
    let kustomization: Value = serde_yaml::from_str(&text)?;
    assert_eq!(kustomization["kind"].as_str(), Some("Kustomization"));
    let resources = strings(&kustomization["resources"]);
    for resource in &resources {
        assert!(
            root().join("deploy").join(resource).is_file(),
            "{resource} is not in deploy/"
        );
    }
    assert!(resources.contains(&"endpoints-guard.yaml".to_string()));
    let image = &kustomization["images"][0];
    let rendered = documents(&std::fs::read_to_string(
        root().join("deploy/endpoints-guard.yaml"),
    )?)?;
    let main = container(find(&rendered, "Deployment")?, "endpoints-guard")?;
    let (name, tag) = main["image"]
        .as_str()
        .and_then(|i| i.rsplit_once(':'))
        .context("image name:tag")?;
    assert_eq!(image["name"].as_str(), Some(name));
    assert_eq!(image["newTag"].as_str(), Some(tag));

    // kubectl's kustomize, where kubectl is installed: the images entry that
    // `kustomize edit set image endpoints-guard=registry.example.com/eg:v9`
    // writes changes the Deployment's image.
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        eprintln!("kubectl not installed: kustomize build skipped");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    std::fs::copy(
        root().join("deploy/endpoints-guard.yaml"),
        dir.path().join("endpoints-guard.yaml"),
    )?;
    let edited = text.replace(
        &format!("  - name: endpoints-guard\n    newTag: {tag}\n"),
        "  - name: endpoints-guard\n    newName: registry.example.com/eg\n    newTag: v9\n",
    );
    assert_ne!(edited, text, "the images entry has another layout");
    std::fs::write(dir.path().join("kustomization.yaml"), edited)?;
    let built = documents(&stdout(
        Command::new("kubectl").arg("kustomize").arg(dir.path()),
    )?)?;
    let main = container(find(&built, "Deployment")?, "endpoints-guard")?;
    assert_eq!(main["image"].as_str(), Some("registry.example.com/eg:v9"));
    Ok(())
}

#[test]
fn scheduling_and_disruption_defaults() -> Result<()> {
    let docs = documents(&template(&[])?)?;
    let pod = &find(&docs, "Deployment")?["spec"]["template"]["spec"];
    assert_eq!(
        pod["priorityClassName"].as_str(),
        Some("system-cluster-critical")
    );
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        anti["podAffinityTerm"]["topologyKey"].as_str(),
        Some("kubernetes.io/hostname"),
        "the replicas prefer other nodes by default"
    );
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["whenUnsatisfiable"].as_str(), Some("DoNotSchedule"));
    assert_eq!(
        spread["topologyKey"].as_str(),
        Some("kubernetes.io/hostname")
    );
    assert_eq!(
        spread["maxSkew"].as_i64(),
        Some(1),
        "a one-node cluster runs both"
    );
    assert_eq!(spread["nodeTaintsPolicy"].as_str(), Some("Honor"));
    let none = documents(&template(&["spreadOverNodes=false"])?)?;
    assert!(
        find(&none, "Deployment")?["spec"]["template"]["spec"]["topologySpreadConstraints"]
            .is_null()
    );
    let pdb = &find(&docs, "PodDisruptionBudget")?["spec"];
    assert_eq!(pdb["maxUnavailable"].as_i64(), Some(1));
    assert!(pdb["minAvailable"].is_null(), "{pdb:?}");
    assert_eq!(
        pdb["unhealthyPodEvictionPolicy"].as_str(),
        Some("AlwaysAllow")
    );
    // One replica: the budget still lets a drain evict it.
    let one = documents(&template(&[
        "replicaCount=1",
        "leaderElection.enabled=false",
    ])?)?;
    assert_eq!(
        find(&one, "PodDisruptionBudget")?["spec"]["maxUnavailable"].as_i64(),
        Some(1)
    );
    // Overridable: minAvailable wins when set; the spread can be replaced.
    let docs = documents(&template(&[
        "podDisruptionBudget.minAvailable=1",
        "podDisruptionBudget.unhealthyPodEvictionPolicy=IfHealthyBudget",
        "priorityClassName=",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ])?)?;
    let pdb = &find(&docs, "PodDisruptionBudget")?["spec"];
    assert_eq!(pdb["minAvailable"].as_i64(), Some(1));
    assert!(pdb["maxUnavailable"].is_null());
    assert_eq!(
        pdb["unhealthyPodEvictionPolicy"].as_str(),
        Some("IfHealthyBudget")
    );
    let pod = &find(&docs, "Deployment")?["spec"]["template"]["spec"];
    assert!(pod["priorityClassName"].is_null());
    assert!(pod["affinity"]["podAntiAffinity"].is_null());
    assert!(template(&["podDisruptionBudget.unhealthyPodEvictionPolicy=Never"]).is_err());
    Ok(())
}

/// The `helm test` Pod: a hook, under the restricted Pod Security profile,
/// the endpoints-guard image running `verify-endpoints` on the metrics
/// Service with a ServiceAccount that may read only that; its args parse.
#[test]
fn the_helm_test_hook_is_a_restricted_pod_of_the_same_image() -> Result<()> {
    let docs = documents(&template(&["image.tag=v9"])?)?;
    let pod = find(&docs, "Pod")?;
    assert_eq!(
        pod["metadata"]["annotations"]["helm.sh/hook"].as_str(),
        Some("test")
    );
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"].as_str(), Some("Never"));
    assert_eq!(
        spec["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    let test = &spec["containers"][0];
    let deployment = find(&docs, "Deployment")?;
    assert_eq!(
        test["image"],
        container(deployment, "endpoints-guard")?["image"],
        "the test runs the controller's own image"
    );
    let security = &test["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    let args = strings(&test["args"]);
    assert_eq!(args.first().map(String::as_str), Some("verify-endpoints"));
    assert!(args.contains(&"--service=endpoints-guard-metrics".to_string()));
    assert!(
        args.contains(&"--opt-in-copy".to_string()),
        "opt-in scope (the default): an opted-in copy of the metrics Service, endpoints-guard's own"
    );
    let mut argv = vec!["endpoints-guard".to_string()];
    argv.extend(args);
    <Config as clap::Parser>::try_parse_from(&argv)?;
    for (values, any_writer, opt_in_copy) in [
        (&["scope=all", "mode=enforce"][..], false, false),
        (&["scope=all", "mode=audit"][..], true, false),
        (&["scope=opt-in", "mode=audit"][..], true, false),
    ] {
        let docs = documents(&template(values)?)?;
        let args = strings(&find(&docs, "Pod")?["spec"]["containers"][0]["args"]);
        assert_eq!(
            (
                args.contains(&"--any-writer".to_string()),
                args.contains(&"--opt-in-copy".to_string())
            ),
            (any_writer, opt_in_copy),
            "{values:?}: {args:?}"
        );
    }
    // Its ServiceAccount, Role and RoleBinding are hooks too: none without tests.
    let hooks: Vec<&str> = docs
        .iter()
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].as_str() == Some("test"))
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(hooks, ["ServiceAccount", "Role", "RoleBinding", "Pod"]);
    let role = find_all(&docs, "Role")
        .into_iter()
        .find(|r| r["metadata"]["annotations"]["helm.sh/hook"].as_str() == Some("test"))
        .context("the test Role")?;
    assert_eq!(
        strings(&role["rules"][0]["resourceNames"]),
        [
            "endpoints-guard-metrics",
            "endpoints-guard-metrics-opt-in-check"
        ]
    );
    let off = documents(&template(&["tests.enabled=false"])?)?;
    assert!(find(&off, "Pod").is_err());
    Ok(())
}

#[test]
fn service_monitor_takes_scheme_tls_relabelings_and_job_label() -> Result<()> {
    let docs = documents(&template(&[
        "serviceMonitor.enabled=true",
        "serviceMonitor.scheme=https",
        "serviceMonitor.tlsConfig.serverName=eg.example",
        "serviceMonitor.relabelings[0].targetLabel=cluster",
        "serviceMonitor.relabelings[0].replacement=east",
        "serviceMonitor.metricRelabelings[0].action=drop",
        "serviceMonitor.metricRelabelings[0].regex=go_.*",
        "serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
        "serviceMonitor.jobLabel=app.kubernetes.io/name",
    ])?)?;
    let monitor = find(&docs, "ServiceMonitor")?;
    assert_eq!(
        monitor["spec"]["jobLabel"].as_str(),
        Some("app.kubernetes.io/name")
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"));
    assert_eq!(
        endpoint["tlsConfig"]["serverName"].as_str(),
        Some("eg.example")
    );
    assert_eq!(
        endpoint["relabelings"][0]["targetLabel"].as_str(),
        Some("cluster")
    );
    assert_eq!(
        strings(&endpoint["metricRelabelings"][0]["sourceLabels"]),
        ["__name__"]
    );
    assert!(template(&["serviceMonitor.enabled=true", "serviceMonitor.scheme=ftp"]).is_err());
    Ok(())
}

fn rule_list(sets: &[&str]) -> Result<Vec<Value>> {
    let mut all = vec!["prometheusRule.enabled=true"];
    all.extend(sets);
    let docs = documents(&template(&all)?)?;
    let rule = find(&docs, "PrometheusRule")?;
    Ok(rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .cloned()
        .unwrap_or_default())
}

/// Every alert has a section of the runbook the chart carries, a summary and
/// a description, and a `runbook_url` to its section only where the
/// operator says where the runbook is hosted; it takes the additional
/// labels, can be turned off alone, and selects no `job`.
#[test]
fn alerts_have_runbooks_labels_and_one_switch_each() -> Result<()> {
    let runbook = std::fs::read_to_string(root().join(CHART).join("runbook.md"))?;
    let rules = rule_list(&["prometheusRule.additionalLabels.team=net"])?;
    let names: Vec<String> = rules
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names.len(), 14, "{names:?}");
    for rule in &rules {
        let name = rule["alert"].as_str().context("alert")?;
        let annotations = &rule["annotations"];
        assert!(
            annotations["runbook_url"].is_null(),
            "{name}: a runbook_url nobody gave: {annotations:?}"
        );
        for key in ["summary", "description"] {
            assert!(
                annotations[key].as_str().is_some_and(|t| !t.is_empty()),
                "{name} without {key}"
            );
        }
        assert!(
            runbook.lines().any(|l| l == format!("## {name}")),
            "the chart's runbook.md has no section {name}"
        );
        assert_eq!(rule["labels"]["team"].as_str(), Some("net"), "{name}");
        let expr = rule["expr"].as_str().context("expr")?;
        assert!(!expr.contains("job="), "{name} depends on job: {expr}");
    }
    let hosted = "https://runbooks.example.com/endpoints-guard.md";
    let linked = rule_list(&[&format!("prometheusRule.runbookUrl={hosted}")])?;
    assert_eq!(linked.len(), names.len());
    for rule in &linked {
        let name = rule["alert"].as_str().context("alert")?;
        assert_eq!(
            rule["annotations"]["runbook_url"].as_str(),
            Some(format!("{hosted}#{}", name.to_lowercase()).as_str()),
            "{name}"
        );
    }
    assert!(
        template(&["prometheusRule.runbookUrl=runbooks.example.com"]).is_err(),
        "a runbookUrl that is no http(s) address"
    );
    for name in &names {
        let rest = rule_list(&[&format!("prometheusRule.disabled.{name}=true")])?;
        let left: Vec<&str> = rest.iter().filter_map(|r| r["alert"].as_str()).collect();
        assert_eq!(left.len(), names.len() - 1, "{name} off: {left:?}");
        assert!(!left.contains(&name.as_str()));
    }
    // No audit, no alert on its failures.
    let unaudited = rule_list(&["compactionAuditInterval=0s"])?;
    assert!(
        unaudited
            .iter()
            .all(|r| r["alert"].as_str() != Some("EndpointsGuardCompactionAuditFailing")),
        "an alert on an audit that is off"
    );
    assert_eq!(unaudited.len(), names.len() - 1);
    assert!(
        template(&[
            "prometheusRule.enabled=true",
            "prometheusRule.disabled.NoSuchAlert=true"
        ])
        .is_err(),
        "a misspelt alert name is accepted"
    );
    Ok(())
}

/// Durations in the values take Go's syntax, as the binary's flags do.
#[test]
fn durations_in_values_are_go_durations() -> Result<()> {
    let docs = documents(&template(&[
        "resyncInterval=1m30s",
        "startupTimeout=500ms",
        "ghostScanPeriod=1h",
        "leaderElection.leaseDuration=1m",
        "leaderElection.renewGrace=10s",
        "prometheusRule.enabled=true",
        "prometheusRule.notReadyFor=2m30s",
        "prometheusRule.resyncStaleAfter=1h30m",
        "serviceMonitor.enabled=true",
        "serviceMonitor.interval=1m30s",
    ])?)?;
    let args = strings(&container(find(&docs, "Deployment")?, "endpoints-guard")?["args"]);
    let mut argv = vec!["endpoints-guard".to_string()];
    argv.extend(args);
    let cfg = <Config as clap::Parser>::try_parse_from(&argv)?;
    assert_eq!(cfg.resync_interval, Duration::from_secs(90));
    assert_eq!(cfg.startup_timeout, Duration::from_millis(500));
    assert_eq!(cfg.leader_election_lease_duration, Duration::from_secs(60));
    cfg.validate().map_err(anyhow::Error::msg)?;
    // The stale-resync alert compares seconds: 1h30m is 5400.
    let rule = find(&docs, "PrometheusRule")?;
    let stale = rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|r| r["alert"] == "EndpointsGuardResyncStale")
        .context("EndpointsGuardResyncStale")?;
    let expr = stale["expr"].as_str().context("expr")?;
    assert!(expr.ends_with("> 5400"), "{expr}");
    for bad in [
        "resyncInterval=5 minutes",
        "resyncInterval=1d",
        "startupTimeout=-1s",
        "prometheusRule.resyncStaleAfter=1200",
    ] {
        assert!(template(&[bad]).is_err(), "{bad} accepted");
    }
    // resyncInterval 0 (any unit) turns the resync off, and its alert.
    for off in ["resyncInterval=0s", "resyncInterval=0m"] {
        let rules = rule_list(&[off])?;
        assert!(
            !rules
                .iter()
                .any(|r| r["alert"] == "EndpointsGuardResyncStale"),
            "{off}"
        );
    }
    Ok(())
}

/// Secure by default: /metrics on the HTTPS port, the probes plain, the
/// ServiceMonitor with https, the ServiceAccount token and (self-signed)
/// no verification; the delegation binding and the metrics-reader role.
#[test]
fn metrics_are_served_over_https_by_default() -> Result<()> {
    let docs = documents(&template(&["serviceMonitor.enabled=true"])?)?;
    let deployment = find(&docs, "Deployment")?;
    let main = container(deployment, "endpoints-guard")?;
    let args = strings(&main["args"]);
    assert!(
        args.contains(&"--secure-metrics-addr=0.0.0.0:8443".to_string()),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--tls-cert-file")),
        "self-signed: {args:?}"
    );
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(
            main[probe]["httpGet"]["port"].as_str(),
            Some("metrics"),
            "{probe}"
        );
        assert!(
            main[probe]["httpGet"]["scheme"].is_null(),
            "{probe} stays plain HTTP"
        );
    }
    let service = find(&docs, "Service")?;
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_str(),
        Some("https")
    );
    let endpoint = &find(&docs, "ServiceMonitor")?["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"));
    assert_eq!(
        endpoint["bearerTokenFile"].as_str(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    assert_eq!(
        endpoint["tlsConfig"]["insecureSkipVerify"].as_bool(),
        Some(true)
    );
    let reader = find_all(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"].as_str() == Some("endpoints-guard-metrics-reader"))
        .context("no metrics-reader ClusterRole")?;
    assert_eq!(
        strings(&reader["rules"][0]["nonResourceURLs"]),
        ["/metrics"]
    );
    assert_eq!(strings(&reader["rules"][0]["verbs"]), ["get"]);
    let delegation = find_all(&docs, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"].as_str() == Some("system:auth-delegator"))
        .context("no auth-delegator binding")?;
    assert_eq!(
        delegation["subjects"][0]["name"].as_str(),
        Some("endpoints-guard")
    );

    // A Secret's certificate: mounted, named by flags, verified by the
    // ServiceMonitor's own tlsConfig.
    let docs = documents(&template(&[
        "serviceMonitor.enabled=true",
        "metrics.tls.secretName=eg-tls",
        "serviceMonitor.tlsConfig.serverName=endpoints-guard-metrics.endpoints-guard.svc",
    ])?)?;
    let deployment = find(&docs, "Deployment")?;
    let main = container(deployment, "endpoints-guard")?;
    let args = strings(&main["args"]);
    assert!(args.contains(&"--tls-cert-file=/etc/endpoints-guard/tls/tls.crt".to_string()));
    assert!(args.contains(&"--tls-private-key-file=/etc/endpoints-guard/tls/tls.key".to_string()));
    assert_eq!(
        main["volumeMounts"][0]["mountPath"].as_str(),
        Some("/etc/endpoints-guard/tls")
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"].as_str(),
        Some("eg-tls")
    );
    let endpoint = &find(&docs, "ServiceMonitor")?["spec"]["endpoints"][0];
    assert!(endpoint["tlsConfig"]["insecureSkipVerify"].is_null());
    // With the chaos sidecar too, both volumes.
    let docs = documents(&template(&[
        "metrics.tls.secretName=eg-tls",
        "chaos.enabled=true",
        "chaos.image.repository=example.invalid/watch-chaos",
    ])?)?;
    let volumes = &find(&docs, "Deployment")?["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes.as_sequence().map(Vec::len), Some(2), "{volumes:?}");

    // Plain HTTP for local development: no HTTPS port, no token, no roles.
    let docs = documents(&template(&[
        "serviceMonitor.enabled=true",
        "metrics.secure=false",
    ])?)?;
    let args = strings(&container(find(&docs, "Deployment")?, "endpoints-guard")?["args"]);
    assert!(
        !args.iter().any(|a| a.starts_with("--secure-metrics-addr")),
        "{args:?}"
    );
    assert_eq!(
        find(&docs, "Service")?["spec"]["ports"][0]["targetPort"].as_str(),
        Some("metrics")
    );
    let endpoint = &find(&docs, "ServiceMonitor")?["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("http"));
    assert!(endpoint["bearerTokenFile"].is_null());
    assert!(
        !find_all(&docs, "ClusterRole")
            .iter()
            .any(|r| r["metadata"]["name"].as_str() == Some("endpoints-guard-metrics-reader"))
    );
    Ok(())
}

#[test]
fn the_network_policy_is_opt_in_and_narrow() -> Result<()> {
    let docs = documents(&template(&[])?)?;
    assert!(find(&docs, "NetworkPolicy").is_err(), "on by default");
    let docs = documents(&template(&["networkPolicy.enabled=true"])?)?;
    let policy = &find(&docs, "NetworkPolicy")?["spec"];
    assert_eq!(strings(&policy["policyTypes"]), ["Ingress", "Egress"]);
    let ingress = &policy["ingress"];
    assert_eq!(ingress.as_sequence().map(Vec::len), Some(1));
    assert_eq!(ingress[0]["ports"][0]["port"].as_str(), Some("https"));
    assert_eq!(
        ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            .as_str(),
        Some("monitoring")
    );
    let egress = &policy["egress"];
    assert_eq!(egress.as_sequence().map(Vec::len), Some(1));
    let ports: Vec<i64> = egress[0]["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert_eq!(ports, [443, 6443]);
    let plain = documents(&template(&[
        "networkPolicy.enabled=true",
        "metrics.secure=false",
    ])?)?;
    assert_eq!(
        find(&plain, "NetworkPolicy")?["spec"]["ingress"][0]["ports"][0]["port"].as_str(),
        Some("metrics")
    );
    Ok(())
}

/// API Priority and Fairness: the chart's ServiceAccount is served as
/// kube-controller-manager is, its Lease traffic (PATCH included, as
/// kube-lease-manager renews) in `leader-election` and the rest in
/// `workload-high`, both before the built-in `service-accounts` schema;
/// one value turns them off, and no Lease schema without leader election.
#[test]
fn flow_schemas_serve_the_controller_as_kube_controller_manager() -> Result<()> {
    let docs = documents(&template(&[])?)?;
    let schemas = find_all(&docs, "FlowSchema");
    assert_eq!(schemas.len(), 2);
    let by_level = |level: &str| {
        schemas
            .iter()
            .find(|s| s["spec"]["priorityLevelConfiguration"]["name"].as_str() == Some(level))
            .with_context(|| format!("no FlowSchema for {level}"))
    };
    let lease = by_level("leader-election")?;
    let workload = by_level("workload-high")?;
    for schema in [lease, workload] {
        let precedence = schema["spec"]["matchingPrecedence"].as_i64().unwrap_or(0);
        assert!((1..9000).contains(&precedence), "{precedence}");
        let subject = &schema["spec"]["rules"][0]["subjects"][0];
        assert_eq!(subject["kind"].as_str(), Some("ServiceAccount"));
        assert_eq!(
            subject["serviceAccount"]["name"].as_str(),
            Some("endpoints-guard")
        );
        assert_eq!(
            subject["serviceAccount"]["namespace"].as_str(),
            Some("endpoints-guard")
        );
    }
    assert!(
        lease["spec"]["matchingPrecedence"].as_i64()
            < workload["spec"]["matchingPrecedence"].as_i64(),
        "the Lease schema first"
    );
    let rule = &lease["spec"]["rules"][0]["resourceRules"][0];
    assert_eq!(strings(&rule["resources"]), ["leases"]);
    assert!(strings(&rule["verbs"]).contains(&"patch".to_string()));
    assert_eq!(strings(&rule["namespaces"]), ["endpoints-guard"]);
    assert!(
        find_all(
            &documents(&template(&["flowSchemas.enabled=false"])?)?,
            "FlowSchema"
        )
        .is_empty()
    );
    let single = documents(&template(&[
        "replicaCount=1",
        "leaderElection.enabled=false",
    ])?)?;
    assert_eq!(find_all(&single, "FlowSchema").len(), 1);
    Ok(())
}
