//! How each cached kind is keyed, and what of it the cache keeps.

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::ResourceExt;

use crate::desired::PodInfo;
use crate::watch::{Cached, ObjectKey};

fn key_of<K: kube::Resource>(obj: &K) -> ObjectKey {
    ObjectKey {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

fn meta_str(field: &Option<String>) -> &str {
    field.as_deref().unwrap_or("")
}

impl Cached for Service {
    fn key(&self) -> ObjectKey {
        key_of(self)
    }
    fn uid(&self) -> &str {
        meta_str(&self.metadata.uid)
    }
    fn resource_version(&self) -> &str {
        meta_str(&self.metadata.resource_version)
    }
}

impl Cached for Endpoints {
    fn key(&self) -> ObjectKey {
        key_of(self)
    }
    fn uid(&self) -> &str {
        meta_str(&self.metadata.uid)
    }
    fn resource_version(&self) -> &str {
        meta_str(&self.metadata.resource_version)
    }
}

impl Cached for PodInfo {
    fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.resource_version
    }
    const LABEL_INDEXED: bool = true;
    fn labels(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        Some(&self.labels)
    }
}

/// managedFields are often the largest part of an object and nothing here reads
/// them; an update sent without them leaves the server's record as it is.
pub fn without_managed_fields<K: kube::Resource>(mut obj: K) -> Option<K> {
    obj.meta_mut().managed_fields = None;
    Some(obj)
}
