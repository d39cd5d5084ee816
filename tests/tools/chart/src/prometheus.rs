//! Prometheus in the tests and the demo: the chart's monitoring objects as
//! `helm template` renders them (the alert rules, the job label a
//! ServiceMonitor gives the scrapes, the Grafana dashboard), and a real
//! Prometheus process that scrapes static targets standing in for the
//! ServiceMonitor and evaluates those rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use eg_harness::binaries::{program, workspace_root};
use eg_harness::loopback::{self, form_value};
use eg_harness::process::{Process, free_port};

/// The release name and namespace the chart is rendered with, as in `deploy/`.
pub const RELEASE: &str = "endpoints-guard";
pub const NAMESPACE: &str = "endpoints-guard";

/// The monitoring objects of the chart, rendered.
#[derive(Debug, Clone)]
pub struct ChartMonitoring {
    /// The PrometheusRule's `spec`: a Prometheus rule file.
    pub rules: String,
    /// The metrics Service's name: the `job` label a ServiceMonitor gives.
    pub job: String,
    /// The namespace the scrapes are labelled with.
    pub namespace: String,
    /// The Grafana dashboard.
    pub dashboard: Value,
}

/// Renders the chart's PrometheusRule, metrics Service and dashboard with
/// `helm template` (release and namespace `endpoints-guard`), `sets` given as
/// `--set` values.
pub fn render_chart_monitoring(sets: &[&str]) -> Result<ChartMonitoring> {
    let chart = workspace_root()?.join("charts/endpoints-guard");
    let mut cmd = Command::new(program("helm")?);
    cmd.args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE])
        .args([
            "--set",
            "prometheusRule.enabled=true,grafanaDashboard.enabled=true",
        ]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    for template in ["prometheusrule", "service", "dashboard"] {
        cmd.args(["--show-only", &format!("templates/{template}.yaml")]);
    }
    let out = cmd.output().context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let mut docs = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)?;
        if let Some(kind) = value["kind"].as_str() {
            docs.insert(kind.to_string(), value);
        }
    }
    let doc = |kind: &str| {
        docs.get(kind)
            .with_context(|| format!("helm template rendered no {kind}"))
    };
    let rule = doc("PrometheusRule")?;
    let service = doc("Service")?;
    let dashboard = doc("ConfigMap")?["data"]["endpoints-guard.json"]
        .as_str()
        .context("no dashboard JSON in the ConfigMap")?;
    Ok(ChartMonitoring {
        rules: serde_yaml::to_string(&rule["spec"])?,
        job: service["metadata"]["name"]
            .as_str()
            .context("metrics Service without a name")?
            .to_string(),
        namespace: service["metadata"]["namespace"]
            .as_str()
            .context("metrics Service without a namespace")?
            .to_string(),
        dashboard: serde_json::from_str(dashboard).context("parsing the dashboard")?,
    })
}

/// The names of the alerts in a rule file.
pub fn alert_names(rules: &str) -> Result<Vec<String>> {
    let parsed: serde_yaml::Value = serde_yaml::from_str(rules)?;
    Ok(parsed["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect())
}

/// A scrape target: `host:port` and the labels its series get.
#[derive(Debug, Clone)]
pub struct Target {
    pub address: String,
    pub labels: BTreeMap<String, String>,
}

impl Target {
    /// endpoints-guard's metrics at `address`, labelled as the chart's
    /// ServiceMonitor labels a pod's scrapes (`namespace`, `service`, `pod`,
    /// `endpoint`; the job is the scrape config's).
    pub fn endpoints_guard(monitoring: &ChartMonitoring, address: String, pod: &str) -> Self {
        let labels = [
            ("namespace", monitoring.namespace.as_str()),
            ("service", monitoring.job.as_str()),
            ("endpoint", "metrics"),
            ("pod", pod),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Self { address, labels }
    }
}

/// How a scrape job reaches its targets.
#[derive(Debug, Clone, Default)]
pub enum Scheme {
    /// Plain HTTP, no credentials.
    #[default]
    Http,
    /// HTTPS, the server's certificate checked against `ca_file` (for
    /// `server_name`, or the target's host when empty), with the bearer token
    /// in `token_file` if given.
    Https {
        ca_file: PathBuf,
        server_name: String,
        token_file: Option<PathBuf>,
    },
}

/// One scrape job.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub targets: Vec<Target>,
    pub scheme: Scheme,
}

impl Job {
    fn config(&self) -> Value {
        let static_configs: Vec<Value> = self
            .targets
            .iter()
            .map(|t| json!({"targets": [t.address], "labels": t.labels}))
            .collect();
        let mut job = json!({"job_name": self.name, "static_configs": static_configs});
        if let Scheme::Https {
            ca_file,
            server_name,
            token_file,
        } = &self.scheme
        {
            job["scheme"] = json!("https");
            job["tls_config"] = json!({"ca_file": ca_file});
            if !server_name.is_empty() {
                job["tls_config"]["server_name"] = json!(server_name);
            }
            if let Some(token) = token_file {
                job["authorization"] = json!({"type": "Bearer", "credentials_file": token});
            }
        }
        job
    }
}

/// A running Prometheus; killed when dropped.
pub struct Prometheus {
    pub process: Process,
    pub port: u16,
}

impl Prometheus {
    /// Starts `binary` in `dir` with one scrape job `job` over `targets` and
    /// the rule file `rules`; scrapes and evaluates every `interval`. Waits
    /// until Prometheus is ready.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        job: &str,
        targets: &[Target],
        rules: &str,
        interval: &str,
    ) -> Result<Self> {
        let job = Job {
            name: job.to_string(),
            targets: targets.to_vec(),
            scheme: Scheme::Http,
        };
        Self::start_jobs(binary, dir, &[job], rules, interval).await
    }

    /// Starts `binary` in `dir` with the scrape `jobs` and the rule file
    /// `rules`; scrapes and evaluates every `interval`. Waits until
    /// Prometheus is ready.
    pub async fn start_jobs(
        binary: &Path,
        dir: &Path,
        jobs: &[Job],
        rules: &str,
        interval: &str,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let rules_file = dir.join("rules.yaml");
        std::fs::write(&rules_file, rules)?;
        let scrape_configs: Vec<Value> = jobs.iter().map(Job::config).collect();
        let config = json!({
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [rules_file],
            "scrape_configs": scrape_configs,
        });
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, serde_yaml::to_string(&config)?)?;
        let port = free_port()?;
        let args = vec![
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ];
        let mut process = Process::spawn("prometheus", binary, &args, &dir.join("prometheus.log"))?;
        process
            .wait_until(
                Duration::from_secs(60),
                Duration::from_millis(200),
                || async {
                    match loopback::request(port, "GET", "/-/ready", "text/plain", "").await? {
                        (200, _) => Ok(()),
                        (code, body) => bail!("/-/ready: {code} {body}"),
                    }
                },
            )
            .await?;
        Ok(Self { process, port })
    }

    /// Prometheus in `dir` scraping one endpoints-guard at 127.0.0.1:`port`
    /// (as pod `pod`) the way the chart's ServiceMonitor would, with the
    /// chart's rules, every second; returns once a scrape succeeded.
    pub async fn scraping_endpoints_guard(
        binary: &Path,
        dir: &Path,
        monitoring: &ChartMonitoring,
        port: u16,
        pod: &str,
    ) -> Result<Self> {
        Self::scraping_endpoints_guard_with(binary, dir, monitoring, port, pod, Scheme::Http, &[])
            .await
    }

    /// [`Prometheus::scraping_endpoints_guard`] with the chart's job reaching
    /// endpoints-guard by `scheme`, and `more` jobs beside it.
    pub async fn scraping_endpoints_guard_with(
        binary: &Path,
        dir: &Path,
        monitoring: &ChartMonitoring,
        port: u16,
        pod: &str,
        scheme: Scheme,
        more: &[Job],
    ) -> Result<Self> {
        let target = Target::endpoints_guard(monitoring, format!("127.0.0.1:{port}"), pod);
        let mut jobs = vec![Job {
            name: monitoring.job.clone(),
            targets: vec![target],
            scheme,
        }];
        jobs.extend(more.iter().cloned());
        let prometheus = Self::start_jobs(binary, dir, &jobs, &monitoring.rules, "1s").await?;
        let up = format!("up{{job=\"{}\"}} == 1", monitoring.job);
        let deadline = Instant::now() + Duration::from_secs(30);
        while prometheus
            .query(&up)
            .await?
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            if Instant::now() > deadline {
                bail!(
                    "Prometheus did not scrape endpoints-guard: {}",
                    prometheus.process.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(prometheus)
    }

    /// The `prometheus` binary of the control-plane folder.
    pub fn binary() -> Result<PathBuf> {
        program("prometheus")
    }

    /// `data` of an API answer whose status is "success": a GET, or with a
    /// form a POST.
    async fn api(&self, path: &str, form: &str) -> Result<Value> {
        let (method, content_type) = match form {
            "" => ("GET", "text/plain"),
            _ => ("POST", "application/x-www-form-urlencoded"),
        };
        let answer = loopback::json(self.port, method, path, content_type, form).await?;
        if answer["status"] != "success" {
            bail!("{path} {form}: {answer}");
        }
        Ok(answer["data"].clone())
    }

    /// An instant query: its result (a vector's series, or a scalar).
    pub async fn query(&self, expr: &str) -> Result<Value> {
        let data = self
            .api("/api/v1/query", &format!("query={}", form_value(expr)))
            .await
            .with_context(|| format!("query {expr}"))?;
        Ok(data["result"].clone())
    }

    /// The active scrape targets, as `/api/v1/targets` reports them (each with
    /// `labels`, `scrapePool`, `health` and `lastError`).
    pub async fn targets(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/targets?state=active", "").await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The alerts Prometheus holds now (pending and firing).
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts", "").await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The names of the alerting rules Prometheus loaded.
    pub async fn alerting_rules(&self) -> Result<Vec<String>> {
        let data = self.api("/api/v1/rules?type=alert", "").await?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect())
    }

    /// The alerts named `name` in `state` whose labels include `labels`.
    pub async fn alerts_matching(
        &self,
        name: &str,
        state: &str,
        labels: &[(&str, &str)],
    ) -> Result<Vec<Value>> {
        Ok(self
            .alerts()
            .await?
            .into_iter()
            .filter(|a| {
                a["labels"]["alertname"] == name
                    && a["state"] == state
                    && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
            })
            .collect())
    }

    /// Waits until an alert `name` whose labels include `labels` is firing;
    /// returns it as `/api/v1/alerts` reports it.
    pub async fn wait_for_firing(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(alert) = self
                .alerts_matching(name, "firing", labels)
                .await?
                .into_iter()
                .next()
            {
                return Ok(alert);
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} {labels:?} did not fire within {timeout:?}; alerts: {}",
                    Value::Array(self.alerts().await.unwrap_or_default())
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
