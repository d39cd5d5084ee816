//! Namespaces, Services and pods for tests. No kubelet or scheduler runs:
//! a pod's status is whatever a test writes through the status subresource.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::ControlPlane;

/// The image of every container a [`PodBuilder`] makes; nothing pulls it.
pub const PLACEHOLDER_IMAGE: &str = "eg-test.invalid/placeholder:never-pulled";
/// The name of the main container.
pub const APP_CONTAINER: &str = "app";
/// The name of the native sidecar (restartable init container).
pub const SIDECAR_CONTAINER: &str = "sidecar";

/// Builds a pod: `PodBuilder::new(ns, name).label(k, v).container_port(..)`,
/// then [`ControlPlane::create_pod`].
#[derive(Debug, Clone)]
pub struct PodBuilder {
    pod: Pod,
}

impl PodBuilder {
    /// A pod with one container, `app`, and no ports.
    pub fn new(namespace: &str, name: &str) -> Self {
        let pod = Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![container(APP_CONTAINER)],
                ..PodSpec::default()
            }),
            status: None,
        };
        Self { pod }
    }

    /// The pod most tests need: label `app`, container port `http` 8080/TCP,
    /// scheduled on `node-a` (a pod with an IP is always on a node).
    pub fn serving(namespace: &str, name: &str, app: &str) -> Self {
        Self::new(namespace, name)
            .label("app", app)
            .container_port("http", 8080, "TCP")
            .node_name("node-a")
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a port to the `app` container; an empty `name` leaves it unnamed.
    /// `protocol` is `TCP`, `UDP` or `SCTP`.
    pub fn container_port(self, name: &str, port: i32, protocol: &str) -> Self {
        self.container_port_in(APP_CONTAINER, name, port, protocol)
    }

    /// Adds a port to the regular container `container`, adding that
    /// container if the pod has none of that name.
    pub fn container_port_in(
        mut self,
        container: &str,
        name: &str,
        port: i32,
        protocol: &str,
    ) -> Self {
        let containers = &mut self.spec_mut().containers;
        add_port(containers, container, None, name, port, protocol);
        self
    }

    /// Adds a port to the native sidecar `sidecar`: an init container with
    /// `restartPolicy: Always`, whose named ports Services can target.
    pub fn sidecar_port(mut self, name: &str, port: i32, protocol: &str) -> Self {
        let init = self.spec_mut().init_containers.get_or_insert_with(Vec::new);
        add_port(
            init,
            SIDECAR_CONTAINER,
            Some("Always"),
            name,
            port,
            protocol,
        );
        self
    }

    /// Sets `spec.hostname`.
    pub fn hostname(mut self, hostname: &str) -> Self {
        self.spec_mut().hostname = Some(hostname.to_string());
        self
    }

    /// Sets `spec.subdomain`.
    pub fn subdomain(mut self, subdomain: &str) -> Self {
        self.spec_mut().subdomain = Some(subdomain.to_string());
        self
    }

    /// Sets `spec.nodeName`, as if a scheduler had bound the pod. No Node
    /// object is needed. A pod on a node is deleted gracefully: it keeps a
    /// deletionTimestamp until someone force-deletes it, since no kubelet
    /// runs here.
    pub fn node_name(mut self, node: &str) -> Self {
        self.spec_mut().node_name = Some(node.to_string());
        self
    }

    /// Any other change to the spec.
    pub fn spec(mut self, tweak: impl FnOnce(&mut PodSpec)) -> Self {
        tweak(self.spec_mut());
        self
    }

    /// The pod as it will be created.
    pub fn build(self) -> Pod {
        self.pod
    }

    fn spec_mut(&mut self) -> &mut PodSpec {
        self.pod.spec.get_or_insert_with(PodSpec::default)
    }
}

fn container(name: &str) -> Container {
    Container {
        name: name.to_string(),
        image: Some(PLACEHOLDER_IMAGE.to_string()),
        ..Container::default()
    }
}

fn add_port(
    containers: &mut Vec<Container>,
    container_name: &str,
    restart_policy: Option<&str>,
    name: &str,
    port: i32,
    protocol: &str,
) {
    let index = match containers.iter().position(|c| c.name == container_name) {
        Some(index) => index,
        None => {
            let mut new = container(container_name);
            new.restart_policy = restart_policy.map(str::to_string);
            containers.push(new);
            containers.len() - 1
        }
    };
    containers[index]
        .ports
        .get_or_insert_with(Vec::new)
        .push(ContainerPort {
            name: (!name.is_empty()).then(|| name.to_string()),
            container_port: port,
            protocol: Some(protocol.to_string()),
            ..ContainerPort::default()
        });
}

/// What [`ControlPlane::set_pod_status`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatusSpec {
    /// `status.podIPs` (the first is also `status.podIP`); at most one per
    /// family. Empty clears them.
    pub ips: Vec<String>,
    /// The `Ready` and `ContainersReady` conditions.
    pub ready: bool,
    /// `status.phase`: `Pending`, `Running`, `Succeeded`, `Failed`.
    pub phase: String,
}

impl PodStatusSpec {
    /// Running and Ready with these IPs.
    pub fn ready<S: Into<String>>(ips: impl IntoIterator<Item = S>) -> Self {
        Self {
            ips: ips.into_iter().map(Into::into).collect(),
            ready: true,
            phase: "Running".to_string(),
        }
    }

    /// Running with these IPs, Ready or not.
    pub fn running<S: Into<String>>(ips: impl IntoIterator<Item = S>, ready: bool) -> Self {
        Self {
            ready,
            ..Self::ready(ips)
        }
    }

    /// Running but not Ready, with these IPs.
    pub fn not_ready<S: Into<String>>(ips: impl IntoIterator<Item = S>) -> Self {
        Self::running(ips, false)
    }

    /// The same with another phase.
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = phase.to_string();
        self
    }

    fn apply(&self, status: &mut PodStatus, now: &Time) {
        status.phase = Some(self.phase.clone());
        status.pod_ip = self.ips.first().cloned();
        status.pod_ips = (!self.ips.is_empty())
            .then(|| self.ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
        status.start_time.get_or_insert_with(|| now.clone());
        let value = if self.ready { "True" } else { "False" };
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        for kind in ["Ready", "ContainersReady"] {
            match conditions.iter_mut().find(|c| c.type_ == kind) {
                Some(condition) => {
                    if condition.status != value {
                        condition.status = value.to_string();
                        condition.last_transition_time = Some(now.clone());
                    }
                }
                None => conditions.push(PodCondition {
                    type_: kind.to_string(),
                    status: value.to_string(),
                    last_transition_time: Some(now.clone()),
                    ..PodCondition::default()
                }),
            }
        }
    }
}

/// Builds a Service: `ServiceBuilder::new(ns, name).selector(k, v).port(..)`,
/// then [`ControlPlane::create_service`].
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    service: Service,
}

impl ServiceBuilder {
    /// A ClusterIP Service with no selector and no ports.
    pub fn new(namespace: &str, name: &str) -> Self {
        let service = Service {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec::default()),
            status: None,
        };
        Self { service }
    }

    /// Adds a selector term.
    pub fn selector(mut self, key: &str, value: &str) -> Self {
        self.spec_mut()
            .selector
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a label on the Service itself.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.service
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a port with a numeric target port; an empty `name` leaves it unnamed.
    pub fn port(self, name: &str, port: i32, target_port: i32, protocol: &str) -> Self {
        self.add_port(name, port, IntOrString::Int(target_port), protocol)
    }

    /// Adds a port whose target is a named container port.
    pub fn named_port(self, name: &str, port: i32, target_port: &str, protocol: &str) -> Self {
        self.add_port(
            name,
            port,
            IntOrString::String(target_port.to_string()),
            protocol,
        )
    }

    /// `clusterIP: None`.
    pub fn headless(mut self) -> Self {
        self.spec_mut().cluster_ip = Some("None".to_string());
        self
    }

    /// `ipFamilyPolicy: RequireDualStack`, IPv4 first.
    pub fn dual_stack(mut self) -> Self {
        let spec = self.spec_mut();
        spec.ip_family_policy = Some("RequireDualStack".to_string());
        spec.ip_families = Some(vec!["IPv4".to_string(), "IPv6".to_string()]);
        self
    }

    /// `publishNotReadyAddresses: true`.
    pub fn publish_not_ready_addresses(mut self) -> Self {
        self.spec_mut().publish_not_ready_addresses = Some(true);
        self
    }

    /// Any other change to the spec.
    pub fn spec(mut self, tweak: impl FnOnce(&mut ServiceSpec)) -> Self {
        tweak(self.spec_mut());
        self
    }

    /// The Service as it will be created.
    pub fn build(self) -> Service {
        self.service
    }

    fn add_port(mut self, name: &str, port: i32, target: IntOrString, protocol: &str) -> Self {
        self.spec_mut()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.to_string()),
                port,
                target_port: Some(target),
                protocol: Some(protocol.to_string()),
                ..ServicePort::default()
            });
        self
    }

    fn spec_mut(&mut self) -> &mut ServiceSpec {
        self.service.spec.get_or_insert_with(ServiceSpec::default)
    }
}

/// The ready addresses of an Endpoints object, sorted: what most end-to-end
/// checks compare.
pub fn ready_ips(ep: &k8s_openapi::api::core::v1::Endpoints) -> Vec<String> {
    let mut ips: Vec<String> = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten())
        .map(|a| a.ip.clone())
        .collect();
    ips.sort();
    ips
}

impl ControlPlane {
    /// Creates a namespace.
    pub async fn create_namespace(&self, name: &str) -> Result<Namespace> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))
    }

    /// Creates the pod `builder` describes (its status stays empty: Pending
    /// with no IP until [`ControlPlane::set_pod_status`]).
    pub async fn create_pod(&self, builder: PodBuilder) -> Result<Pod> {
        let pod = builder.build();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        Api::<Pod>::namespaced(self.client(), &namespace)
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {namespace}/{name}"))
    }

    /// Creates the pod and writes its status, as a kubelet would once it runs.
    pub async fn create_pod_with_status(
        &self,
        builder: PodBuilder,
        status: PodStatusSpec,
    ) -> Result<Pod> {
        let pod = self.create_pod(builder).await?;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.set_pod_status(&namespace, &name, status).await
    }

    /// Writes the pod's phase, IPs and Ready/ContainersReady conditions
    /// through the status subresource, as a kubelet would; a condition's
    /// lastTransitionTime moves only when its status changes. Retries on
    /// conflicts. Returns the updated pod.
    pub async fn set_pod_status(
        &self,
        namespace: &str,
        name: &str,
        spec: PodStatusSpec,
    ) -> Result<Pod> {
        let pods = Api::<Pod>::namespaced(self.client(), namespace);
        let mut last = None;
        for _ in 0..5 {
            let mut pod = pods
                .get(name)
                .await
                .with_context(|| format!("reading pod {namespace}/{name}"))?;
            spec.apply(pod.status.get_or_insert_with(PodStatus::default), &now());
            match pods
                .replace_status(name, &PostParams::default(), &pod)
                .await
            {
                Ok(updated) => return Ok(updated),
                Err(kube::Error::Api(status)) if status.code == 409 => last = Some(status),
                Err(err) => {
                    return Err(anyhow!(err)
                        .context(format!("writing the status of pod {namespace}/{name}")));
                }
            }
        }
        Err(anyhow!(
            "writing the status of pod {namespace}/{name}: conflicts, last {last:?}"
        ))
    }

    /// Deletes a pod with a grace period. A pod with `spec.nodeName` set and
    /// `grace_seconds > 0` is not removed: it stays with deletionTimestamp set
    /// (Terminating) because no kubelet runs to finish it; that pod is
    /// returned. A pod on no node, or with grace 0, is gone at once (`None`).
    pub async fn delete_pod_gracefully(
        &self,
        namespace: &str,
        name: &str,
        grace_seconds: u32,
    ) -> Result<Option<Pod>> {
        let params = DeleteParams {
            grace_period_seconds: Some(grace_seconds),
            ..DeleteParams::default()
        };
        let deleted = Api::<Pod>::namespaced(self.client(), namespace)
            .delete(name, &params)
            .await
            .with_context(|| format!("deleting pod {namespace}/{name}"))?;
        Ok(deleted.left())
    }

    /// Deletes a pod at once (grace period 0), even a Terminating one.
    pub async fn force_delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.delete_pod_gracefully(namespace, name, 0)
            .await
            .map(drop)
    }

    /// Deletes a Service (its Endpoints go with it, by the controllers).
    pub async fn delete_service(&self, namespace: &str, name: &str) -> Result<()> {
        Api::<Service>::namespaced(self.client(), namespace)
            .delete(name, &DeleteParams::default())
            .await
            .map(drop)
            .with_context(|| format!("deleting service {namespace}/{name}"))
    }

    /// Creates the Service `builder` describes.
    pub async fn create_service(&self, builder: ServiceBuilder) -> Result<Service> {
        let service = builder.build();
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        let name = service.metadata.name.clone().unwrap_or_default();
        Api::<Service>::namespaced(self.client(), &namespace)
            .create(&PostParams::default(), &service)
            .await
            .with_context(|| format!("creating service {namespace}/{name}"))
    }
}

fn now() -> Time {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let timestamp = i64::try_from(seconds)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Time(timestamp)
}
