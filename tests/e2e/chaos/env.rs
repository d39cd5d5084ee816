//! One row's environment: a fresh control plane, watch-chaos in front of it,
//! the controller under test behind the proxy, the independent observer.

use std::time::Duration;

use anyhow::{Context, Result};
use eg_chaos::{ChaosProxy, Expected, Observer, Published};
use eg_harness::{ControlPlane, ControlPlaneOptions, Process};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::NS;
use crate::common::Guard;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Guard,
    Kcm,
}

impl Which {
    pub fn name(self) -> &'static str {
        match self {
            Which::Guard => "endpoints-guard",
            Which::Kcm => "kube-controller-manager",
        }
    }
}

pub enum Controller {
    Guard(Guard),
    Kcm(Process),
}

pub struct Env {
    pub cp: ControlPlane,
    pub proxy: ChaosProxy,
    pub which: Which,
    /// Which of its two controllers runs: the one for Endpoints or for
    /// EndpointSlices.
    pub published: Published,
    pub controller: Option<Controller>,
    /// Extra kube-controller-manager flags.
    pub kcm_args: Vec<&'static str>,
    /// Extra endpoints-guard flags.
    pub guard_args: Vec<&'static str>,
    /// The independent watches that count spurious deletions.
    pub observer: Option<Observer>,
    /// A second API server on the same etcd, where a row starts one.
    pub second: Option<eg_harness::SecondApiserver>,
}

impl Env {
    pub async fn new(
        which: Which,
        published: Published,
        options: ControlPlaneOptions,
    ) -> Result<Self> {
        let cp = ControlPlane::start(options).await?;
        let proxy = ChaosProxy::in_front_of(&cp).await?;
        cp.create_namespace(NS).await?;
        if published == Published::EndpointSlices {
            // The scenarios' pods run on node-a; both EndpointSlice
            // controllers leave out pods on a Node that does not exist.
            let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}}))?;
            Api::<Node>::all(cp.client())
                .create(&PostParams::default(), &node)
                .await
                .context("creating Node node-a")?;
        }
        Ok(Self {
            cp,
            proxy,
            which,
            published,
            controller: None,
            kcm_args: Vec::new(),
            guard_args: Vec::new(),
            observer: None,
            second: None,
        })
    }

    /// The store is about to be restored from a backup: the observer pauses.
    pub fn observer_restoring(&mut self) {
        if let Some(observer) = &mut self.observer {
            observer.store_restoring();
        }
    }

    /// The store was restored from a backup: the observer starts a new epoch.
    pub fn observer_restored(&mut self) {
        if let Some(observer) = &mut self.observer {
            observer.store_restored();
        }
    }

    pub async fn start_controller(&mut self) -> Result<()> {
        self.controller = Some(match self.which {
            Which::Guard => {
                let mut args = vec!["--resync-interval", "10s"];
                if self.published == Published::EndpointSlices {
                    args.push("--controllers=endpointslices");
                }
                args.extend(self.guard_args.iter().copied());
                Controller::Guard(Guard::start(self.proxy.client().await?, &args).await?)
            }
            Which::Kcm => {
                let kubeconfig = format!("--kubeconfig={}", self.proxy.kubeconfig.display());
                // Its default wire, protobuf: watch-chaos answers on it.
                let mut args = vec![kubeconfig.as_str()];
                args.extend(self.kcm_args.iter().copied());
                // Upstream's slice controller leaves the slices of a deleted
                // Service to the garbage collector (owner references), which
                // runs beside it in every cluster.
                let controllers = match self.published {
                    Published::Endpoints => "endpoints-controller",
                    Published::EndpointSlices => {
                        "endpointslice-controller,garbage-collector-controller"
                    }
                };
                Controller::Kcm(self.cp.start_controller_manager(controllers, &args)?)
            }
        });
        Ok(())
    }

    pub async fn stop_controller(&mut self) {
        match self.controller.take() {
            Some(Controller::Guard(guard)) => guard.stop().await,
            Some(Controller::Kcm(mut kcm)) => {
                let _ = kcm.stop().await;
            }
            None => {}
        }
    }

    /// The guard's counters that tell what it found, for the row's log line.
    pub fn findings(&self) -> String {
        match &self.controller {
            Some(Controller::Guard(g)) => {
                let mut found: Vec<String> = ["store_rewinds_total", "ghosts_found_total"]
                    .iter()
                    .map(|name| {
                        let total: f64 = ["services", "pods", "endpoints"]
                            .iter()
                            .map(|r| {
                                g.metric(&format!("endpoints_guard_{name}{{resource=\"{r}\"}}"))
                            })
                            .sum();
                        format!("{name} {total}")
                    })
                    .collect();
                let held = g.metric("endpoints_guard_pod_deletions_held_total");
                found.push(format!("pod_deletions_held_total {held}"));
                found.join(", ")
            }
            _ => String::new(),
        }
    }

    pub fn prevented(&self) -> f64 {
        match &self.controller {
            Some(Controller::Guard(g)) => ["watch_delete", "missing_from_list", "not_in_cache"]
                .iter()
                .map(|r| {
                    g.metric(&format!(
                        "endpoints_guard_spurious_deletions_prevented_total{{reason=\"{r}\"}}"
                    ))
                })
                .sum(),
            _ => 0.0,
        }
    }

    pub async fn service(&self, name: &str) -> Result<()> {
        self.cp.simple_service(NS, name).await
    }

    pub async fn pod(&self, name: &str, app: &str, ip: &str, ready: bool) -> Result<()> {
        self.cp.running_pod(NS, name, app, ip, ready).await
    }

    pub async fn set_ready(&self, name: &str, ip: &str, ready: bool) -> Result<()> {
        self.cp.set_pod_ready(NS, name, ip, ready).await
    }

    pub async fn set_selector(&self, name: &str, app: &str) -> Result<()> {
        let patch = Patch::Merge(json!({"spec": {"selector": {"app": app}}}));
        Api::<Service>::namespaced(self.cp.client(), NS)
            .patch(name, &PatchParams::default(), &patch)
            .await
            .map(drop)
            .with_context(|| format!("patching service {name}"))
    }

    pub async fn delete_service(&self, name: &str) -> Result<()> {
        self.cp.delete_service(NS, name).await
    }

    /// Waits until the namespace matches `expected` (before a fault).
    pub async fn settle(&self, expected: &Expected) -> Result<()> {
        expected
            .clone()
            .read_from(self.published)
            .wait(
                &self.cp.client(),
                NS,
                Duration::from_secs(90),
                "the state before the fault",
            )
            .await?;
        // Let every watch catch up with the last writes.
        tokio::time::sleep(Duration::from_millis(700)).await;
        Ok(())
    }

    /// Service `name` with one ready pod `<name>-0` at `ip`.
    pub async fn service_with_pod(&self, name: &str, ip: &str) -> Result<()> {
        self.cp.service_with_pod(NS, name, ip).await
    }

    /// Services, each with one ready pod (`<name>-0` at its IP), and waits
    /// until their Endpoints say so: the state most faults start from.
    pub async fn services_settled(&self, services: &[(&str, &str)]) -> Result<Expected> {
        let mut expected = Expected::default();
        for (name, ip) in services {
            self.service_with_pod(name, ip).await?;
            expected = expected.service(name, &[ip]);
        }
        self.settle(&expected).await?;
        Ok(expected)
    }

    /// Create, delete and create again Service `b` (a new UID), then `c`:
    /// the history a replay brings back.
    pub async fn churn(&self) -> Result<Expected> {
        self.service_with_pod("b", "10.1.1.1").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.delete_service("b").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.service("b").await?;
        self.service_with_pod("c", "10.1.2.1").await?;
        Ok(Expected::default()
            .service("b", &["10.1.1.1"])
            .service("c", &["10.1.2.1"]))
    }
}
