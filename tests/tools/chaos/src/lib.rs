//! Helpers for the watch-chaos scenario matrix: run the proxy, drive its
//! control API, watch Endpoints and Services *directly* (not through the
//! proxy) to count spurious Endpoints deletions, and check convergence.

mod observer;
mod slice_observer;
pub use observer::Observer;
pub use slice_observer::SERVICE_NAME_LABEL;

/// What a controller publishes for a Service, and so what a chaos row reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Published {
    #[default]
    Endpoints,
    EndpointSlices,
}

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use eg_harness::loopback::http_json;
use eg_harness::process::{Process, free_ports};
use eg_harness::{ControlPlane, PodBuilder, PodStatusSpec, ServiceBuilder};

/// A running `watch-chaos` binary in front of a control plane.
pub struct ChaosProxy {
    pub process: Process,
    pub proxy_port: u16,
    pub control_port: u16,
    /// A kubeconfig whose server is the proxy.
    pub kubeconfig: PathBuf,
}

impl ChaosProxy {
    /// The workspace's watch-chaos ([`eg_harness::binaries::watch_chaos`])
    /// in front of `cp`, named `watch-chaos`.
    pub async fn in_front_of(cp: &ControlPlane) -> Result<Self> {
        Self::start(cp, &eg_harness::binaries::watch_chaos()?, "watch-chaos").await
    }

    /// Starts `binary` against `cp` and waits for its control API.
    pub async fn start(cp: &ControlPlane, binary: &Path, name: &str) -> Result<Self> {
        let [proxy_port, control_port] = free_ports::<2>()?;
        let kubeconfig = cp.log_dir().join(format!("kubeconfig-{name}.yaml"));
        let args = vec![
            format!("--upstream-kubeconfig={}", cp.kubeconfig_path().display()),
            format!("--listen=127.0.0.1:{proxy_port}"),
            format!("--control=127.0.0.1:{control_port}"),
            format!("--write-kubeconfig={}", kubeconfig.display()),
        ];
        let mut process = Process::spawn(
            name,
            binary,
            &args,
            &cp.log_dir().join(format!("{name}.log")),
        )?;
        process
            .wait_until(
                Duration::from_secs(20),
                Duration::from_millis(100),
                || async {
                    http_json(control_port, "GET", "/healthz", None).await?;
                    // Written once the proxy listens, after its control API.
                    if !kubeconfig.exists() {
                        bail!("no {} yet", kubeconfig.display());
                    }
                    Ok(())
                },
            )
            .await?;
        Ok(Self {
            process,
            proxy_port,
            control_port,
            kubeconfig,
        })
    }

    /// A kube::Client going through the proxy.
    pub async fn client(&self) -> Result<Client> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(Client::try_from(config)?)
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        http_json(self.control_port, "GET", path, None).await
    }

    /// The watches of `resource` the proxy answered in protobuf, from its
    /// `/stats` answer (0 when the stats do not say).
    pub fn protobuf_watches(stats: &Value, resource: &str) -> u64 {
        stats["resources"][resource]["protobuf_watches"]
            .as_u64()
            .unwrap_or(0)
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Value> {
        http_json(self.control_port, "POST", path, Some(body)).await
    }

    /// Sets a fault: `fault("services", "drop-deletes", json!({}))`.
    pub async fn fault(&self, resource: &str, fault: &str, mut options: Value) -> Result<Value> {
        if !options.is_object() {
            options = serde_json::json!({});
        }
        options["resource"] = resource.into();
        options["fault"] = fault.into();
        self.post("/faults", options).await
    }

    pub async fn clear_faults(&self) -> Result<Value> {
        http_json(self.control_port, "DELETE", "/faults", None).await
    }

    /// One counter of `GET /stats`.
    pub async fn stat(&self, resource: &str, what: &str) -> u64 {
        self.get("/stats")
            .await
            .ok()
            .and_then(|s| s["resources"][resource][what].as_u64())
            .unwrap_or(0)
    }
}

/// What the Endpoints of one namespace should be: Service → ready IPs, and
/// names that must have no Endpoints.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    pub ready: BTreeMap<String, BTreeSet<String>>,
    pub absent: BTreeSet<String>,
    /// Read from Endpoints or from EndpointSlices.
    pub published: Published,
}

impl Expected {
    pub fn service(mut self, name: &str, ips: &[&str]) -> Self {
        self.ready.insert(
            name.to_string(),
            ips.iter().map(|s| s.to_string()).collect(),
        );
        self
    }

    pub fn absent(mut self, name: &str) -> Self {
        self.absent.insert(name.to_string());
        self
    }

    /// The same expectations, read from what `published` names.
    pub fn read_from(mut self, published: Published) -> Self {
        self.published = published;
        self
    }

    /// Polls every 200 ms until the namespace matches; returns how long that
    /// took, or fails after `timeout` with `what` and the last difference.
    pub async fn wait(
        &self,
        client: &Client,
        namespace: &str,
        timeout: Duration,
        what: &str,
    ) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let problem = match self.check(client, namespace).await {
                Ok(None) => return Ok(start.elapsed()),
                Ok(Some(problem)) => problem,
                Err(err) => format!("{err:#}"),
            };
            if start.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {what}: {problem}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `Ok(None)` when the namespace matches, else what differs.
    pub async fn check(&self, client: &Client, namespace: &str) -> Result<Option<String>> {
        let got = published_ready_ips(client, namespace, self.published).await?;
        let what = match self.published {
            Published::Endpoints => "Endpoints",
            Published::EndpointSlices => "EndpointSlices",
        };
        let mut wrong = Vec::new();
        for (name, ips) in &self.ready {
            match got.get(name) {
                None => wrong.push(format!("{name}: no {what}")),
                Some(have) if have != ips => wrong.push(format!("{name}: {have:?} != {ips:?}")),
                _ => {}
            }
        }
        for name in &self.absent {
            if got.contains_key(name) {
                wrong.push(format!("{name}: {what} of a deleted Service remain"));
            }
        }
        Ok((!wrong.is_empty()).then(|| wrong.join("; ")))
    }
}

/// Service name → ready addresses, read from the Endpoints of `namespace` or
/// from its EndpointSlices (the union over each Service's slices; a Service
/// with only empty slices maps to an empty set).
async fn published_ready_ips(
    client: &Client,
    namespace: &str,
    published: Published,
) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let params = ListParams::default();
    Ok(match published {
        Published::Endpoints => Api::<Endpoints>::namespaced(client.clone(), namespace)
            .list(&params)
            .await?
            .items
            .iter()
            .map(|ep| {
                (
                    ep.name_any(),
                    eg_harness::ready_ips(ep).into_iter().collect(),
                )
            })
            .collect(),
        Published::EndpointSlices => {
            let mut got: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
                .list(&params)
                .await?;
            for slice in &slices.items {
                let Some(service) = slice.labels().get(SERVICE_NAME_LABEL) else {
                    continue;
                };
                let ready = slice
                    .endpoints
                    .iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                    .flat_map(|e| e.addresses.iter().cloned());
                got.entry(service.clone()).or_default().extend(ready);
            }
            got
        }
    })
}

/// The history failure A replays, in namespace `ns`: Service `long` (the
/// oldest) with a ready pod at `long_ip`, then Service `b` with a ready pod at
/// `b_ip`, deleted and created again (a new UID). Returns the Endpoints the
/// namespace must then hold.
pub async fn failure_a_history(
    cp: &ControlPlane,
    ns: &str,
    long_ip: &str,
    b_ip: &str,
) -> Result<Expected> {
    let service = |name: &str| {
        ServiceBuilder::new(ns, name)
            .selector("app", name)
            .port("http", 80, 8080, "TCP")
    };
    for (name, ip) in [("long", long_ip), ("b", b_ip)] {
        cp.create_service(service(name)).await?;
        let pod = PodBuilder::serving(ns, &format!("{name}-0"), name);
        cp.create_pod_with_status(pod, PodStatusSpec::ready([ip]))
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Api::<Service>::namespaced(cp.client(), ns)
        .delete("b", &Default::default())
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cp.create_service(service("b")).await?;
    Ok(Expected::default()
        .service("long", &[long_ip])
        .service("b", &[b_ip]))
}

/// Polls `expected` for `window` from `fault`: converged when it holds at the
/// end; the time is when it last became true (0 if it never broke).
pub async fn watch_convergence(
    client: &Client,
    namespace: &str,
    expected: &Expected,
    fault: Instant,
    window: Duration,
) -> (bool, f64, Option<String>) {
    let mut last_good_since: Option<Instant> = Some(fault);
    let mut last_problem = None;
    while fault.elapsed() < window {
        match expected.check(client, namespace).await {
            Ok(None) => {
                last_good_since.get_or_insert_with(Instant::now);
            }
            Ok(Some(problem)) => {
                last_good_since = None;
                last_problem = Some(problem);
            }
            Err(err) => last_problem = Some(format!("{err:#}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match last_good_since {
        Some(since) => (true, since.duration_since(fault).as_secs_f64(), None),
        None => (false, window.as_secs_f64(), last_problem),
    }
}

/// One row of the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub controller: String,
    pub spurious_deletions: usize,
    pub converged: bool,
    pub converge_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Writes `report.json` and `report.md` into `dir`.
pub fn write_report(dir: &Path, rows: &[Row], notes: &BTreeMap<String, String>) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::json!({ "scenarios": rows });
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(dir.join("report.md"), markdown(rows, notes))?;
    Ok(())
}

/// The markdown table: one line per scenario, both controllers side by side.
pub fn markdown(rows: &[Row], notes: &BTreeMap<String, String>) -> String {
    let mut out = String::from(
        "| scenario | endpoints-guard: spurious deletions | converged (s) | kube-controller-manager: spurious deletions | converged (s) | did it bite upstream? |\n| --- | ---: | ---: | ---: | ---: | --- |\n",
    );
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    let cell = |row: Option<&Row>| match row {
        Some(r) => (
            r.spurious_deletions.to_string(),
            if r.converged {
                format!("yes ({:.1})", r.converge_seconds)
            } else {
                format!("**no** (>{:.0})", r.converge_seconds)
            },
        ),
        None => ("–".into(), "–".into()),
    };
    for name in names {
        let find = |c: &str| rows.iter().find(|r| r.name == name && r.controller == c);
        let (gs, gc) = cell(find("endpoints-guard"));
        let (ks, kc) = cell(find("kube-controller-manager"));
        let note = notes.get(name).cloned().unwrap_or_default();
        out.push_str(&format!(
            "| {name} | {gs} | {gc} | {ks} | {kc} | {note} |\n"
        ));
    }
    out
}
