//! The generated workload of the EndpointSlice parity test: the Endpoints mix
//! of [`crate::workload`] plus Nodes (zones, allocatable CPU, readiness, a
//! control-plane Node) and Services for each slice feature: every
//! trafficDistribution value, the topology-mode annotation (hints given, too
//! few endpoints, an endpoint without zone, the older annotation name), a
//! Service above 100 endpoints with two port sets, dual-stack Services, pods on
//! Nodes that do not exist or on none, and a Service with no pods.
//! Deterministic for a given size.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::workload::{PodShape, Size, Workload, labels, meta, pod, status_for};

/// How big a workload to make.
#[derive(Clone, Copy, Debug)]
pub struct SliceSize {
    /// The Endpoints mix underneath (its big Service goes over 1,000 endpoints).
    pub base: Size,
    /// Pods behind each hint Service.
    pub hint_pods: usize,
    /// Pods behind the Service above 100 endpoints.
    pub medium_pods: usize,
}

impl SliceSize {
    /// What `make test` runs.
    pub const SMALL: SliceSize = SliceSize {
        base: Size {
            services: 20,
            pods_per_service: 4,
            big_service_pods: 1010,
            namespaces: 2,
        },
        hint_pods: 16,
        medium_pods: 230,
    };
    /// `EG_PARITY_SCALE=full`.
    pub const FULL: SliceSize = SliceSize {
        base: Size::FULL,
        hint_pods: 60,
        medium_pods: 640,
    };
}

/// Nodes: (name, zone, allocatable CPU, ready, control-plane role). The shares
/// of the ready, non-control-plane ones are a 4, b 2, c 3.5 CPUs.
const NODES: [(&str, Option<&str>, &str, bool, bool); 6] = [
    ("node-0", Some("zone-a"), "4", true, false),
    ("node-1", Some("zone-b"), "2", true, false),
    ("node-2", Some("zone-c"), "2000m", true, false),
    ("node-x", Some("zone-c"), "1500m", true, false),
    // Left out of the zone shares: a control-plane Node, and a Node that is
    // not ready (its missing zone would otherwise spoil them).
    ("node-cp", Some("zone-a"), "8", true, true),
    ("node-down", None, "0", false, false),
];

/// A Node no object exists for.
const MISSING_NODE: &str = "node-gone";

/// One Service of the slice mix.
struct Extra {
    name: &'static str,
    spec: Value,
    annotations: &'static [(&'static str, &'static str)],
    pods: PodCount,
    /// Nodes taken in turn ("" for no nodeName).
    nodes: &'static [&'static str],
    dual_stack: bool,
    /// Every third pod serves "http" on 9090 instead of 8080.
    split_port: bool,
    /// Pods name the Service as subdomain and get hostnames.
    hostnames: bool,
    /// Every pod Running and ready (instead of the mix of states).
    all_ready: bool,
}

/// How many pods a Service of the mix gets.
enum PodCount {
    /// This many times [`SliceSize::hint_pods`].
    HintPods(usize),
    /// [`SliceSize::medium_pods`].
    Medium,
    Fixed(usize),
}

const READY_NODES: &[&str] = &["node-0", "node-1", "node-2", "node-x"];

fn http_spec(app: &str, extra: Value) -> Value {
    let mut spec = json!({"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    spec
}

fn extras() -> Vec<Extra> {
    let plain = |name: &'static str| Extra {
        name,
        spec: http_spec(name, json!({})),
        annotations: &[],
        pods: PodCount::HintPods(1),
        nodes: READY_NODES,
        dual_stack: false,
        split_port: false,
        hostnames: false,
        all_ready: false,
    };
    vec![
        Extra {
            spec: http_spec("close", json!({"trafficDistribution": "PreferClose"})),
            ..plain("close")
        },
        Extra {
            spec: http_spec(
                "same-zone",
                json!({"trafficDistribution": "PreferSameZone"}),
            ),
            ..plain("same-zone")
        },
        Extra {
            spec: http_spec(
                "same-node",
                json!({"trafficDistribution": "PreferSameNode"}),
            ),
            nodes: &["node-0", "node-1", "node-cp", "node-x", "node-down"],
            ..plain("same-node")
        },
        Extra {
            annotations: &[("service.kubernetes.io/topology-mode", "Auto")],
            pods: PodCount::HintPods(3),
            // Half the endpoints in zone-a, whose CPU share is 4/9.5.
            nodes: &["node-0", "node-0", "node-0", "node-1", "node-2", "node-x"],
            ..plain("auto")
        },
        Extra {
            annotations: &[("service.kubernetes.io/topology-mode", "Auto")],
            // Two ready endpoints for three zones.
            pods: PodCount::Fixed(2),
            all_ready: true,
            ..plain("auto-few")
        },
        Extra {
            annotations: &[("service.kubernetes.io/topology-mode", "Auto")],
            nodes: &["node-0", "node-1", "node-2", "node-down"],
            ..plain("auto-nozone")
        },
        Extra {
            spec: http_spec(
                "auto-legacy",
                json!({"trafficDistribution": "PreferSameNode"}),
            ),
            annotations: &[("service.kubernetes.io/topology-aware-hints", "auto")],
            pods: PodCount::HintPods(2),
            nodes: &["node-1", "node-2", "node-x", "node-0"],
            ..plain("auto-legacy")
        },
        Extra {
            spec: http_spec("medium", json!({"trafficDistribution": "PreferClose"})),
            pods: PodCount::Medium,
            split_port: true,
            ..plain("medium")
        },
        Extra {
            spec: http_spec(
                "dual",
                json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"], "publishNotReadyAddresses": true}),
            ),
            nodes: &["node-0", "node-1", MISSING_NODE, ""],
            dual_stack: true,
            ..plain("dual")
        },
        Extra {
            nodes: &["node-0", MISSING_NODE, "", "node-1"],
            ..plain("missing-node")
        },
        Extra {
            spec: json!({"selector": {"app": "nobody"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
            pods: PodCount::Fixed(0),
            ..plain("empty")
        },
        Extra {
            spec: json!({"selector": {"app": "headless-dual"}, "clusterIP": "None",
                "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
            dual_stack: true,
            hostnames: true,
            ..plain("headless-dual")
        },
    ]
}

/// The workload: the Endpoints mix with the slice Services added, and the Nodes.
pub struct SliceWorkload {
    pub base: Workload,
    /// Each Node with the status to write after it is created.
    pub nodes: Vec<(Node, Value)>,
}

impl SliceWorkload {
    pub fn generate(size: SliceSize, prefix: &str) -> SliceWorkload {
        let mut base = Workload::generate(size.base, prefix);
        let ns = base.namespaces[0].clone();
        let mut index = base.pods.len();
        for extra in extras() {
            let mut service_meta = meta(&ns, extra.name, labels(&[("team", "slices")]));
            service_meta["annotations"] = extra
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
                .into();
            let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": service_meta, "spec": extra.spec});
            base.services
                .push(serde_json::from_value(svc).unwrap_or_default());
            let count = match extra.pods {
                PodCount::HintPods(n) => n * size.hint_pods,
                PodCount::Medium => size.medium_pods,
                PodCount::Fixed(n) => n,
            };
            for p in 0..count {
                let port = if extra.split_port && p % 3 == 2 {
                    9090
                } else {
                    8080
                };
                let shape = PodShape {
                    ns: &ns,
                    name: format!("{}-pod-{p}", extra.name),
                    app: extra.name.to_string(),
                    ports: json!([{"name": "http", "containerPort": port}]),
                    sidecar_ports: None,
                    hostname: extra.hostnames.then(|| format!("host-{p}")),
                    subdomain: extra.hostnames.then(|| extra.name.to_string()),
                };
                let mut made = pod(shape, index);
                if let Some(spec) = made.spec.as_mut() {
                    let node = extra.nodes[p % extra.nodes.len()];
                    spec.node_name = (!node.is_empty()).then(|| node.to_string());
                }
                let mut status = status_for(index, extra.dual_stack);
                if extra.all_ready {
                    // Running and ready, on addresses of their own.
                    let ip = format!("10.250.{}.{}", p / 250, p % 250 + 1);
                    status = json!({"phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                        "podIP": ip, "podIPs": [{"ip": ip}]});
                }
                base.pods.push((made, status));
                index += 1;
            }
        }
        let nodes = NODES
            .iter()
            .map(|(name, zone, cpu, ready, control_plane)| {
                let mut node_labels = BTreeMap::new();
                if let Some(zone) = zone {
                    node_labels.insert("topology.kubernetes.io/zone".to_string(), zone.to_string());
                }
                if *control_plane {
                    node_labels.insert(
                        "node-role.kubernetes.io/control-plane".to_string(),
                        String::new(),
                    );
                }
                let node = json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": node_labels}});
                let resources = json!({"cpu": cpu, "memory": "8Gi", "pods": "110"});
                let status = json!({
                    "conditions": [{"type": "Ready", "status": if *ready {"True"} else {"False"},
                        "reason": "SetByTest", "message": "no kubelet runs"}],
                    "allocatable": resources,
                    "capacity": resources,
                });
                (serde_json::from_value(node).unwrap_or_default(), status)
            })
            .collect();
        SliceWorkload { base, nodes }
    }

    /// Creates the Nodes (with their status), then the Endpoints workload with
    /// the slice Services (see [`Workload::create`]).
    pub async fn create(&self, client: &Client) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        for (node, status) in &self.nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), node)
                .await
                .with_context(|| format!("creating node {name}"))?;
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .with_context(|| format!("writing the status of node {name}"))?;
        }
        self.base.create(client).await
    }
}

/// Pods the churn step adds to the Service above 100 endpoints.
const CHURN_NEW_PODS: usize = 40;

impl SliceWorkload {
    /// Changes after the first convergence, each a kind of event a controller
    /// must follow incrementally: every tenth running pod flips readiness, every
    /// fifteenth pod of the Service above 100 endpoints goes at once and
    /// [`CHURN_NEW_PODS`] new ones join it (slices fill and split), a Service
    /// gets a label (every slice relabelled), one switches trafficDistribution
    /// (node hints appear) and one loses its topology annotation (its
    /// trafficDistribution takes over). Returns how many objects it changed.
    pub async fn churn(&self, client: &Client) -> Result<usize> {
        let ns = &self.base.namespaces[0];
        let pods = Api::<Pod>::namespaced(client.clone(), ns);
        let mut changed = 0;
        for (index, (pod, status)) in self.base.pods.iter().enumerate() {
            let Some(name) = pod.metadata.name.as_deref() else {
                continue;
            };
            let namespace = pod.metadata.namespace.as_deref().unwrap_or(ns);
            let api = Api::<Pod>::namespaced(client.clone(), namespace);
            if name.starts_with("medium-pod-") && index % 15 == 0 {
                let params = kube::api::DeleteParams {
                    grace_period_seconds: Some(0),
                    ..kube::api::DeleteParams::default()
                };
                api.delete(name, &params)
                    .await
                    .with_context(|| format!("deleting pod {namespace}/{name}"))?;
                changed += 1;
            } else if index % 10 == 0 && status["phase"] == "Running" {
                let ready = status["conditions"][0]["status"] == "True";
                let flipped = json!({"status": {"conditions": [{"type": "Ready",
                    "status": if ready {"False"} else {"True"},
                    "lastTransitionTime": "2026-02-01T00:00:00Z"}]}});
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(flipped))
                    .await
                    .with_context(|| format!("flipping readiness of pod {namespace}/{name}"))?;
                changed += 1;
            }
        }
        for p in 0..CHURN_NEW_PODS {
            let index = self.base.pods.len() + p;
            let shape = PodShape {
                ns,
                name: format!("medium-new-{p}"),
                app: "medium".to_string(),
                ports: json!([{"name": "http", "containerPort": if p % 3 == 2 { 9090 } else { 8080 }}]),
                sidecar_ports: None,
                hostname: None,
                subdomain: None,
            };
            let mut made = pod(shape, index);
            if let Some(spec) = made.spec.as_mut() {
                spec.node_name = Some(READY_NODES[p % READY_NODES.len()].to_string());
            }
            pods.create(&PostParams::default(), &made)
                .await
                .with_context(|| format!("creating pod {ns}/medium-new-{p}"))?;
            let status = status_for(index, false);
            pods.patch_status(
                &format!("medium-new-{p}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .with_context(|| format!("writing the status of pod {ns}/medium-new-{p}"))?;
            changed += 1;
        }
        let services = Api::<Service>::namespaced(client.clone(), ns);
        let patches = [
            (
                "close",
                json!({"metadata": {"labels": {"churn": "relabelled"}}}),
            ),
            (
                "same-zone",
                json!({"spec": {"trafficDistribution": "PreferSameNode"}}),
            ),
            (
                "auto-legacy",
                json!({"metadata": {"annotations": {"service.kubernetes.io/topology-aware-hints": null}}}),
            ),
        ];
        for (name, patch) in patches {
            services
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .with_context(|| format!("changing service {ns}/{name}"))?;
            changed += 1;
        }
        Ok(changed)
    }
}

/// Every object of kind `K` in `namespaces`.
pub async fn list_namespaced<K>(client: &Client, namespaces: &[String]) -> Result<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut out = Vec::new();
    for ns in namespaces {
        let list = Api::<K>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing in {ns}"))?;
        out.extend(list.items);
    }
    Ok(out)
}

/// Everything the comparison reads back: Services, Pods, Nodes, EndpointSlices.
pub struct Snapshot {
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    pub slices: Vec<EndpointSlice>,
}

impl Snapshot {
    pub async fn read(client: &Client, namespaces: &[String]) -> Result<Snapshot> {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing nodes")?
            .items;
        Ok(Snapshot {
            services: list_namespaced(client, namespaces).await?,
            pods: list_namespaced(client, namespaces).await?,
            nodes,
            slices: list_namespaced(client, namespaces).await?,
        })
    }
}
