//! The Endpoints object to write and upstream's "skip the write" check
//! (the tail of upstream `syncService`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::capacity::{
    ANNOTATION_OVER_CAPACITY, OVER_CAPACITY_TRUNCATED, capacity_annotation_correct,
    truncate_subsets,
};
use super::equality::subsets_equal_ignoring_resource_version;
use super::repack::{AppProtocolIdentity, repack_may_equal, repack_subsets};
use super::trigger::set_trigger_time_annotation;
use super::{ComputedSubsets, LABEL_MANAGED_BY};

/// Label upstream puts on the Endpoints of a Service without a cluster IP.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

/// Upstream's IsServiceIPSet: a cluster IP that is neither "None" nor empty.
pub(crate) fn has_cluster_ip(svc: &Service) -> bool {
    let cluster_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("");
    cluster_ip != "None" && !cluster_ip.is_empty()
}

/// Labels of the written Endpoints: the Service's labels (replacing the old
/// ones), the headless label exactly when there is no cluster IP, then managed-by.
pub(crate) fn endpoints_labels(svc: &Service, managed_by: &str) -> BTreeMap<String, String> {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    if has_cluster_ip(svc) {
        labels.remove(LABEL_HEADLESS);
    } else {
        labels.insert(LABEL_HEADLESS.to_string(), String::new());
    }
    labels.insert(LABEL_MANAGED_BY.to_string(), managed_by.to_string());
    labels
}

/// Upstream's labelsCorrectForEndpoints. The headless label is ignored in both
/// directions (so adding or dropping it alone never causes a write), managed-by
/// must be ours, and every other label must mirror the Service's. The count
/// comparison is upstream's: a Service that itself carries one of the two
/// skipped keys therefore never compares equal.
pub(crate) fn labels_correct(
    endpoints_labels: Option<&BTreeMap<String, String>>,
    service_labels: Option<&BTreeMap<String, String>>,
    managed_by: &str,
) -> bool {
    let empty = BTreeMap::new();
    let current = endpoints_labels.unwrap_or(&empty);
    let wanted = service_labels.unwrap_or(&empty);
    // A missing label reads as "", as a Go map lookup does.
    if current.get(LABEL_MANAGED_BY).map_or("", String::as_str) != managed_by {
        return false;
    }
    let mut skipped = 0;
    for (key, value) in current {
        if key == LABEL_HEADLESS || key == LABEL_MANAGED_BY {
            skipped += 1;
        } else if wanted.get(key) != Some(value) {
            return false;
        }
    }
    wanted.len() + skipped == current.len()
}

/// Build the full Endpoints object to write.
pub fn build_endpoints(
    svc: &Service,
    computed: ComputedSubsets,
    current: Option<&Endpoints>,
    trigger_time: Option<Timestamp>,
    managed_by: &str,
) -> Endpoints {
    // Upstream starts from a deep copy of the current object, so everything it
    // does not set (annotations, owner references, finalizers, the
    // resourceVersion the update needs) is carried over. The subsets are not
    // copied: they are replaced below.
    let mut endpoints = match current {
        Some(current) => Endpoints {
            metadata: current.metadata.clone(),
            subsets: None,
        },
        None => Endpoints {
            metadata: ObjectMeta {
                name: svc.metadata.name.clone(),
                namespace: svc.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            subsets: None,
        },
    };

    let mut subsets = computed.subsets;
    let truncated = truncate_subsets(&mut subsets);
    // Always present, even when empty, so that any kind of write clears old subsets.
    endpoints.subsets = Some(subsets);

    let mut annotations = endpoints.metadata.annotations.take().unwrap_or_default();
    set_trigger_time_annotation(&mut annotations, trigger_time);
    if truncated {
        annotations.insert(
            ANNOTATION_OVER_CAPACITY.to_string(),
            OVER_CAPACITY_TRUNCATED.to_string(),
        );
    } else {
        annotations.remove(ANNOTATION_OVER_CAPACITY);
    }
    endpoints.metadata.annotations = Some(annotations);
    endpoints.metadata.labels = Some(endpoints_labels(svc, managed_by));
    endpoints
}

/// Upstream's "skip the write" check; true when a create or an update is needed.
///
/// No current object (or one without a resourceVersion) means create. Otherwise
/// the write is skipped only when the current subsets equal the computed ones
/// (ignoring targetRef resourceVersion; tried as stored and again after
/// repacking, so an older ordering alone never causes a write), the labels are
/// correct, and the over-capacity annotation needs no change. The computed
/// subsets are compared before truncation, like upstream does, so an
/// over-capacity Service is rewritten on every sync.
pub fn needs_write(
    svc: &Service,
    computed: &ComputedSubsets,
    current: Option<&Endpoints>,
    managed_by: &str,
) -> bool {
    let Some(current) = current else {
        return true;
    };
    if current
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("")
        .is_empty()
    {
        return true;
    }
    let current_subsets = current.subsets.as_deref().unwrap_or_default();
    let subsets_equal = subsets_equal_ignoring_resource_version(current_subsets, &computed.subsets)
        || (repack_may_equal(current_subsets, &computed.subsets)
            && subsets_equal_ignoring_resource_version(
                &repack_subsets(current_subsets, AppProtocolIdentity::ByOccurrence),
                &computed.subsets,
            ));
    let up_to_date = subsets_equal
        && labels_correct(
            current.metadata.labels.as_ref(),
            svc.metadata.labels.as_ref(),
            managed_by,
        )
        && capacity_annotation_correct(current.metadata.annotations.as_ref(), current_subsets);
    !up_to_date
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;
