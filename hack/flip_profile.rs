//! Profiles the CPU of one pod flip and of one ghost-scan read
//! (docs/cpu-profile.md). It drives the library's real code: a pod's MODIFIED
//! watch line through the decoder, the cache and the pod handler; the
//! reconcile of its Service, whose PUT goes to a scripted peer (plain HTTP, on
//! its own thread, so its CPU is not ours); our own write's MODIFIED line back
//! through the Endpoints watcher's path (and again in a line it must decode
//! whole, for comparison); and the ghost scan's metadata GET. Each stage is a
//! function of its own, so callgrind's inclusive costs split a flip:
//!
//! ```text
//! cargo build --release --features profiling --example flip-profile
//! FLIPS=400 valgrind --tool=callgrind --callgrind-out-file=/tmp/flip.out \
//!     target/release/examples/flip-profile
//! callgrind_annotate --inclusive=yes /tmp/flip.out | grep stage_
//! ```

use std::time::Duration;

use hardened_watcher::ObjectKey;
use hardened_watcher::testing::{Reply, ScriptedApi};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use endpoints_guard::profiling::Harness;

const NAMESPACE: &str = "eg-bench-0";
const SERVICES: usize = 50;
const PODS_PER_SERVICE: usize = 10;

fn pod_ip(index: usize) -> String {
    format!("10.1.{}.{}", index / 250, index % 250 + 1)
}

/// Pod `index` as kube-apiserver v1.36 serves the bench's pods: defaulted,
/// with the ServiceAccount volume and the managedFields of a create and a
/// status patch.
fn pod_json(index: usize, rv: u64, ready: bool) -> Value {
    let service = index % SERVICES;
    let ip = pod_ip(index);
    let status = if ready { "True" } else { "False" };
    let condition = |kind: &str| {
        json!({"type": kind, "status": status, "lastProbeTime": null,
               "lastTransitionTime": "2026-11-24T21:00:00Z"})
    };
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": format!("svc-{service}-p{}", index / SERVICES), "namespace": NAMESPACE,
            "uid": format!("6f1c2d3e-0000-4000-8000-{index:012}"),
            "resourceVersion": rv.to_string(), "creationTimestamp": "2026-11-24T20:00:00Z",
            "labels": {"app": format!("svc-{service}"), "bench": "yes"},
            "managedFields": [
                {"manager": "eg-bench", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-24T20:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:bench": {}}},
                   "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {},
                     "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {".": {},
                     "k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {},
                     "f:name": {}, "f:protocol": {}}}, "f:resources": {}, "f:terminationMessagePath": {},
                     "f:terminationMessagePolicy": {}}}, "f:dnsPolicy": {}, "f:enableServiceLinks": {},
                     "f:nodeName": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                     "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}}},
                {"manager": "eg-bench", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-24T21:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:conditions": {".": {},
                   "k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                   "k:{\"type\":\"Ready\"}": {".": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
                   "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {}, format!("k:{{\"ip\":\"{ip}\"}}"): {".": {}, "f:ip": {}}}}},
                 "subresource": "status"}
            ]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ], "defaultMode": 420}}],
            "containers": [{"name": "app", "image": "registry.invalid/app:1",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default",
            "nodeName": format!("bench-node-{}", index % 8), "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {"phase": "Running", "conditions": [condition("Ready"), condition("ContainersReady")],
                   "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "BestEffort"}
    })
}

fn service_json(s: usize) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": {"name": format!("svc-{s}"), "namespace": NAMESPACE,
                     "uid": format!("5e0c2d3e-0000-4000-8000-{s:012}"), "resourceVersion": "10",
                     "creationTimestamp": "2026-11-24T20:00:00Z"},
        "spec": {"selector": {"app": format!("svc-{s}")}, "clusterIP": "10.96.0.10",
                 "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "type": "ClusterIP", "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
        "status": {"loadBalancer": {}}
    })
}

fn line(kind: &str, object: &Value) -> String {
    // As kube-apiserver writes it: `type` first (the watcher reads the
    // metadata of our own write before deciding to decode it).
    format!(r#"{{"type":"{kind}","object":{object}}}"#)
}

/// A pod's watch line: decoded, cached, handed to the pod handler.
#[inline(never)]
fn stage_pod_event(harness: &Harness, line: &str) {
    harness
        .pod_event(line)
        .unwrap_or_else(|err| panic!("pod event: {err}"));
}

/// Our own write coming back on the Endpoints watch, its line as
/// kube-apiserver writes it (`type` first): read to its metadata only.
#[inline(never)]
fn stage_endpoints_event(harness: &Harness, line: &str) {
    harness
        .endpoints_event(line)
        .unwrap_or_else(|err| panic!("endpoints event: {err}"));
}

/// The same event in a line with `object` before `type` (as a re-serializing
/// proxy writes it): decoded whole, then found unchanged. The cost the
/// metadata-first read saves.
#[inline(never)]
fn stage_endpoints_event_decoded(harness: &Harness, line: &str) {
    harness
        .endpoints_event_unchanged(line)
        .unwrap_or_else(|err| panic!("{err}"));
}

/// The queued Service's reconcile, whose PUT the peer answers.
#[inline(never)]
fn stage_reconcile(rt: &tokio::runtime::Runtime, harness: &Harness) -> ObjectKey {
    rt.block_on(harness.reconcile_next())
        .unwrap_or_else(|err| panic!("reconcile: {err}"))
}

#[inline(never)]
fn stage_ghost_read(rt: &tokio::runtime::Runtime, harness: &Harness, pod: &ObjectKey) {
    rt.block_on(harness.ghost_read(pod))
        .unwrap_or_else(|err| panic!("ghost read of {pod}: {err}"));
}

/// What the ghost scan's answer costs to decode, three ways: a whole Pod
/// (had the scan read the object), its `ObjectMeta` (the scan before), its
/// UID only (`live::get_meta` reads it and the resourceVersion).
#[inline(never)]
fn stage_decode_pod(text: &str) -> usize {
    let pod: Pod = serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}"));
    pod.metadata.uid.map_or(0, |uid| uid.len())
}

#[inline(never)]
fn stage_decode_meta(text: &str) -> usize {
    let meta: kube::core::PartialObjectMeta<Pod> =
        serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}"));
    meta.metadata.uid.map_or(0, |uid| uid.len())
}

#[derive(serde::Deserialize)]
struct UidOnly {
    metadata: UidMeta,
}

#[derive(serde::Deserialize)]
struct UidMeta {
    uid: Option<String>,
}

#[inline(never)]
fn stage_decode_uid(text: &str) -> usize {
    let only: UidOnly = serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}"));
    only.metadata.uid.map_or(0, |uid| uid.len())
}

fn main() {
    let flips: usize = std::env::var("FLIPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    // The peer runs on a thread and runtime of its own: its CPU is the API server's.
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let peer_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap_or_else(|err| panic!("{err}"));
        rt.block_on(async move {
            let peer = ScriptedApi::start(Vec::new())
                .await
                .unwrap_or_else(|err| panic!("{err}"));
            peer.route("POST", "/apis/events.k8s.io", Reply::Body("{}".into()));
            let _ = tx.send(peer);
            let _ = stopped.await;
        });
    });
    let peer = rx.recv().unwrap_or_else(|err| panic!("{err}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|err| panic!("{err}"));
    let _guard = rt.enter();
    let harness = Harness::new(peer.client(Duration::from_secs(5)));
    let expect = |what: &str, result: Result<(), endpoints_guard::profiling::Unexpected>| {
        result.unwrap_or_else(|err| panic!("{what}: {err}"))
    };

    let pods = SERVICES * PODS_PER_SERVICE;
    for s in 0..SERVICES {
        expect("service", harness.add_service(service_json(s)));
    }
    for i in 0..pods {
        expect("pod", harness.add_pod(pod_json(i, 100, true)));
    }
    let mut rv = 1000;
    let service_key = |s: usize| ObjectKey::new(NAMESPACE, format!("svc-{s}"));
    let write = |key: &ObjectKey, rv: u64| {
        harness
            .expected_write(key, rv)
            .unwrap_or_else(|err| panic!("{err}"))
    };
    for s in 0..SERVICES {
        rv += 1;
        expect(
            "endpoints",
            harness.add_endpoints(write(&service_key(s), rv)),
        );
    }

    let mut ready = vec![true; pods];
    for flip in 0..flips {
        let index = flip % pods;
        ready[index] = !ready[index];
        rv += 1;
        let pod_line = line("MODIFIED", &pod_json(index, rv, ready[index]));
        stage_pod_event(&harness, &pod_line);
        assert_eq!(harness.queued(), 1, "flip {flip}: one Service queued");
        let key = service_key(index % SERVICES);
        rv += 1;
        let written = write(&key, rv);
        peer.push(Reply::Body(written.to_string()));
        assert_eq!(stage_reconcile(&rt, &harness), key, "flip {flip}");
        stage_endpoints_event(&harness, &line("MODIFIED", &written));
        stage_endpoints_event_decoded(
            &harness,
            &json!({"object": written, "type": "MODIFIED"}).to_string(),
        );

        let meta = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                          "metadata": pod_json(index, rv, ready[index])["metadata"]});
        peer.push(Reply::Body(meta.to_string()));
        let pod_key = ObjectKey::new(
            NAMESPACE,
            format!("svc-{}-p{}", index % SERVICES, index / SERVICES),
        );
        stage_ghost_read(&rt, &harness, &pod_key);

        let whole = pod_json(index, rv, ready[index]).to_string();
        let meta = meta.to_string();
        let uids = stage_decode_pod(&whole) + stage_decode_meta(&meta) + stage_decode_uid(&meta);
        assert_eq!(uids, 3 * 36, "three UIDs read");
    }
    assert_eq!(
        harness.endpoints_updates(),
        flips as u64,
        "one Endpoints write per flip"
    );
    let _ = stop.send(());
    drop(peer);
    let _ = peer_thread.join();
}
