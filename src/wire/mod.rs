//! Decode targets for the hot watch paths: what the projections read of an
//! object, and nothing else.
//!
//! A Pod watch event is ~4 KB of JSON of which [`PodInfo`] keeps a few
//! fields; decoding it whole as `k8s_openapi`'s `Pod` builds every string of
//! its spec and status and, above all, a `serde_json::Value` tree of every
//! managedFields entry, only to drop them (docs/cpu-profile.md: 60% of the
//! CPU of a pod event). [`PodWire`] names only the fields [`PodInfo`] is made
//! of; the parser skips the rest without building it. Both go through the one
//! projection, [`PodInfo::from_source`].
//!
//! The difference from a whole decode is only in what is malformed: a pod
//! whose unread fields have the wrong JSON type decodes here, where a whole
//! decode would skip it as undecodable. Such a pod cannot come from
//! kube-apiserver, which validates what it stores.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, Endpoints, Pod, PodCondition, PodIP};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::desired::spec_and_status_accessors;
use crate::desired::{ContainerView, PodInfo, PodSource};

/// A wire type stands for the API object `$of` (same URL, kind and
/// metadata), so the watcher and `Api` treat it as that object.
macro_rules! wire_of {
    ($wire:ty, $of:ty) => {
        impl k8s_openapi::Resource for $wire {
            const API_VERSION: &'static str = <$of as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$of as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$of as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$of as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str = <$of as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$of as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $wire {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A Pod as the watch decodes it: the fields [`PodInfo`] is made of.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodWire {
    #[serde(default, deserialize_with = "slim_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<SpecWire>,
    #[serde(default)]
    status: Option<StatusWire>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWire {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
}

/// The metadata fields a projection reads, as an `ObjectMeta` (the rest,
/// managedFields first, skipped unbuilt).
fn slim_meta<'de, D: Deserializer<'de>>(de: D) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<MetaWire>::deserialize(de)?.unwrap_or_default();
    Ok(ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels,
        deletion_timestamp: meta.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecWire {
    #[serde(default)]
    containers: Option<Vec<ContainerWire>>,
    #[serde(default)]
    init_containers: Option<Vec<ContainerWire>>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    subdomain: Option<String>,
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerWire {
    #[serde(default)]
    ports: Option<Vec<ContainerPort>>,
    #[serde(default)]
    restart_policy: Option<String>,
}

impl ContainerWire {
    fn view(&self) -> ContainerView<'_> {
        ContainerView {
            ports: self.ports.as_deref().unwrap_or_default(),
            restart_policy: self.restart_policy.as_deref(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusWire {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Option<Vec<PodIP>>,
    #[serde(default)]
    conditions: Option<Vec<PodCondition>>,
}

impl PodWire {
    /// The cached projection ([`PodInfo::from_source`]).
    pub fn project(self) -> Option<PodInfo> {
        PodInfo::from_source(&self)
    }
}

impl PodSource for PodWire {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn containers(&self) -> impl Iterator<Item = ContainerView<'_>> {
        self.spec
            .iter()
            .flat_map(|s| s.containers.iter().flatten().map(ContainerWire::view))
    }
    fn init_containers(&self) -> impl Iterator<Item = ContainerView<'_>> {
        self.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().map(ContainerWire::view))
    }
    spec_and_status_accessors!();
}

wire_of!(PodWire, Pod);

/// Endpoints as the watch and our writes decode them: the metadata, and the
/// subsets left as JSON text for the cache to keep
/// (`CachedEndpoints::from_wire`): decoding every address only to encode it
/// again was most of the CPU of an Endpoints event.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EndpointsWire {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub subsets: Option<Box<RawValue>>,
}

wire_of!(EndpointsWire, Endpoints);

/// `ObjectMeta` less its managedFields, which the cache drops anyway
/// (`PackedObject`): every answer to our writes carries them, and decoding
/// them builds a `serde_json::Value` tree per entry only to free it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaLessManagedFields {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

fn meta_without_managed_fields<'de, D: Deserializer<'de>>(de: D) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<MetaLessManagedFields>::deserialize(de)?.unwrap_or_default();
    Ok(ObjectMeta {
        annotations: meta.annotations,
        creation_timestamp: meta.creation_timestamp,
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        deletion_timestamp: meta.deletion_timestamp,
        finalizers: meta.finalizers,
        generate_name: meta.generate_name,
        generation: meta.generation,
        labels: meta.labels,
        managed_fields: None,
        name: meta.name,
        namespace: meta.namespace,
        owner_references: meta.owner_references,
        resource_version: meta.resource_version,
        self_link: meta.self_link,
        uid: meta.uid,
    })
}

mod protobuf;

#[cfg(test)]
mod tests;
