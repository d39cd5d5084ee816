//! What the opt-in subcommands read of one Service: the Service, its
//! EndpointSlices and Endpoints, who publishes which ready addresses, and
//! where its opt-in stands, by the same rules the controller follows
//! ([`crate::desired::scope::handling`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::desired::scope::{self, Handling, Invalid, OptIn, OptInState, Scope};
use crate::desired::slices::{self, LABEL_SERVICE_NAME, UPSTREAM_SLICE_MANAGER};
use crate::desired::{LABEL_MANAGED_BY, MANAGER};
use crate::error::{Error, Result};
pub use crate::settings::ServiceName;

/// Where a Service's opt-in stands, as far as its objects tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not opted in, and nothing of endpoints-guard's left for it.
    NotOptedIn,
    State(OptInState),
    Frozen(Invalid),
    /// Label, annotation and selector gone: endpoints-guard removes what
    /// is left of its own.
    Abandoned,
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Standing::NotOptedIn => f.write_str("not_opted_in"),
            Standing::State(state) => f.write_str(state.metric_label()),
            Standing::Frozen(why) => write!(f, "frozen ({})", why.metric_label()),
            Standing::Abandoned => f.write_str("abandoned"),
        }
    }
}

/// One Service and what is published for it.
#[derive(Debug, Clone)]
pub struct ServiceView {
    pub name: ServiceName,
    pub service: Service,
    pub slices: Vec<EndpointSlice>,
    pub endpoints: Option<Endpoints>,
}

impl ServiceView {
    /// Reads the Service, its slices and its Endpoints.
    pub async fn read(client: &Client, name: &ServiceName) -> Result<ServiceView> {
        let services: Api<Service> = Api::namespaced(client.clone(), &name.namespace);
        let service = services
            .get_opt(&name.name)
            .await
            .map_err(|e| Error::kube("reading the Service", name.to_string(), e))?
            .ok_or_else(|| Error::Config(format!("Service {name} not found")))?;
        Self::of(client, service).await
    }

    /// What is published for `service`.
    pub async fn of(client: &Client, service: Service) -> Result<ServiceView> {
        let name = ServiceName {
            namespace: service.metadata.namespace.clone().unwrap_or_default(),
            name: service.metadata.name.clone().unwrap_or_default(),
        };
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &name.namespace);
        let listed = slices
            .list(&ListParams::default().labels(&format!("{LABEL_SERVICE_NAME}={}", name.name)))
            .await
            .map_err(|e| {
                Error::kube("listing the Service's EndpointSlices", name.to_string(), e)
            })?;
        let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &name.namespace);
        let endpoints = endpoints
            .get_opt(&name.name)
            .await
            .map_err(|e| Error::kube("reading the Service's Endpoints", name.to_string(), e))?;
        Ok(ServiceView {
            name,
            service,
            slices: listed.items,
            endpoints,
        })
    }

    /// The slices whose managed-by is `manager`.
    pub fn slices_of(&self, manager: &str) -> Vec<EndpointSlice> {
        self.slices
            .iter()
            .filter(|s| slices::slice_manager(s) == Some(manager))
            .cloned()
            .collect()
    }

    /// The ready addresses the slices of `manager` publish.
    pub fn ready_of(&self, manager: &str) -> BTreeSet<String> {
        slices::ready_addresses(&self.slices_of(manager))
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Ready addresses by the managed-by value of the slices publishing
    /// them (`(none)` for an unlabelled slice).
    pub fn publishers(&self) -> BTreeMap<String, usize> {
        let mut by_manager: BTreeMap<String, usize> = BTreeMap::new();
        for slice in &self.slices {
            let manager = slices::slice_manager(slice).unwrap_or("(none)").to_string();
            let ready = slices::ready_addresses(std::slice::from_ref(slice)).len();
            *by_manager.entry(manager).or_default() += ready;
        }
        by_manager
    }

    /// Whether endpoints-guard has a slice for the Service.
    pub fn ours_exist(&self) -> bool {
        !self.slices_of(MANAGER).is_empty() || self.endpoints_manager().as_deref() == Some(MANAGER)
    }

    /// Whether kube-controller-manager has a slice for the Service.
    pub fn upstream_slices_exist(&self) -> bool {
        !self.slices_of(UPSTREAM_SLICE_MANAGER).is_empty()
    }

    /// The managed-by value of the Endpoints.
    pub fn endpoints_manager(&self) -> Option<String> {
        self.endpoints
            .as_ref()?
            .metadata
            .labels
            .as_ref()?
            .get(LABEL_MANAGED_BY)
            .cloned()
    }

    /// Whether the Service carries any part of an opt-in.
    pub fn is_marked(&self) -> bool {
        OptIn::of(&self.service).is_marked()
    }

    /// Where the Service's opt-in stands.
    pub fn standing(&self) -> Standing {
        let opt_in = OptIn::of(&self.service);
        match scope::handling(Scope::OptIn, &self.service, &opt_in) {
            Handling::Managed(managed) => {
                managed.opt_in.map_or(Standing::NotOptedIn, Standing::State)
            }
            Handling::Frozen(why) => Standing::Frozen(why),
            Handling::OptedOut(_) if self.ours_exist() => Standing::State(OptInState::OptingOut),
            Handling::Abandoned if self.ours_exist() => Standing::Abandoned,
            Handling::OptedOut(_) | Handling::Abandoned | Handling::NotHandled => {
                Standing::NotOptedIn
            }
        }
    }

    /// The selector the opt-in annotation holds, if usable.
    pub fn annotated_selector(&self) -> Option<BTreeMap<String, String>> {
        let text = self
            .service
            .metadata
            .annotations
            .as_ref()?
            .get(scope::ANNOTATION_SELECTOR)?;
        scope::parse_selector(text).ok()
    }

    /// The Service's `spec.selector`, if it has one.
    pub fn spec_selector(&self) -> Option<&BTreeMap<String, String>> {
        scope::spec_selector(&self.service)
    }

    /// The Service's resourceVersion, the precondition of its patches.
    pub fn resource_version(&self) -> String {
        self.service
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default()
    }
}
