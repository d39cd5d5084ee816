use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::PodWire;
use crate::desired::PodInfo;

/// Both ways of decoding `pod`: whole, as the watch did, and through
/// [`PodWire`].
fn both(pod: &Value) -> (Option<PodInfo>, Option<PodInfo>) {
    let text = pod.to_string();
    let whole: Pod = serde_json::from_str(&text).unwrap_or_else(|err| panic!("whole: {err}"));
    let wire: PodWire = serde_json::from_str(&text).unwrap_or_else(|err| panic!("wire: {err}"));
    (PodInfo::from_pod(&whole), wire.project())
}

fn rich_pod() -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
            "generateName": "web-", "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-01T00:10:00Z", "deletionGracePeriodSeconds": 30,
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"note": "x"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s-1", "controller": true}],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}}}}},
                "subresource": "status"}]
        },
        "spec": {
            "hostname": "web-0", "subdomain": "web", "nodeName": "node-1",
            "initContainers": [
                {"name": "proxy", "image": "p", "restartPolicy": "Always",
                 "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                           {"containerPort": 9091}]},
                {"name": "setup", "image": "s", "ports": [{"name": "setup", "containerPort": 1}]}
            ],
            "containers": [
                {"name": "app", "image": "a", "ports": [
                    {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                    {"name": "", "containerPort": 7}
                ], "env": [{"name": "A", "value": "b"}], "resources": {"limits": {"cpu": "1"}}},
                {"name": "side", "image": "b", "ports": [{"name": "grpc", "containerPort": 9000, "protocol": "SCTP"}]}
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}]
        },
        "status": {
            "phase": "Running", "podIP": "10.0.0.1",
            "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:05:00Z"},
                {"type": "Ready", "status": "False"}
            ],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "a", "imageID": "",
                                   "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}}}],
            "qosClass": "Burstable"
        }
    })
}

#[test]
fn a_pod_read_through_the_wire_type_projects_as_a_whole_pod() {
    let mut variants = vec![("rich", rich_pod())];
    let mut bare = rich_pod();
    bare["spec"] = Value::Null;
    bare["status"] = Value::Null;
    variants.push(("no spec, no status", bare));
    let mut only_pod_ip = rich_pod();
    only_pod_ip["status"]["podIPs"] = json!([]);
    variants.push(("podIP only", only_pod_ip));
    let mut not_ready = rich_pod();
    not_ready["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    not_ready["metadata"]["deletionTimestamp"] = Value::Null;
    not_ready["metadata"]["labels"] = Value::Null;
    variants.push(("not ready, not terminating, no labels", not_ready));
    let mut nameless = rich_pod();
    nameless["metadata"]
        .as_object_mut()
        .map(|meta| meta.remove("name"));
    variants.push(("no name", nameless));
    let mut missing = rich_pod();
    for field in ["spec", "status"] {
        missing.as_object_mut().map(|pod| pod.remove(field));
    }
    variants.push(("spec and status absent", missing));

    for (case, pod) in variants {
        let (whole, wire) = both(&pod);
        assert_eq!(wire, whole, "{case}");
    }
    let (whole, _) = both(&rich_pod());
    let fields = whole.map(|info| info.fields());
    assert!(
        fields.is_some_and(|f| f.container_ports.len() == 4 && f.terminating && f.ready),
        "the rich pod exercises the named ports, sidecars, terminating and Ready"
    );
}

/// Every metadata field kube-apiserver sets on an Endpoints, managedFields
/// included, as the answer to an update carries them.
#[test]
fn endpoints_metadata_reads_as_whole_less_managed_fields() {
    let endpoints = json!({
        "kind": "Endpoints",
        "apiVersion": "v1",
        "metadata": {
            "name": "web",
            "generateName": "we",
            "namespace": "shop",
            "selfLink": "/api/v1/namespaces/shop/endpoints/web",
            "uid": "0b5c0d6e-4f5a-4e8e-9d0c-0a1b2c3d4e5f",
            "resourceVersion": "4711",
            "generation": 3,
            "creationTimestamp": "2026-11-26T10:00:00Z",
            "deletionTimestamp": "2026-11-26T11:00:00Z",
            "deletionGracePeriodSeconds": 30,
            "labels": {"app": "web", "endpoints.kubernetes.io/managed-by": "endpoints-guard"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-26T10:59:59Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u-1"}],
            "finalizers": ["example.com/keep"],
            "managedFields": [{
                "manager": "endpoints-guard",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-26T10:59:59Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:subsets": {}}
            }]
        },
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80, "protocol": "TCP"}]}]
    })
    .to_string();
    let whole: k8s_openapi::api::core::v1::Endpoints =
        serde_json::from_str(&endpoints).unwrap_or_else(|err| panic!("whole: {err}"));
    let wire: super::EndpointsWire =
        serde_json::from_str(&endpoints).unwrap_or_else(|err| panic!("wire: {err}"));
    assert!(whole.metadata.managed_fields.is_some());
    let mut expected = whole.metadata;
    expected.managed_fields = None;
    assert_eq!(wire.metadata, expected);
    assert_eq!(
        wire.subsets.map(|raw| raw.get().to_string()),
        Some(
            r#"[{"addresses":[{"ip":"10.0.0.1"}],"ports":[{"port":80,"protocol":"TCP"}]}]"#.into()
        )
    );
}
