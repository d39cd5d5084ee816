//! One-line setups the scenario tests share.

use anyhow::Result;

use crate::{ControlPlane, PodBuilder, PodStatusSpec, ServiceBuilder};

impl ControlPlane {
    /// Service `name` in `namespace`, selecting `app: <name>`, port `http`
    /// 80 → 8080/TCP.
    pub async fn simple_service(&self, namespace: &str, name: &str) -> Result<()> {
        self.create_service(
            ServiceBuilder::new(namespace, name)
                .selector("app", name)
                .port("http", 80, 8080, "TCP"),
        )
        .await
        .map(drop)
    }

    /// A serving pod `name` labelled `app: <app>`, running at `ip`, ready or not.
    pub async fn running_pod(
        &self,
        namespace: &str,
        name: &str,
        app: &str,
        ip: &str,
        ready: bool,
    ) -> Result<()> {
        self.create_pod_with_status(
            PodBuilder::serving(namespace, name, app),
            PodStatusSpec::running([ip], ready),
        )
        .await
        .map(drop)
    }

    /// [`simple_service`](Self::simple_service) `name` with one ready pod,
    /// `<name>-0` at `ip`.
    pub async fn service_with_pod(&self, namespace: &str, name: &str, ip: &str) -> Result<()> {
        self.simple_service(namespace, name).await?;
        self.running_pod(namespace, &format!("{name}-0"), name, ip, true)
            .await
    }

    /// Writes pod `name`'s status: running at `ip`, ready or not.
    pub async fn set_pod_ready(
        &self,
        namespace: &str,
        name: &str,
        ip: &str,
        ready: bool,
    ) -> Result<()> {
        self.set_pod_status(namespace, name, PodStatusSpec::running([ip], ready))
            .await
            .map(drop)
    }
}
