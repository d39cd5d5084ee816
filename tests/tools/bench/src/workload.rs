//! The bench's own workload: plain ClusterIP Services, each selecting
//! `pods_per_service` Running, Ready pods with one IP and one named port, spread
//! over namespaces of `services_per_namespace` Services, on [`NODES`] Nodes in
//! three zones (the EndpointSlice controllers leave out pods whose Node does
//! not exist and read the zone from the Node). Deterministic: the same names,
//! IPs and Nodes every run.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// A bench size: `S`, `M`, `L` or `XL`, or a number of Services (10 pods each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchSize {
    pub name: String,
    pub services: usize,
    pub pods_per_service: usize,
    pub services_per_namespace: usize,
}

impl BenchSize {
    /// `S` = 100 Services × 1,000 pods, `M` = 1,000 × 10,000, `L` = 3,000 ×
    /// 30,000, `XL` = 10,000 × 100,000 (the scale of Kubernetes' own
    /// scalability thresholds); a number `N` = N Services × 10·N pods.
    pub fn named(name: &str) -> Result<Self> {
        let services = match name.to_ascii_uppercase().as_str() {
            "S" => 100,
            "M" => 1_000,
            "L" => 3_000,
            "XL" => 10_000,
            other => match other.parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    bail!("unknown bench size {other:?} (use S, M, L, XL or a number of Services)")
                }
            },
        };
        Ok(Self {
            name: name.to_ascii_uppercase(),
            services,
            pods_per_service: 10,
            services_per_namespace: 50,
        })
    }

    pub fn pods(&self) -> usize {
        self.services * self.pods_per_service
    }

    pub fn namespaces(&self) -> usize {
        self.services.div_ceil(self.services_per_namespace.max(1))
    }
}

/// Nodes the pods run on (`node-0` …), pod `i` (in creation order) on `node-{i % NODES}`.
pub const NODES: usize = 10;
/// The zones of the Nodes, Node `n` in `ZONES[n % 3]`.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// Prefix of every bench namespace.
pub const NAMESPACE_PREFIX: &str = "bench-";

/// One pod of the workload, by position.
#[derive(Clone, Debug)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub service: usize,
}

impl PodRef {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The generated objects' names.
#[derive(Clone, Debug)]
pub struct BenchWorkload {
    pub namespaces: Vec<String>,
    /// `namespace/name` of each Service, by index.
    pub services: Vec<(String, String)>,
    /// Pods in churn order: pod 0 of every Service, then pod 1 of every
    /// Service, ... so consecutive flips hit different Services.
    pub pods: Vec<PodRef>,
}

fn ready_conditions(ready: bool) -> Value {
    let status = if ready { "True" } else { "False" };
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string();
    json!([
        {"type": "Ready", "status": status, "lastTransitionTime": now},
        {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
    ])
}

impl BenchWorkload {
    /// The IP of pod `index` (creation order).
    pub fn pod_ip(index: usize) -> String {
        format!(
            "10.{}.{}.{}",
            64 + (index >> 16) % 64,
            (index >> 8) & 255,
            index & 255
        )
    }

    /// The Node of pod `index` (creation order) and that Node's zone.
    pub fn node_of(index: usize) -> (String, &'static str) {
        let n = index % NODES;
        (format!("node-{n}"), ZONES[n % ZONES.len()])
    }

    pub fn generate(size: &BenchSize) -> Self {
        let namespaces: Vec<String> = (0..size.namespaces())
            .map(|i| format!("{NAMESPACE_PREFIX}{i}"))
            .collect();
        let services: Vec<(String, String)> = (0..size.services)
            .map(|s| {
                let ns = namespaces[s / size.services_per_namespace.max(1)].clone();
                (ns, format!("svc-{s}"))
            })
            .collect();
        let mut pods = Vec::with_capacity(size.pods());
        for p in 0..size.pods_per_service {
            for (s, (ns, _)) in services.iter().enumerate() {
                pods.push(PodRef {
                    namespace: ns.clone(),
                    name: format!("svc-{s}-pod-{p}"),
                    service: s,
                });
            }
        }
        Self {
            namespaces,
            services,
            pods,
        }
    }

    /// The workload of `size`, created on `client` 32 requests at a time
    /// and reported on stderr: what the probes beside `eg-bench` start from.
    pub async fn created(size: &BenchSize, client: &Client) -> Result<Self> {
        let workload = Self::generate(size);
        let took = workload.create(client, 32).await?;
        eprintln!(
            "size {}: {} pods in {} Services created in {:.0} s",
            size.name,
            size.pods(),
            size.services,
            took.as_secs_f64()
        );
        Ok(workload)
    }

    /// Creates the Nodes, namespaces, Services, pods and the pods' Ready
    /// statuses with `parallel` requests in flight; returns how long it took.
    pub async fn create(&self, client: &Client, parallel: usize) -> Result<Duration> {
        let start = Instant::now();
        create_nodes(client).await?;
        eg_workload::workload::create_namespaces(client, &self.namespaces).await?;
        stream::iter(self.services.iter().enumerate().map(Ok))
            .try_for_each_concurrent(parallel, |(s, (ns, name))| async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"namespace": ns, "name": name},
                    "spec": {
                        "selector": {"app": format!("svc-{s}")},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
                    },
                }))?;
                Api::<Service>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &svc)
                    .await
                    .with_context(|| format!("creating service {ns}/{name}"))?;
                anyhow::Ok(())
            })
            .await?;
        // Progress every 10,000 pods: at XL setup takes minutes.
        let created = std::sync::atomic::AtomicUsize::new(0);
        let pods_start = Instant::now();
        let total = self.pods.len();
        stream::iter(self.pods.iter().enumerate().map(Ok))
            .try_for_each_concurrent(parallel, |(i, pod)| {
                let created = &created;
                async move {
                    create_pod(client, pod, i).await?;
                    let n = created.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n.is_multiple_of(10_000) && n < total {
                        let secs = pods_start.elapsed().as_secs_f64();
                        eprintln!(
                            "eg-bench: {n} of {total} pods created in {secs:.0} s ({:.0} pods/s)",
                            n as f64 / secs.max(1e-9)
                        );
                    }
                    anyhow::Ok(())
                }
            })
            .await?;
        Ok(start.elapsed())
    }

    /// Creates pod `index` (churn order) again as setup made it, Running and
    /// Ready with its own IP and Node: after the ghost phase deleted it.
    pub async fn create_pod_again(&self, client: &Client, index: usize) -> Result<()> {
        let pod = self
            .pods
            .get(index)
            .with_context(|| format!("the workload has no pod {index}"))?;
        create_pod(client, pod, index).await
    }

    /// Deletes every Endpoints object and every EndpointSlice (whichever
    /// controller manages it) in the bench namespaces.
    pub async fn delete_outputs(&self, client: &Client) -> Result<()> {
        let (dp, lp) = (DeleteParams::default(), ListParams::default());
        for ns in &self.namespaces {
            Api::<Endpoints>::namespaced(client.clone(), ns)
                .delete_collection(&dp, &lp)
                .await
                .with_context(|| format!("deleting the Endpoints of {ns}"))?;
            Api::<EndpointSlice>::namespaced(client.clone(), ns)
                .delete_collection(&dp, &lp)
                .await
                .with_context(|| format!("deleting the EndpointSlices of {ns}"))?;
        }
        Ok(())
    }
}

/// The [`NODES`] Nodes, Ready, each with its zone label (no kubelet runs).
async fn create_nodes(client: &Client) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for n in 0..NODES {
        let (name, zone) = BenchWorkload::node_of(n);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        }))?;
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {name}"))?;
        let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "SetByBench", "message": "no kubelet runs"}],
            "allocatable": resources,
            "capacity": resources,
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("writing the status of node {name}"))?;
    }
    Ok(())
}

async fn create_pod(client: &Client, pod: &PodRef, index: usize) -> Result<()> {
    let obj: Pod = serde_json::from_value(json!({
        "metadata": {
            "namespace": pod.namespace, "name": pod.name,
            "labels": {"app": format!("svc-{}", pod.service), "bench": "yes"},
        },
        "spec": {
            "nodeName": BenchWorkload::node_of(index).0,
            "containers": [{
                "name": "app", "image": "registry.invalid/app:1",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            }],
        },
    }))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating pod {}", pod.key()))?;
    let ip = BenchWorkload::pod_ip(index);
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": ready_conditions(true),
    }});
    api.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("writing the status of pod {}", pod.key()))?;
    Ok(())
}

/// Sets the pod's Ready and ContainersReady conditions, as a kubelet would.
pub async fn set_ready(client: &Client, pod: &PodRef, ready: bool) -> Result<()> {
    let status = json!({"status": {"conditions": ready_conditions(ready)}});
    Api::<Pod>::namespaced(client.clone(), &pod.namespace)
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("flipping pod {}", pod.key()))?;
    Ok(())
}
