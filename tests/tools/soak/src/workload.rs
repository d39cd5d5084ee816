//! The soak's workload, which never stops: pods created and deleted, their
//! readiness flipped, Services created, edited (selector, ports) and deleted,
//! and a few Services above 1,000 endpoints whose pods also churn. Every
//! object is written straight to kube-apiserver (not through watch-chaos).
//!
//! The workload keeps a model of what it made, only to pick its next target;
//! what the controller must do is judged from live lists
//! ([`super::oracle`]). Writes that fail (kube-apiserver restarting, etcd
//! being restored) are counted and skipped; the model is read again from the
//! API at each quiet point ([`Workload::refresh`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use eg_harness::PodBuilder;

/// The Nodes the pods run on (EndpointSlices need them for zones).
pub const NODES: [(&str, &str); 3] = [
    ("soak-node-0", "zone-a"),
    ("soak-node-1", "zone-b"),
    ("soak-node-2", "zone-c"),
];

/// Services the workload never deletes nor edits: the targets of the
/// replayed old DELETEs (failure A on command).
pub const STABLE: [&str; 2] = ["stable-0", "stable-1"];

/// How big the workload is and how fast it changes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WorkloadSize {
    /// Small apps (`app-<i>`) the churned Services select among.
    pub apps: usize,
    /// Pods each small app has on average.
    pub pods_per_app: usize,
    /// Churned Services kept around (created, edited, deleted).
    pub services: usize,
    /// Services above 1,000 endpoints (`big-<i>`).
    pub big_services: usize,
    /// Pods behind each big Service (all start ready).
    pub big_pods: usize,
    /// Workload operations per second (each one to three API writes).
    pub ops_per_second: f64,
}

#[derive(Debug, Clone)]
struct PodInfo {
    app: String,
    ip: String,
    ready: bool,
}

/// What the workload did: operations by kind, and failed writes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpCounts {
    pub ops: BTreeMap<String, u64>,
    pub failed: BTreeMap<String, u64>,
}

impl OpCounts {
    pub fn total(&self) -> u64 {
        self.ops.values().sum()
    }
    pub fn total_failed(&self) -> u64 {
        self.failed.values().sum()
    }
}

/// The workload's state. Shared behind a mutex: whoever holds the lock
/// pauses the workload (the quiet points, and faults that act on a chosen
/// object).
pub struct Workload {
    client: Client,
    ns: String,
    size: WorkloadSize,
    rng: u64,
    next_ip: u32,
    next_name: u64,
    pods: BTreeMap<String, PodInfo>,
    /// Churned Service name → selected app.
    services: BTreeMap<String, String>,
    /// Pods deleted behind kube-apiserver's watch cache: LISTs still show
    /// them, so [`Workload::refresh`] leaves them out.
    pub ghosts: BTreeSet<String>,
    pub counts: OpCounts,
}

/// A simple xorshift64*: deterministic for a seed, no dependency.
fn next(rng: &mut u64) -> u64 {
    let mut x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn now_json() -> Value {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    serde_json::to_value(now).unwrap_or(Value::Null)
}

/// The status a kubelet would write: running at `ip`, ready or not.
fn status_patch(ip: &str, ready: bool) -> Value {
    let value = if ready { "True" } else { "False" };
    let now = now_json();
    json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": [
            {"type": "Ready", "status": value, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
        ],
    }})
}

fn service_object(ns: &str, name: &str, app: &str, target_port: i32, metrics: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": app}, "ports": ports(target_port, metrics)},
    })
}

fn ports(target_port: i32, metrics: bool) -> Value {
    let mut ports = vec![json!({"name": "http", "port": 80, "targetPort": target_port})];
    if metrics {
        ports.push(json!({"name": "metrics", "port": 9100, "targetPort": 9100}));
    }
    Value::Array(ports)
}

impl Workload {
    pub fn new(client: Client, ns: &str, size: WorkloadSize, seed: u64) -> Self {
        Self {
            client,
            ns: ns.to_string(),
            size,
            rng: seed | 1,
            next_ip: 0,
            next_name: 0,
            pods: BTreeMap::new(),
            services: BTreeMap::new(),
            ghosts: BTreeSet::new(),
            counts: OpCounts::default(),
        }
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn services_api(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn pick(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (next(&mut self.rng) % n as u64) as usize
        }
    }

    /// A fresh IP, never reused: 10.64.0.0/10 counted up.
    fn fresh_ip(&mut self) -> String {
        self.next_ip += 1;
        let n = self.next_ip;
        format!("10.{}.{}.{}", 64 + (n >> 16), (n >> 8) & 0xff, n & 0xff)
    }

    fn fresh_name(&mut self, prefix: &str) -> String {
        self.next_name += 1;
        format!("{prefix}-{}", self.next_name)
    }

    fn app(&mut self) -> String {
        let i = self.pick(self.size.apps);
        format!("app-{i}")
    }

    fn count(&mut self, op: &str, result: Result<()>) {
        *self.counts.ops.entry(op.to_string()).or_default() += 1;
        if let Err(err) = result {
            *self.counts.failed.entry(op.to_string()).or_default() += 1;
            tracing::debug!("soak workload {op}: {err:#}");
        }
    }

    /// Nodes, the stable and big Services with their pods, the small apps'
    /// pods and the churned Services. Big pods are written 16 at a time.
    pub async fn create_initial(&mut self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for (name, zone) in NODES {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
            }))?;
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(err) => return Err(err).context("creating a Node"),
            }
        }
        let services = self.services_api();
        for name in STABLE {
            let svc: Service =
                serde_json::from_value(service_object(&self.ns, name, name, 8080, false))?;
            services.create(&PostParams::default(), &svc).await?;
        }
        for i in 0..self.size.big_services {
            let name = format!("big-{i}");
            let svc: Service =
                serde_json::from_value(service_object(&self.ns, &name, &name, 8080, false))?;
            services.create(&PostParams::default(), &svc).await?;
        }
        let mut wanted: Vec<(String, String, String, bool)> = Vec::new();
        for name in STABLE {
            for p in 0..3 {
                let ip = self.fresh_ip();
                wanted.push((format!("{name}-pod-{p}"), name.to_string(), ip, true));
            }
        }
        for i in 0..self.size.big_services {
            for p in 0..self.size.big_pods {
                let ip = self.fresh_ip();
                wanted.push((format!("big-{i}-pod-{p}"), format!("big-{i}"), ip, true));
            }
        }
        for a in 0..self.size.apps {
            for _ in 0..self.size.pods_per_app {
                let ip = self.fresh_ip();
                let ready = !next(&mut self.rng).is_multiple_of(4);
                let name = self.fresh_name("pod");
                wanted.push((name, format!("app-{a}"), ip, ready));
            }
        }
        let client = self.client.clone();
        let ns = self.ns.clone();
        futures::stream::iter(wanted.clone().into_iter().enumerate())
            .map(|(i, (name, app, ip, ready))| {
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let ns = ns.clone();
                async move {
                    let pod = PodBuilder::serving(&ns, &name, &app)
                        .node_name(NODES[i % NODES.len()].0)
                        .build();
                    api.create(&PostParams::default(), &pod)
                        .await
                        .with_context(|| format!("creating pod {name}"))?;
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(status_patch(&ip, ready)),
                    )
                    .await
                    .with_context(|| format!("writing the status of pod {name}"))?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        for (name, app, ip, ready) in wanted {
            self.pods.insert(name, PodInfo { app, ip, ready });
        }
        for _ in 0..self.size.services {
            let result = self.create_service().await;
            result?;
        }
        Ok(())
    }

    /// Reads the pods and Services back from the API: the model follows
    /// what really exists (after failed writes, an etcd restore).
    pub async fn refresh(&mut self) -> Result<()> {
        let pods = self.pods_api().list(&ListParams::default()).await?;
        self.pods = pods
            .items
            .iter()
            .filter(|p| !self.ghosts.contains(&p.name_any()))
            .filter_map(|p| {
                let status = p.status.as_ref()?;
                let ip = status.pod_ip.clone()?;
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let app = p.labels().get("app")?.clone();
                Some((p.name_any(), PodInfo { app, ip, ready }))
            })
            .collect();
        let services = self.services_api().list(&ListParams::default()).await?;
        self.services = services
            .items
            .iter()
            .filter(|s| s.name_any().starts_with("svc-"))
            .map(|s| {
                let app = s
                    .spec
                    .as_ref()
                    .and_then(|sp| sp.selector.as_ref())
                    .and_then(|sel| sel.get("app").cloned())
                    .unwrap_or_default();
                (s.name_any(), app)
            })
            .collect();
        Ok(())
    }

    /// Pods of the small apps (the churned ones).
    fn small_pods(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.app.starts_with("app-"))
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn big_pods(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.app.starts_with("big-"))
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub async fn create_pod(&mut self, app: &str) -> Result<()> {
        let ready = !next(&mut self.rng).is_multiple_of(4);
        self.create_pod_ready(app, ready).await.map(drop)
    }

    /// Creates a pod of `app`, running, ready or not; returns its name.
    pub async fn create_pod_ready(&mut self, app: &str, ready: bool) -> Result<String> {
        let name = self.fresh_name("pod");
        let ip = self.fresh_ip();
        let node = NODES[self.pick(NODES.len())].0;
        let pod = PodBuilder::serving(&self.ns, &name, app)
            .node_name(node)
            .build();
        let api = self.pods_api();
        api.create(&PostParams::default(), &pod).await?;
        self.pods.insert(
            name.clone(),
            PodInfo {
                app: app.to_string(),
                ip: ip.clone(),
                ready,
            },
        );
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(status_patch(&ip, ready)),
        )
        .await?;
        Ok(name)
    }

    /// The IP of pod `name`, as the workload made it.
    pub fn ip_of(&self, name: &str) -> Option<String> {
        self.pods.get(name).map(|p| p.ip.clone())
    }

    /// How many pods the workload knows of.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Deletes pod `name` at once (grace period 0).
    pub async fn delete_pod(&mut self, name: &str) -> Result<()> {
        self.pods.remove(name);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.pods_api().delete(name, &params).await?;
        Ok(())
    }

    /// A pod of a small app, if any, to act on.
    pub fn some_small_pod(&mut self) -> Option<String> {
        let pods = self.small_pods();
        let i = self.pick(pods.len());
        pods.get(i).cloned()
    }

    async fn flip(&mut self, name: &str) -> Result<()> {
        let Some(info) = self.pods.get_mut(name) else {
            return Ok(());
        };
        info.ready = !info.ready;
        let patch = status_patch(&info.ip, info.ready);
        self.pods_api()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    pub async fn create_service(&mut self) -> Result<()> {
        let name = self.fresh_name("svc");
        let app = self.app();
        let port = [8080, 8081, 9000][self.pick(3)];
        let metrics = next(&mut self.rng).is_multiple_of(2);
        let svc: Service =
            serde_json::from_value(service_object(&self.ns, &name, &app, port, metrics))?;
        self.services_api()
            .create(&PostParams::default(), &svc)
            .await?;
        self.services.insert(name, app);
        Ok(())
    }

    /// A churned Service, if any, to act on.
    pub fn some_service(&mut self) -> Option<String> {
        let names: Vec<String> = self.services.keys().cloned().collect();
        let i = self.pick(names.len());
        names.get(i).cloned()
    }

    pub async fn delete_service(&mut self, name: &str) -> Result<()> {
        self.services.remove(name);
        self.services_api()
            .delete(name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Points Service `name` at `app` (one in five times at an app no pod has).
    pub async fn set_selector(&mut self, name: &str, app: &str) -> Result<()> {
        self.services.insert(name.to_string(), app.to_string());
        let patch = Patch::Merge(json!({"spec": {"selector": {"app": app}}}));
        self.services_api()
            .patch(name, &PatchParams::default(), &patch)
            .await?;
        Ok(())
    }

    async fn edit_ports(&mut self, name: &str) -> Result<()> {
        let port = [8080, 8081, 9000][self.pick(3)];
        let metrics = next(&mut self.rng).is_multiple_of(2);
        let patch = Patch::Merge(json!({"spec": {"ports": ports(port, metrics)}}));
        self.services_api()
            .patch(name, &PatchParams::default(), &patch)
            .await?;
        Ok(())
    }

    /// The selected app of churned Service `name`.
    pub fn selector_of(&self, name: &str) -> Option<String> {
        self.services.get(name).cloned()
    }

    /// One random change.
    pub async fn step(&mut self) {
        let small = self.small_pods().len();
        let target = self.size.apps * self.size.pods_per_app;
        let roll = self.pick(100);
        match roll {
            // Pods created and deleted, keeping their number near the target.
            0..=39 => {
                if small < target || (small <= target + target / 5 && roll < 20) {
                    let app = self.app();
                    let r = self.create_pod(&app).await;
                    self.count("pod-create", r);
                } else if let Some(name) = self.some_small_pod() {
                    let r = self.delete_pod(&name).await;
                    self.count("pod-delete", r);
                }
            }
            // Readiness flipped.
            40..=64 => {
                if let Some(name) = self.some_small_pod() {
                    let r = self.flip(&name).await;
                    self.count("pod-readiness", r);
                }
            }
            // Big Services: readiness flipped, pods replaced.
            65..=72 => {
                let big = self.big_pods();
                if !big.is_empty() {
                    let name = big[self.pick(big.len())].clone();
                    if roll < 70 {
                        let r = self.flip(&name).await;
                        self.count("big-pod-readiness", r);
                    } else {
                        let app = self.pods.get(&name).map(|p| p.app.clone());
                        let r = self.delete_pod(&name).await;
                        self.count("big-pod-delete", r);
                        if let Some(app) = app {
                            let r = self.create_pod(&app).await;
                            self.count("big-pod-create", r);
                        }
                    }
                }
            }
            // Services created and deleted, keeping their number near the target.
            73..=82 => {
                if self.services.len() < self.size.services {
                    let r = self.create_service().await;
                    self.count("service-create", r);
                } else if let Some(name) = self.some_service() {
                    let r = self.delete_service(&name).await;
                    self.count("service-delete", r);
                }
            }
            // Selectors edited.
            83..=91 => {
                if let Some(name) = self.some_service() {
                    let app = if self.pick(5) == 0 {
                        "nothing".to_string()
                    } else {
                        self.app()
                    };
                    let r = self.set_selector(&name, &app).await;
                    self.count("service-selector", r);
                }
            }
            // Ports edited.
            _ => {
                if let Some(name) = self.some_service() {
                    let r = self.edit_ports(&name).await;
                    self.count("service-ports", r);
                }
            }
        }
    }
}

/// Runs the workload until `stop`: one step every 1/ops_per_second, each
/// under the lock (so holding the lock pauses it).
pub fn spawn(workload: Arc<Mutex<Workload>>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let period = {
            let w = workload.lock().await;
            Duration::from_secs_f64(1.0 / w.size.ops_per_second.max(0.1))
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let mut w = workload.lock().await;
            // A write that hangs (kube-apiserver going away) must not stall the soak.
            let _ = tokio::time::timeout(Duration::from_secs(20), w.step()).await;
        }
    })
}
