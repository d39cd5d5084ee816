//! Helpers for the watch-chaos scenario matrix: run the proxy, drive its
//! control API, watch Endpoints and Services *directly* (not through the
//! proxy) to count spurious Endpoints deletions, and check convergence.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::ControlPlane;
use crate::process::{Process, free_ports};

/// A running `watch-chaos` binary in front of a control plane.
pub struct ChaosProxy {
    pub process: Process,
    pub proxy_port: u16,
    pub control_port: u16,
    /// A kubeconfig whose server is the proxy.
    pub kubeconfig: PathBuf,
}

impl ChaosProxy {
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
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            process.ensure_running()?;
            if http_json(control_port, "GET", "/healthz", None)
                .await
                .is_ok()
                && kubeconfig.exists()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("{name} did not start: {}", process.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

/// A small HTTP/1.0 JSON request on loopback.
pub async fn http_json(port: u16, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if code != 200 {
        bail!("{method} {path}: {code} {text}");
    }
    serde_json::from_str(text).with_context(|| format!("{method} {path}: not JSON: {text}"))
}

#[derive(Debug, Clone)]
struct Seen {
    kind: &'static str,
    key: String,
    rv: u64,
    /// Learnt from a relist rather than an event (time only known roughly).
    relisted: bool,
}

/// Watches Services and Endpoints of one namespace directly against
/// kube-apiserver and records every change with its resourceVersion.
pub struct Observer {
    services: Arc<Mutex<Vec<Seen>>>,
    endpoints: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn rv_of<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

async fn observe<K>(api: Api<K>, log: Arc<Mutex<Vec<Seen>>>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    // name → uid of what is live as far as we know.
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    let mut first = true;
    loop {
        let Ok(list) = api.list(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let list_rv: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let now: BTreeMap<String, String> = list
            .items
            .iter()
            .map(|o| (o.name_any(), o.uid().unwrap_or_default()))
            .collect();
        {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            for (name, uid) in &live {
                if now.get(name) != Some(uid) && !first {
                    log.push(Seen {
                        kind: "DELETED",
                        key: name.clone(),
                        rv: list_rv,
                        relisted: true,
                    });
                }
            }
            for (name, uid) in &now {
                if live.get(name) != Some(uid) {
                    let rv = if first { 0 } else { list_rv };
                    log.push(Seen {
                        kind: "ADDED",
                        key: name.clone(),
                        rv,
                        relisted: !first,
                    });
                }
            }
        }
        first = false;
        live = now;
        let mut rv = list_rv.to_string();
        loop {
            let params = WatchParams::default().timeout(290);
            let Ok(stream) = api.watch(&params, &rv).await else {
                break;
            };
            let mut stream = stream.boxed();
            let mut relist = false;
            while let Ok(Some(event)) = stream.try_next().await {
                let (kind, obj) = match event {
                    WatchEvent::Added(o) => ("ADDED", o),
                    WatchEvent::Modified(o) => ("MODIFIED", o),
                    WatchEvent::Deleted(o) => ("DELETED", o),
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(_) => {
                        relist = true;
                        break;
                    }
                };
                rv = obj.resource_version().unwrap_or_default();
                let name = obj.name_any();
                match kind {
                    "DELETED" => {
                        live.remove(&name);
                    }
                    _ => {
                        live.insert(name.clone(), obj.uid().unwrap_or_default());
                    }
                }
                if kind != "MODIFIED" {
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
                        kind,
                        key: name,
                        rv: rv_of(&obj),
                        relisted: false,
                    });
                }
            }
            if relist {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Observer {
    /// Starts watching `namespace` through `client` (a direct client).
    pub fn start(client: &Client, namespace: &str) -> Self {
        let services = Arc::new(Mutex::new(Vec::new()));
        let endpoints = Arc::new(Mutex::new(Vec::new()));
        let tasks = vec![
            tokio::spawn(observe(
                Api::<Service>::namespaced(client.clone(), namespace),
                services.clone(),
            )),
            tokio::spawn(observe(
                Api::<Endpoints>::namespaced(client.clone(), namespace),
                endpoints.clone(),
            )),
        ];
        Self {
            services,
            endpoints,
            tasks,
        }
    }

    /// Endpoints DELETEs (seen as events, or as a changed UID after a relist)
    /// at a resourceVersion at which their Service existed.
    pub fn spurious_deletions(&self) -> Vec<String> {
        let services = self
            .services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let endpoints = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        endpoints
            .iter()
            .filter(|e| e.kind == "DELETED")
            .filter(|e| service_alive_at(&services, &e.key, e.rv))
            .map(|e| {
                format!(
                    "{} at rv {}{}",
                    e.key,
                    e.rv,
                    if e.relisted { " (found by relist)" } else { "" }
                )
            })
            .collect()
    }

    /// Whether the watches have seen anything yet (both listed).
    pub fn endpoints_seen(&self) -> usize {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// The Service `name` existed at `rv`: its last ADDED/DELETED before `rv` was
/// an ADDED. (Events of one etcd share one revision order.)
fn service_alive_at(services: &[Seen], name: &str, rv: u64) -> bool {
    let mut alive = false;
    let mut events: Vec<&Seen> = services
        .iter()
        .filter(|s| s.key == name && s.rv < rv)
        .collect();
    events.sort_by_key(|s| s.rv);
    for s in events {
        alive = s.kind == "ADDED";
    }
    alive
}

/// What the Endpoints of one namespace should be: Service → ready IPs, and
/// names that must have no Endpoints.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    pub ready: BTreeMap<String, BTreeSet<String>>,
    pub absent: BTreeSet<String>,
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

    /// `Ok(None)` when the namespace matches, else what differs.
    pub async fn check(&self, client: &Client, namespace: &str) -> Result<Option<String>> {
        let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
        let all = api.list(&ListParams::default()).await?;
        let got: BTreeMap<String, BTreeSet<String>> = all
            .items
            .iter()
            .map(|ep| (ep.name_any(), crate::ready_ips(ep).into_iter().collect()))
            .collect();
        let mut wrong = Vec::new();
        for (name, ips) in &self.ready {
            match got.get(name) {
                None => wrong.push(format!("{name}: no Endpoints")),
                Some(have) if have != ips => wrong.push(format!("{name}: {have:?} != {ips:?}")),
                _ => {}
            }
        }
        for name in &self.absent {
            if got.contains_key(name) {
                wrong.push(format!("{name}: Endpoints of a deleted Service remain"));
            }
        }
        Ok((!wrong.is_empty()).then(|| wrong.join("; ")))
    }
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
