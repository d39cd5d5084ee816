//! A generated workload that mixes every feature the endpoints controller handles,
//! for the differential parity test and the benchmarks. Deterministic for a given
//! size: the same Services, pods, statuses and IPs every run.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// How big a workload to make.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Ordinary Services (each kind in turn), spread over the namespaces.
    pub services: usize,
    /// Pods per ordinary Service.
    pub pods_per_service: usize,
    /// Pods behind the one Service that goes over 1000 addresses (0: no such Service).
    pub big_service_pods: usize,
    pub namespaces: usize,
}

impl Size {
    /// What `make parity` runs: 200+ Services, 2000+ pods, one Service whose
    /// ready addresses alone exceed 1000 (upstream drops every not-ready one).
    pub const FULL: Size = Size {
        services: 210,
        pods_per_service: 5,
        big_service_pods: 1200,
        namespaces: 4,
    };
    /// The run inside `make test`: its big Service has fewer than 1000 ready
    /// addresses, so the not-ready ones share the room left.
    pub const SMALL: Size = Size {
        services: 36,
        pods_per_service: 4,
        big_service_pods: 1010,
        namespaces: 2,
    };
}

/// The Service kinds, taken in turn.
const KINDS: usize = 10;

pub struct Workload {
    pub namespaces: Vec<String>,
    pub services: Vec<Service>,
    /// Each pod with the status to write after it is created.
    pub pods: Vec<(Pod, Value)>,
    /// Endpoints a user made for selector-less Services: nobody may touch them.
    pub user_endpoints: Vec<Endpoints>,
}

pub(crate) fn meta(ns: &str, name: &str, labels: BTreeMap<String, String>) -> Value {
    json!({"namespace": ns, "name": name, "labels": labels})
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Pod states, taken in turn by index; most pods are ready.
pub(crate) fn status_for(index: usize, dual_stack: bool) -> Value {
    let v4 = format!(
        "10.{}.{}.{}",
        64 + (index >> 16) % 64,
        (index >> 8) & 255,
        index & 255
    );
    let v6 = format!("fd00:10:244::{:x}", index + 1);
    let ips = if dual_stack {
        // Odd pods list IPv6 first, so the family choice is exercised both ways.
        if index % 2 == 1 {
            vec![v6, v4]
        } else {
            vec![v4, v6]
        }
    } else {
        vec![v4]
    };
    let state = index % 16;
    let (phase, ready, with_ip) = match state {
        3 | 11 => ("Running", false, true), // not ready
        5 => ("Pending", false, true),      // pending with an IP
        7 => ("Pending", false, false),     // no IP yet
        9 => ("Succeeded", false, true),
        13 => ("Failed", false, true),
        _ => ("Running", true, true),
    };
    let transition = format!("2026-01-01T00:{:02}:{:02}Z", (index / 60) % 60, index % 60);
    let mut status = json!({
        "phase": phase,
        "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "lastTransitionTime": transition}],
    });
    if with_ip {
        status["podIP"] = json!(ips[0]);
        status["podIPs"] = json!(ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>());
    }
    status
}

pub(crate) struct PodShape<'a> {
    pub ns: &'a str,
    pub name: String,
    pub app: String,
    pub ports: Value,
    pub sidecar_ports: Option<Value>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
}

pub(crate) fn pod(shape: PodShape<'_>, index: usize) -> Pod {
    let mut spec = json!({
        "nodeName": format!("node-{}", index % 3),
        "containers": [{"name": "app", "image": "registry.invalid/app:1", "ports": shape.ports}],
        "terminationGracePeriodSeconds": 30,
    });
    if let Some(ports) = shape.sidecar_ports {
        spec["initContainers"] = json!([{"name": "proxy", "image": "registry.invalid/proxy:1", "restartPolicy": "Always", "ports": ports}]);
    }
    if let Some(h) = shape.hostname {
        spec["hostname"] = json!(h);
    }
    if let Some(s) = shape.subdomain {
        spec["subdomain"] = json!(s);
    }
    let obj = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta(shape.ns, &shape.name, labels(&[("app", &shape.app), ("tier", if index.is_multiple_of(2) {"a"} else {"b"})])),
        "spec": spec,
    });
    serde_json::from_value(obj).unwrap_or_default()
}

impl Workload {
    pub fn generate(size: Size, prefix: &str) -> Workload {
        let namespaces: Vec<String> = (0..size.namespaces.max(1))
            .map(|i| format!("{prefix}-{i}"))
            .collect();
        let mut services = Vec::new();
        let mut pods = Vec::new();
        let mut user_endpoints = Vec::new();
        let mut pod_index = 0usize;
        for s in 0..size.services {
            let ns = &namespaces[s % namespaces.len()];
            let name = format!("svc-{s}");
            let app = format!("app-{s}");
            let kind = s % KINDS;
            let (spec, dual_stack) = service_spec(kind, &app);
            let svc = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": meta(ns, &name, labels(&[("team", "parity"), ("kind", &kind.to_string())])),
                "spec": spec});
            services.push(serde_json::from_value(svc).unwrap_or_default());
            if kind == 8 {
                // Selector-less: a user writes the Endpoints by hand.
                let ep = json!({"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": meta(ns, &name, labels(&[("owner", "user")])),
                    "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 80, "protocol": "TCP"}]}]});
                user_endpoints.push(serde_json::from_value(ep).unwrap_or_default());
            }
            for p in 0..size.pods_per_service {
                let shape = pod_shape(kind, ns, &name, &app, p);
                pods.push((pod(shape, pod_index), status_for(pod_index, dual_stack)));
                pod_index += 1;
            }
        }
        if size.big_service_pods > 0 {
            let ns = &namespaces[0];
            let svc = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": meta(ns, "big", labels(&[("team", "parity")])),
                "spec": {"selector": {"app": "big"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
            services.push(serde_json::from_value(svc).unwrap_or_default());
            for p in 0..size.big_service_pods {
                // Two container port numbers for "http": two subsets to share the 1000.
                let port = if p.is_multiple_of(3) { 8080 } else { 9090 };
                let shape = PodShape {
                    ns,
                    name: format!("big-{p}"),
                    app: "big".into(),
                    ports: json!([{"name": "http", "containerPort": port}]),
                    sidecar_ports: None,
                    hostname: None,
                    subdomain: None,
                };
                // Mostly ready, so the ready addresses alone exceed 1000.
                let status = if p.is_multiple_of(10) {
                    status_for(3, false)
                } else {
                    status_for(0, false)
                };
                let mut status = status;
                let ip = format!("10.200.{}.{}", p / 250, p % 250 + 1);
                status["podIP"] = json!(ip);
                status["podIPs"] = json!([{"ip": ip}]);
                pods.push((pod(shape, pod_index), status));
                pod_index += 1;
            }
        }
        Workload {
            namespaces,
            services,
            pods,
            user_endpoints,
        }
    }

    /// Creates everything: namespaces, Services, user Endpoints, pods, then pod
    /// statuses; finally deletes (gracefully) every 8th pod, which stays
    /// terminating because no kubelet runs.
    pub async fn create(&self, client: &Client) -> Result<()> {
        create_namespaces(client, &self.namespaces).await?;
        let parallel = 16;
        stream::iter(self.services.iter().map(Ok))
            .try_for_each_concurrent(parallel, |svc| async move {
                let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
                Api::<Service>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), svc)
                    .await
                    .with_context(|| format!("creating service {ns}/{:?}", svc.metadata.name))?;
                anyhow::Ok(())
            })
            .await?;
        for ep in &self.user_endpoints {
            let ns = ep.metadata.namespace.as_deref().unwrap_or("default");
            Api::<Endpoints>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), ep)
                .await
                .context("creating user endpoints")?;
        }
        stream::iter(self.pods.iter().map(Ok))
            .try_for_each_concurrent(parallel, |(pod, status)| async move {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let name = pod.metadata.name.clone().unwrap_or_default();
                let api = Api::<Pod>::namespaced(client.clone(), ns);
                api.create(&PostParams::default(), pod)
                    .await
                    .with_context(|| format!("creating pod {ns}/{name}"))?;
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
                .with_context(|| format!("writing status of pod {ns}/{name}"))?;
                anyhow::Ok(())
            })
            .await?;
        // Every 8th pod of the ordinary Services; the big Service's pods stay, so
        // it really goes over 1000 addresses.
        let terminating: Vec<&Pod> = self
            .pods
            .iter()
            .map(|(p, _)| p)
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_none_or(|app| app != "big")
            })
            .step_by(8)
            .collect();
        stream::iter(terminating.into_iter().map(Ok))
            .try_for_each_concurrent(parallel, |pod| async move {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let name = pod.metadata.name.clone().unwrap_or_default();
                let params = DeleteParams {
                    grace_period_seconds: Some(3600),
                    ..DeleteParams::default()
                };
                Api::<Pod>::namespaced(client.clone(), ns)
                    .delete(&name, &params)
                    .await
                    .with_context(|| format!("deleting pod {ns}/{name} gracefully"))?;
                anyhow::Ok(())
            })
            .await?;
        Ok(())
    }

    /// Changes the workload after it was reconciled, as a cluster changes
    /// under a running controller: pods deleted, readiness flipped (the big
    /// Service's too, so which 1000 addresses it keeps changes), pods added,
    /// a Service's target port, ports, selector, labels and
    /// publishNotReadyAddresses changed, a Service deleted and one created.
    /// The number of selector Services stays the same. Returns how many
    /// objects changed.
    pub async fn churn(&self, client: &Client) -> Result<usize> {
        let mut changed = 0;
        let ordinary = self.pods.len() - self.big_service_pods();
        for (index, (pod, status)) in self.pods.iter().enumerate() {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let api = Api::<Pod>::namespaced(client.clone(), ns);
            let big = index >= ordinary;
            if !big && index % 17 == 2 {
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                api.delete(name, &now)
                    .await
                    .with_context(|| format!("deleting pod {ns}/{name}"))?;
                changed += 1;
            } else if ((!big && index % 10 == 4) || (big && index % 50 == 1))
                && status["phase"] == "Running"
            {
                let ready = status["conditions"][0]["status"] == "True";
                let flipped = json!({"status": {"conditions": [{"type": "Ready",
                    "status": if ready {"False"} else {"True"},
                    "lastTransitionTime": "2026-02-01T00:00:00Z"}]}});
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(flipped))
                    .await
                    .with_context(|| format!("flipping readiness of pod {ns}/{name}"))?;
                changed += 1;
            }
        }
        // A copy of the first pod of every 7th ordinary Service, with a
        // status (and IPs) of its own.
        let mut added = 0;
        for (index, (pod, status)) in self.pods[..ordinary].iter().enumerate() {
            let Some(name) = pod.metadata.name.as_deref() else {
                continue;
            };
            if !name.ends_with("-pod-0") || index % 7 != 0 {
                continue;
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let mut copy = pod.clone();
            copy.metadata.name = Some(format!("{name}-churn"));
            if let Some(spec) = copy.spec.as_mut()
                && let Some(hostname) = spec.hostname.as_mut()
            {
                hostname.push_str("-churn");
            }
            let dual_stack = status["podIPs"]
                .as_array()
                .is_some_and(|ips| ips.len() == 2);
            let new_status = status_for(self.pods.len() + added, dual_stack);
            let api = Api::<Pod>::namespaced(client.clone(), ns);
            api.create(&PostParams::default(), &copy)
                .await
                .with_context(|| format!("creating pod {ns}/{name}-churn"))?;
            api.patch_status(
                &format!("{name}-churn"),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": new_status})),
            )
            .await
            .with_context(|| format!("writing the status of pod {ns}/{name}-churn"))?;
            added += 1;
        }
        changed += added;
        // The first Service of some kinds, changed (kinds: service_spec).
        let first_of_kind = |kind: usize| {
            self.services
                .iter()
                .find(|s| {
                    s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kind"))
                        .is_some_and(|k| *k == kind.to_string())
                })
                .and_then(|s| Some((s.metadata.namespace.clone()?, s.metadata.name.clone()?)))
        };
        let other_app = self
            .services
            .iter()
            .filter_map(|s| s.spec.as_ref()?.selector.as_ref()?.get("app").cloned())
            .nth(1)
            .unwrap_or_default();
        let patches = [
            (
                0,
                json!({"spec": {"ports": [{"port": 80, "targetPort": 8081}]}}),
            ),
            (
                1,
                json!({"spec": {"ports": [
                    {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "http"},
                    {"name": "metrics", "port": 9100, "targetPort": 9100}]}}),
            ),
            (2, json!({"spec": {"publishNotReadyAddresses": false}})),
            (3, json!({"metadata": {"labels": {"churn": "relabelled"}}})),
            (6, json!({"spec": {"selector": {"app": other_app}}})),
        ];
        for (kind, patch) in patches {
            let Some((ns, name)) = first_of_kind(kind) else {
                continue;
            };
            Api::<Service>::namespaced(client.clone(), &ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .with_context(|| format!("changing service {ns}/{name}"))?;
            changed += 1;
        }
        // One selector Service goes, another comes selecting its pods.
        if let Some((ns, name)) = first_of_kind(5) {
            let services = Api::<Service>::namespaced(client.clone(), &ns);
            let gone = services
                .delete(&name, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting service {ns}/{name}"))?;
            let spec = gone
                .left()
                .and_then(|s| s.spec)
                .context("the deleted Service's spec")?;
            let replacement = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": meta(&ns, &format!("{name}-churn"), labels(&[("team", "parity")])),
                "spec": {"selector": spec.selector, "ports": spec.ports,
                         "ipFamilyPolicy": spec.ip_family_policy, "ipFamilies": spec.ip_families}});
            services
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(replacement)?,
                )
                .await
                .with_context(|| format!("creating service {ns}/{name}-churn"))?;
            changed += 2;
        }
        Ok(changed)
    }

    /// Pods of the Service over 1000 addresses: the last ones generated.
    fn big_service_pods(&self) -> usize {
        self.pods
            .iter()
            .filter(|(p, _)| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_some_and(|app| app == "big")
            })
            .count()
    }

    /// Services whose Endpoints a controller writes (selector present, not ExternalName).
    pub fn selector_services(&self) -> usize {
        self.services
            .iter()
            .filter(|s| {
                let spec = s.spec.as_ref();
                spec.and_then(|sp| sp.selector.as_ref()).is_some()
                    && spec.and_then(|sp| sp.type_.as_deref()) != Some("ExternalName")
            })
            .count()
    }
}

/// The Service spec of each kind, and whether its pods are dual-stack.
fn service_spec(kind: usize, app: &str) -> (Value, bool) {
    let sel = json!({"app": app});
    match kind {
        // Numeric targetPort.
        0 => (
            json!({"selector": sel, "ports": [{"port": 80, "targetPort": 8080}]}),
            false,
        ),
        // Named and multiple ports, two protocols, appProtocol.
        1 => (
            json!({"selector": sel, "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "http"},
                {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"},
                {"name": "metrics", "port": 9100, "targetPort": 9100}]}),
            false,
        ),
        // publishNotReadyAddresses.
        2 => (
            json!({"selector": sel, "publishNotReadyAddresses": true, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
            false,
        ),
        // Headless with hostnames.
        3 => (
            json!({"selector": sel, "clusterIP": "None", "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
            false,
        ),
        // Headless without ports.
        4 => (json!({"selector": sel, "clusterIP": "None"}), false),
        // Dual-stack Service, IPv6 first: the Endpoints hold IPv6 addresses.
        5 => (
            json!({"selector": sel, "ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"],
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
            true,
        ),
        // IPv4 Service over dual-stack pods.
        6 => (
            json!({"selector": sel, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
            true,
        ),
        // Named port found only on a sidecar init container.
        7 => (
            json!({"selector": sel, "ports": [{"name": "proxy", "port": 15001, "targetPort": "proxy"},
                {"name": "http", "port": 80, "targetPort": "http"}]}),
            false,
        ),
        // Selector-less (Endpoints written by a user).
        8 => (json!({"ports": [{"port": 80}]}), false),
        // ExternalName.
        _ => (
            json!({"type": "ExternalName", "externalName": "example.invalid"}),
            false,
        ),
    }
}

fn pod_shape<'a>(kind: usize, ns: &'a str, svc: &str, app: &str, p: usize) -> PodShape<'a> {
    // Named ports resolve to different numbers on different pods, so some Services
    // get more than one subset.
    let http = if p.is_multiple_of(2) { 8080 } else { 8081 };
    let ports = json!([
        {"name": "http", "containerPort": http},
        {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
    ]);
    let (sidecar, hostname, subdomain) = match kind {
        7 => (
            Some(json!([{"name": "proxy", "containerPort": 15001}])),
            None,
            None,
        ),
        3 => (
            None,
            Some(format!("host-{p}")),
            // Every other pod names the Service as its subdomain: only those get hostnames.
            if p.is_multiple_of(2) {
                Some(svc.to_string())
            } else {
                Some("elsewhere".to_string())
            },
        ),
        _ => (None, None, None),
    };
    PodShape {
        ns,
        name: format!("{svc}-pod-{p}"),
        app: app.to_string(),
        ports,
        sidecar_ports: sidecar,
        hostname,
        subdomain,
    }
}

/// Creates each namespace named.
pub async fn create_namespaces(client: &Client, names: &[String]) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in names {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        api.create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
    }
    Ok(())
}

/// Reads every Endpoints object the workload's namespaces hold, keyed "ns/name".
pub async fn snapshot_endpoints(
    client: &Client,
    namespaces: &[String],
) -> Result<BTreeMap<String, Endpoints>> {
    let mut out = BTreeMap::new();
    for ns in namespaces {
        let list = Api::<Endpoints>::namespaced(client.clone(), ns)
            .list(&Default::default())
            .await
            .with_context(|| format!("listing endpoints in {ns}"))?;
        for ep in list.items {
            let name = ep.metadata.name.clone().unwrap_or_default();
            out.insert(format!("{ns}/{name}"), ep);
        }
    }
    Ok(out)
}

/// Concurrency helper for callers that delete many objects.
pub async fn delete_all_endpoints(client: &Client, keys: Vec<String>) -> Result<()> {
    stream::iter(keys)
        .map(|key| async move {
            let (ns, name) = key.split_once('/').unwrap_or(("default", key.as_str()));
            match Api::<Endpoints>::namespaced(client.clone(), ns)
                .delete(name, &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(anyhow::Error::new(e).context(format!("deleting endpoints {key}"))),
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Writes a parity report as pretty JSON to `target/parity/<file_name>` under
/// the workspace root, with the Kubernetes version it ran against
/// (`kubernetes`, `KUBE_VERSION`'s), and returns its path.
pub fn write_parity_report(file_name: &str, report: &Value) -> Result<std::path::PathBuf> {
    let root = eg_harness::binaries::workspace_root()?;
    let mut report = report.clone();
    if let Some(fields) = report.as_object_mut() {
        fields.insert(
            "kubernetes".to_string(),
            Value::String(eg_harness::binaries::kubernetes_version(&root)?),
        );
    }
    let dir = root.join("target/parity");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file_name);
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
