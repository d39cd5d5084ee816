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
use super::scope::LABEL_SKIP_MIRROR;
use super::trigger::set_trigger_time_annotation;
use super::{ComputedSubsets, LABEL_MANAGED_BY, Rules};

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

/// The labels a controller marks the Endpoints it writes with, besides the
/// Service's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointsMarks {
    /// `endpoints.kubernetes.io/managed-by`.
    pub managed_by: &'static str,
    /// `endpointslice.kubernetes.io/skip-mirror: "true"`, so that
    /// kube-controller-manager's mirroring controller leaves them alone (the
    /// Endpoints of an opted-in Service, which has no selector).
    pub skip_mirror: bool,
}

impl EndpointsMarks {
    /// Only the managed-by label, as upstream marks its Endpoints.
    pub fn managed_by(managed_by: &'static str) -> Self {
        Self {
            managed_by,
            skip_mirror: false,
        }
    }
}

/// Labels of the written Endpoints: the Service's labels (replacing the old
/// ones), the headless label exactly when there is no cluster IP, then the
/// marks.
pub(crate) fn endpoints_labels(svc: &Service, marks: EndpointsMarks) -> BTreeMap<String, String> {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    if has_cluster_ip(svc) {
        labels.remove(LABEL_HEADLESS);
    } else {
        labels.insert(LABEL_HEADLESS.to_string(), String::new());
    }
    labels.insert(LABEL_MANAGED_BY.to_string(), marks.managed_by.to_string());
    if marks.skip_mirror {
        labels.insert(LABEL_SKIP_MIRROR.to_string(), "true".to_string());
    }
    labels
}

/// Upstream's labelsCorrectForEndpoints. The headless label is ignored in both
/// directions (so adding or dropping it alone never causes a write), managed-by
/// must be ours, and every other label must mirror the Service's. The count
/// comparison is upstream's: a Service that itself carries one of the two
/// skipped keys therefore never compares equal. The skip-mirror mark, when
/// made, must be "true" and is not compared with the Service's labels (a
/// Service may carry it too, so that upstream's Endpoints carry it before
/// the Service opts in).
pub(crate) fn labels_correct(
    endpoints_labels: Option<&BTreeMap<String, String>>,
    service_labels: Option<&BTreeMap<String, String>>,
    marks: EndpointsMarks,
) -> bool {
    let empty = BTreeMap::new();
    let current = endpoints_labels.unwrap_or(&empty);
    let wanted = service_labels.unwrap_or(&empty);
    // A missing label reads as "", as a Go map lookup does.
    let value = |key: &str| current.get(key).map_or("", String::as_str);
    if value(LABEL_MANAGED_BY) != marks.managed_by {
        return false;
    }
    if marks.skip_mirror && value(LABEL_SKIP_MIRROR) != "true" {
        return false;
    }
    let marked = |key: &str| marks.skip_mirror && key == LABEL_SKIP_MIRROR;
    let mut skipped = 0;
    for (key, value) in current {
        if key == LABEL_HEADLESS || key == LABEL_MANAGED_BY || marked(key) {
            skipped += 1;
        } else if wanted.get(key) != Some(value) {
            return false;
        }
    }
    let wanted_count = wanted.keys().filter(|key| !marked(key)).count();
    wanted_count + skipped == current.len()
}

/// Build the full Endpoints object to write.
pub fn build_endpoints(
    svc: &Service,
    computed: ComputedSubsets,
    current: Option<&Endpoints>,
    trigger_time: Option<Timestamp>,
    marks: EndpointsMarks,
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
    endpoints.metadata.labels = Some(endpoints_labels(svc, marks));
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
/// over-capacity Service is rewritten on every sync. `rules` must be those
/// `computed` was made with (the repack sorts the same way). Upstream before
/// 1.35 compared the stored subsets only as stored, and so rewrote Endpoints
/// stored in another order on every sync; that is not copied
/// (`docs/versions.md`).
pub fn needs_write(
    svc: &Service,
    computed: &ComputedSubsets,
    current: Option<&Endpoints>,
    marks: EndpointsMarks,
    rules: Rules,
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
                &repack_subsets(
                    current_subsets,
                    AppProtocolIdentity::ByOccurrence,
                    rules.port_order(),
                ),
                &computed.subsets,
            ));
    let up_to_date = subsets_equal
        && labels_correct(
            current.metadata.labels.as_ref(),
            svc.metadata.labels.as_ref(),
            marks,
        )
        && capacity_annotation_correct(current.metadata.annotations.as_ref(), current_subsets);
    !up_to_date
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;
