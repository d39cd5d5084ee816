//! A co-tenant that floods the API servers: another namespace's
//! ServiceAccount, matched by the built-in `service-accounts` FlowSchema
//! (`workload-low`), LISTing every object of a filler kind and GETting one,
//! bounded in count and time. The overload rows use it on the local HA
//! control plane (`pressure.rs`) and on the real node
//! (`real_node/overload.rs`), together with the readings both judge by:
//! kube-apiserver's APF queue waits per FlowSchema and the Leases'
//! transitions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Result;
use eg_harness::{ControlPlane, PodBuilder};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::common::service_account_token;

/// The co-tenant's namespace and ServiceAccount.
pub const TENANT: &str = "tenant";
const FLOOD_SA: &str = "flood";

/// What the co-tenant lists over and over: pods where no node runs them, or
/// ConfigMaps where a real node would (3,000 pods on one node would be the
/// test's load, not the co-tenant's requests).
#[derive(Debug, Clone, Copy)]
pub enum Filler {
    Pods,
    ConfigMaps,
}

impl Filler {
    fn resource(self) -> &'static str {
        match self {
            Filler::Pods => "pods",
            Filler::ConfigMaps => "configmaps",
        }
    }
}

/// The co-tenant: its client and what it lists.
pub struct CoTenant {
    client: Client,
    filler: Filler,
    count: usize,
}

/// What one flood sent and how it was answered.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct FloodCounts {
    pub requests: u64,
    /// Answered 429 (APF rejected them).
    pub throttled: u64,
    /// Refused otherwise (must be 0: a refused flood loads nothing).
    pub failed: u64,
}

/// A flood under way ([`CoTenant::flood`]).
pub struct Flood {
    tasks: Vec<JoinHandle<()>>,
    sent: Arc<AtomicU64>,
    throttled: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Flood {
    /// Waits for every client's loop to end (at its deadline or budget).
    pub async fn finish(self) -> Result<FloodCounts> {
        for task in self.tasks {
            task.await?;
        }
        Ok(FloodCounts {
            requests: self.sent.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        })
    }
}

impl CoTenant {
    /// Namespace `tenant` (made here), ServiceAccount `tenant/flood` allowed
    /// to read `filler` everywhere, and `count` filler objects.
    pub async fn create(cp: &ControlPlane, filler: Filler, count: usize) -> Result<Self> {
        let admin = cp.client();
        cp.create_namespace(TENANT).await?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": FLOOD_SA}}))?;
        Api::<ServiceAccount>::namespaced(admin.clone(), TENANT)
            .create(&PostParams::default(), &sa)
            .await?;
        let role = json!({"metadata": {"name": "tenant-flood"},
            "rules": [{"apiGroups": [""], "resources": [filler.resource()], "verbs": ["get", "list"]}]});
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &serde_json::from_value(role)?)
            .await?;
        let binding = json!({"metadata": {"name": "tenant-flood"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tenant-flood"},
            "subjects": [{"kind": "ServiceAccount", "name": FLOOD_SA, "namespace": TENANT}]});
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &serde_json::from_value(binding)?)
            .await?;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), TENANT);
        let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), TENANT);
        let created: Vec<Result<()>> = futures::stream::iter(0..count)
            .map(|i| {
                let (pods, maps) = (pods.clone(), maps.clone());
                async move {
                    let name = format!("filler-{i}");
                    match filler {
                        Filler::Pods => {
                            let pod = PodBuilder::serving(TENANT, &name, "filler").build();
                            pods.create(&PostParams::default(), &pod).await?;
                        }
                        Filler::ConfigMaps => {
                            let map = serde_json::from_value(json!({"metadata": {"name": name},
                                "data": {"payload": "x".repeat(512)}}))?;
                            maps.create(&PostParams::default(), &map).await?;
                        }
                    }
                    Ok(())
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        created.into_iter().collect::<Result<Vec<_>>>()?;
        let token = service_account_token(&admin, TENANT, FLOOD_SA).await?;
        Ok(Self {
            client: cp.client_for_token(&token).await?,
            filler,
            count,
        })
    }

    /// `clients` concurrent loops, each a LIST of every filler object and a
    /// GET of one, until `deadline` or `max_requests` in all.
    pub fn flood(&self, clients: usize, deadline: Instant, max_requests: u64) -> Flood {
        let sent = Arc::new(AtomicU64::new(0));
        let throttled = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let tasks = (0..clients)
            .map(|index| {
                let counts = (sent.clone(), throttled.clone(), failed.clone());
                let (client, filler, count) = (self.client.clone(), self.filler, self.count);
                tokio::spawn(async move {
                    let (sent, throttled, failed) = counts;
                    let mut n = index;
                    while Instant::now() < deadline
                        && sent.fetch_add(2, Ordering::Relaxed) < max_requests
                    {
                        let name = format!("filler-{}", n % count.max(1));
                        for result in list_and_get(&client, filler, &name).await {
                            match result {
                                Ok(()) => {}
                                Err(kube::Error::Api(status)) if status.code == 429 => {
                                    throttled.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(_) => {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        n += clients;
                    }
                })
            })
            .collect();
        Flood {
            tasks,
            sent,
            throttled,
            failed,
        }
    }
}

async fn list_and_get(client: &Client, filler: Filler, name: &str) -> [Result<(), kube::Error>; 2] {
    match filler {
        Filler::Pods => list_and_get_of::<Pod>(client, name).await,
        Filler::ConfigMaps => list_and_get_of::<ConfigMap>(client, name).await,
    }
}

/// A LIST of every `K` and a GET of `name` in the co-tenant's namespace.
async fn list_and_get_of<K>(client: &Client, name: &str) -> [Result<(), kube::Error>; 2]
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let all: Api<K> = Api::all(client.clone());
    let one: Api<K> = Api::namespaced(client.clone(), TENANT);
    [
        all.list(&ListParams::default()).await.map(drop),
        one.get(name).await.map(drop),
    ]
}

/// Per FlowSchema, the sum (s) and count of the request waits in APF
/// queues, added up over every kube-apiserver of `cp` (each read on its own).
pub async fn apf_waits(cp: &ControlPlane) -> Result<ApfWaits> {
    let mut text = String::new();
    for client in cp.apiserver_clients() {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        text.push_str(&client.request_text(request).await?);
        text.push('\n');
    }
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let (sum, name) = if let Some(rest) =
            line.strip_prefix("apiserver_flowcontrol_request_wait_duration_seconds_sum{")
        {
            (true, rest)
        } else if let Some(rest) =
            line.strip_prefix("apiserver_flowcontrol_request_wait_duration_seconds_count{")
        {
            (false, rest)
        } else {
            continue;
        };
        let Some(schema) = label(name, "flow_schema") else {
            continue;
        };
        let value: f64 = name
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        let entry = out.entry(schema.to_string()).or_default();
        if sum {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    Ok(ApfWaits(out))
}

/// Cumulative APF queue waits per FlowSchema: (sum of seconds, count).
#[derive(Debug, Default)]
pub struct ApfWaits(BTreeMap<String, (f64, f64)>);

impl ApfWaits {
    /// The mean wait (ms) of `schema`'s requests between `earlier` and this
    /// reading; 0 when none was served.
    pub fn mean_ms_since(&self, earlier: &ApfWaits, schema: &str) -> f64 {
        let (sum0, n0) = earlier.0.get(schema).copied().unwrap_or_default();
        let (sum1, n1) = self.0.get(schema).copied().unwrap_or_default();
        if n1 > n0 {
            (sum1 - sum0) / (n1 - n0) * 1000.0
        } else {
            0.0
        }
    }
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let end = labels[start..].find('"')? + start;
    Some(&labels[start..end])
}

/// `leaseTransitions` of Leases `namespace/name`, keyed by `key`.
pub async fn lease_transitions(
    admin: &Client,
    leases: &[(&str, &str, &str)],
) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for (key, namespace, name) in leases {
        let lease = Api::<Lease>::namespaced(admin.clone(), namespace)
            .get_opt(name)
            .await?;
        let transitions = lease
            .and_then(|l| l.spec)
            .and_then(|s| s.lease_transitions)
            .unwrap_or_default();
        out.insert(key.to_string(), i64::from(transitions));
    }
    Ok(out)
}

/// The `q` quantile of `values` (nearest rank), rounded to 0.01; 0 when empty.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    (sorted[index] * 100.0).round() / 100.0
}
