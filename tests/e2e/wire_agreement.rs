//! The two pod decoders agree on real objects: pods that carry every field
//! the projection reads (labels, IPv4 and IPv6 podIPs, hostname and
//! subdomain, nodeName, named container and sidecar ports of each protocol,
//! Ready true and false, each phase, a deletionTimestamp held by a
//! finalizer, ownerReferences, terminal pods) are watched by two watchers
//! side by side on one kube-apiserver, one reading JSON and one protobuf,
//! through the WATCH path (pods made and changed while they watch) and the
//! LIST path (two more watchers started afterwards). Each cached pod, and
//! each change delivered, must be the same for both, and the same as the
//! projection of the whole typed Pod. A metadata-only LIST comes in
//! protobuf and names what a typed LIST names. And a real JSON watch line is
//! in the order the watcher's metadata-first read relies on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec};
use endpoints_guard::desired::{PodFields, PodInfo};
use endpoints_guard::wire::PodWire;
use hardened_watcher::live::{self, ListShape, LiveMeta, PageFrom};
use hardened_watcher::{Cached, Change, CountingObserver, ObjectKey, Store, Watcher};
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use tokio::sync::watch;

const NS: &str = "wire";

/// Objects the protobuf watchers decoded: proof that they were served protobuf.
static PROTOBUF_DECODES: AtomicUsize = AtomicUsize::new(0);

fn counted_protobuf(raw: &[u8]) -> Result<PodWire, String> {
    PROTOBUF_DECODES.fetch_add(1, Ordering::SeqCst);
    PodWire::from_protobuf(raw)
}

/// One change a watcher delivered: which object at which RV, and what.
#[derive(Debug, Clone, PartialEq)]
struct Delivered {
    /// `namespace/name@resourceVersion` of the object the change leaves.
    at: String,
    /// The projection the change leaves in the cache.
    left: String,
    /// The whole change: its kind, and for an update the state it replaced.
    line: String,
}

/// One watcher of the namespace's pods and every change it delivered.
struct Side {
    store: Store<PodInfo>,
    changes: Arc<Mutex<Vec<Delivered>>>,
    counts: Arc<CountingObserver>,
    stop: watch::Sender<bool>,
}

impl Side {
    fn start(client: &kube::Client, protobuf: bool) -> Self {
        let store = Store::<PodInfo>::new("pods");
        let changes = Arc::new(Mutex::new(Vec::new()));
        let counts = Arc::new(CountingObserver::default());
        let log = changes.clone();
        let mut builder = Watcher::builder(Api::<PodWire>::namespaced(client.clone(), NS))
            .project(PodWire::project)
            .store(store.clone())
            .observer(counts.clone())
            .on_change(move |change: &Change<PodInfo>, _| {
                let (left, line) = match change {
                    Change::Added(p) => (p, format!("added {p:?}")),
                    Change::Updated { old, new } => (new, format!("updated {old:?} -> {new:?}")),
                    Change::DeletionCandidate(p) => (p, format!("deletion candidate {p:?}")),
                };
                let at = format!("{}@{}", left.key(), left.resource_version());
                let left = format!("{left:?}");
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Delivered { at, left, line });
            })
            .page_limit(4);
        if protobuf {
            builder = builder.protobuf(counted_protobuf);
        }
        let watcher = builder.build();
        let (stop, shutdown) = watch::channel(false);
        tokio::spawn(async move {
            if let Err(err) = watcher.run(shutdown).await {
                eprintln!("watcher: {err}");
            }
        });
        Self {
            store,
            changes,
            counts,
            stop,
        }
    }

    async fn synced(&self) -> Result<()> {
        let mut synced = self.store.synced();
        tokio::time::timeout(Duration::from_secs(60), synced.wait_for(|s| *s))
            .await
            .context("the watcher did not sync in 60s")?
            .context("the watcher stopped")?;
        Ok(())
    }

    fn cached(&self) -> BTreeMap<String, PodFields> {
        self.store.with_cache(|pods| {
            pods.iter()
                .map(|p| (p.key().to_string(), p.fields()))
                .collect()
        })
    }

    fn changes(&self) -> Vec<Delivered> {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The watcher's restarts since it started, by reason.
    fn restarts(&self) -> Vec<(String, u64)> {
        self.counts
            .snapshot()
            .into_iter()
            .filter(|(key, _)| key.starts_with("pods/restart/"))
            .collect()
    }

    fn undecodable(&self) -> u64 {
        self.counts.get("pods/undecodable")
    }

    /// Waits until the watcher has delivered the change that leaves `key`
    /// at `rv`. The store is written before the change is handed on, so a
    /// cache that holds it says nothing yet of the change log.
    async fn reaches(&self, key: &ObjectKey, rv: &str) -> Result<()> {
        let at = format!("{key}@{rv}");
        for _ in 0..600 {
            if self.changes().iter().any(|d| d.at == at) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("{at} was never delivered")
    }
}

/// Asserts that both watchers delivered the same changes. Each watcher
/// delivers every watch event as a change unless it restarted (the server
/// closed its watch, a watch cache lagging behind under load answered
/// "too large resource version"): its relist then delivers the difference
/// in one step (an update from an older state, or an add). A watcher that
/// did not restart must hold every change the other delivered, and what the
/// changes both delivered for the same object at the same RV leave in the
/// cache must be the same.
fn assert_same_changes(json: &Side, proto: &Side, min: usize) -> Result<()> {
    for side in [json, proto] {
        ensure!(
            side.undecodable() == 0,
            "undecodable pods: {:?}",
            side.counts.snapshot()
        );
    }
    let (json_restarts, proto_restarts) = (json.restarts(), proto.restarts());
    if !(json_restarts.is_empty() && proto_restarts.is_empty()) {
        eprintln!("restarts: JSON {json_restarts:?}, protobuf {proto_restarts:?}");
    }
    same_changes(
        (&json.changes(), !json_restarts.is_empty()),
        (&proto.changes(), !proto_restarts.is_empty()),
        min,
    )
}

/// [`assert_same_changes`] on what each watcher delivered and whether it
/// restarted.
fn same_changes(
    (json, json_restarted): (&[Delivered], bool),
    (proto, proto_restarted): (&[Delivered], bool),
    min: usize,
) -> Result<()> {
    if !(json_restarted || proto_restarted) {
        ensure!(json.len() >= min, "only {} changes", json.len());
        ensure!(
            proto == json,
            "each watch event projects the same: protobuf {proto:#?}, JSON {json:#?}"
        );
        return Ok(());
    }
    let by_at = |changes: &[Delivered]| -> BTreeMap<String, String> {
        changes
            .iter()
            .map(|d| (d.at.clone(), d.left.clone()))
            .collect()
    };
    let (json_at, proto_at) = (by_at(json), by_at(proto));
    for (restarted, lone, whole, whole_name) in [
        (json_restarted, &proto_at, &json_at, "JSON"),
        (proto_restarted, &json_at, &proto_at, "protobuf"),
    ] {
        if !restarted {
            let missing: Vec<&String> = lone.keys().filter(|at| !whole.contains_key(*at)).collect();
            ensure!(
                missing.is_empty(),
                "the {whole_name} watcher never delivered {missing:?}"
            );
        }
    }
    let mut shared = 0;
    for (at, left) in &json_at {
        if let Some(other) = proto_at.get(at) {
            ensure!(
                other == left,
                "{at} projects differently: protobuf {other}, JSON {left}"
            );
            shared += 1;
        }
    }
    ensure!(shared >= min, "only {shared} changes delivered by both");
    Ok(())
}

#[test]
fn a_restarted_watcher_is_held_to_what_it_delivered() {
    let change = |name: &str, rv: u32, left: &str, line: &str| Delivered {
        at: format!("wire/{name}@{rv}"),
        left: left.into(),
        line: line.into(),
    };
    let watched = [
        change("a", 1, "a1", "added a1"),
        change("a", 2, "a2", "updated a1 -> a2"),
        change("a", 3, "a3", "updated a2 -> a3"),
    ];
    // The relist skipped a2 and delivered a3 as an update from a1.
    let relisted = [
        change("a", 1, "a1", "added a1"),
        change("a", 3, "a3", "updated a1 -> a3"),
    ];
    assert!(same_changes((&watched, false), (&watched, false), 3).is_ok());
    assert!(same_changes((&watched, false), (&relisted, false), 2).is_err());
    assert!(same_changes((&watched, false), (&relisted, true), 2).is_ok());
    assert!(same_changes((&relisted, true), (&watched, false), 2).is_ok());
    // Fewer shared than asked for.
    assert!(same_changes((&watched, false), (&relisted, true), 3).is_err());
    // The watcher that did not restart lacks a change the other delivered.
    assert!(same_changes((&relisted, false), (&watched, true), 2).is_err());
    // The same object at the same RV, projected differently.
    let mut wrong = relisted.clone();
    wrong[1].left = "a3 with another IP".into();
    assert!(same_changes((&watched, false), (&wrong, true), 2).is_err());
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn port(name: &str, number: i32, protocol: &str) -> ContainerPort {
    ContainerPort {
        name: (!name.is_empty()).then(|| name.to_owned()),
        container_port: number,
        protocol: Some(protocol.to_owned()),
        ..ContainerPort::default()
    }
}

/// `name` with the labels, port (http 8080/TCP) and node most pods have.
fn pod(name: &str) -> PodBuilder {
    PodBuilder::serving(NS, name, "web").label("tier", "front")
}

async fn create(cp: &ControlPlane, pod: Pod) -> Result<Pod> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    Api::<Pod>::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {name}"))
}

/// Makes and changes the pods; returns the last one's key and RV (every
/// change before it has then reached a watcher that has it).
async fn churn(cp: &ControlPlane) -> Result<(ObjectKey, String)> {
    let pods = Api::<Pod>::namespaced(cp.client(), NS);

    // Every field the projection reads, both families, every protocol,
    // a sidecar's port and a plain init container's (not read).
    let full = pod("full")
        .hostname("full-0")
        .subdomain("web")
        .node_name("node-a")
        .container_port("dns", 53, "UDP")
        .container_port("assoc", 9999, "SCTP")
        .container_port("", 9090, "TCP")
        .sidecar_port("metrics", 9100, "TCP")
        .spec(|spec| {
            spec.init_containers
                .get_or_insert_with(Vec::new)
                .push(Container {
                    name: "setup".into(),
                    image: Some("registry.k8s.io/pause:3.10".into()),
                    ports: Some(vec![port("setup", 1234, "TCP")]),
                    ..Container::default()
                });
        });
    cp.create_pod_with_status(full, PodStatusSpec::ready(["10.1.0.1", "fd00:1::1"]))
        .await?;
    cp.create_pod_with_status(pod("v6"), PodStatusSpec::ready(["fd00:1::2"]))
        .await?;
    cp.create_pod_with_status(pod("unready"), PodStatusSpec::not_ready(["10.1.0.3"]))
        .await?;
    cp.create_pod(pod("pending")).await?;
    cp.create_pod_with_status(
        pod("succeeded"),
        PodStatusSpec::not_ready(["10.1.0.5"]).phase("Succeeded"),
    )
    .await?;
    cp.create_pod_with_status(
        pod("failed"),
        PodStatusSpec::not_ready(["10.1.0.6"]).phase("Failed"),
    )
    .await?;
    cp.create_pod(PodBuilder::new(NS, "bare")).await?;

    // Owned by a ReplicaSet and held by a finalizer: deleting it sets its
    // deletionTimestamp and keeps it.
    let mut owned = pod("owned").build();
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "web-7d9f".into(),
        uid: "6b1d2c3e-0000-4000-8000-000000000001".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    owned.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create(cp, owned).await?;
    cp.set_pod_status(NS, "owned", PodStatusSpec::ready(["10.1.0.7"]))
        .await?;
    cp.delete_pod_gracefully(NS, "owned", 30).await?;
    // On a node, no kubelet to finish it: Terminating with its deletionTimestamp.
    cp.create_pod_with_status(
        pod("terminating").node_name("node-a"),
        PodStatusSpec::ready(["10.1.0.8"]),
    )
    .await?;
    cp.delete_pod_gracefully(NS, "terminating", 30).await?;

    // Flips, relabels, deletes.
    cp.set_pod_status(NS, "unready", PodStatusSpec::ready(["10.1.0.3"]))
        .await?;
    cp.set_pod_status(
        NS,
        "full",
        PodStatusSpec::not_ready(["10.1.0.1", "fd00:1::1"]),
    )
    .await?;
    let relabel = serde_json::json!({"metadata": {"labels": {"tier": "back", "extra": ""}}});
    pods.patch("v6", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .context("relabelling v6")?;
    cp.delete_pod_gracefully(NS, "pending", 0).await?;

    let last = cp.create_pod(pod("last")).await?;
    let rv = last.metadata.resource_version.unwrap_or_default();
    Ok((ObjectKey::new(NS, "last"), rv))
}

/// The projection of each pod as a typed whole-Pod LIST has it.
async fn projected_whole(cp: &ControlPlane) -> Result<BTreeMap<String, PodFields>> {
    let list = Api::<Pod>::namespaced(cp.client(), NS)
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let mut out = BTreeMap::new();
    for pod in &list.items {
        let info = PodInfo::from_pod(pod).context("a pod without a name")?;
        out.insert(info.key().to_string(), info.fields());
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_and_json_decode_the_same_pods() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace(NS).await?;
    let client = cp.client();

    // The WATCH path: both watch while the pods are made and changed.
    let json = Side::start(&client, false);
    let proto = Side::start(&client, true);
    json.synced().await?;
    proto.synced().await?;
    let decoded_at_start = PROTOBUF_DECODES.load(Ordering::SeqCst);
    let (last, rv) = churn(&cp).await?;
    json.reaches(&last, &rv).await?;
    proto.reaches(&last, &rv).await?;
    let watched = PROTOBUF_DECODES.load(Ordering::SeqCst) - decoded_at_start;
    ensure!(
        watched >= 20,
        "the protobuf watcher decoded {watched} watch events as protobuf"
    );
    assert_same_changes(&json, &proto, 20)?;
    let whole = projected_whole(&cp).await?;
    ensure!(whole.len() == 9, "pods: {:?}", whole.keys());
    assert_eq!(json.cached(), whole, "the JSON cache is the whole pods'");
    assert_eq!(
        proto.cached(),
        whole,
        "the protobuf cache is the whole pods'"
    );
    // What the pods were made to show did reach the projection.
    let terminating: Vec<&str> = whole
        .values()
        .filter(|p| p.terminating)
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(terminating, ["owned", "terminating"]);
    let full = whole.get("wire/full").context("no pod full")?;
    assert_eq!(full.pod_ips, ["10.1.0.1", "fd00:1::1"]);
    assert_eq!(full.container_ports.len(), 4, "{full:?}");
    assert!(!full.ready && full.ready_transition.is_some());
    assert_eq!(full.hostname.as_deref(), Some("full-0"));

    // The LIST path: two more watchers list what is there (pages of 4).
    let before_list = PROTOBUF_DECODES.load(Ordering::SeqCst);
    let json_list = Side::start(&client, false);
    let proto_list = Side::start(&client, true);
    json_list.synced().await?;
    proto_list.synced().await?;
    json_list.reaches(&last, &rv).await?;
    proto_list.reaches(&last, &rv).await?;
    let listed = PROTOBUF_DECODES.load(Ordering::SeqCst) - before_list;
    ensure!(
        listed >= whole.len(),
        "the protobuf list decoded {listed} pods as protobuf"
    );
    assert_eq!(json_list.cached(), whole);
    assert_eq!(proto_list.cached(), whole);
    assert_same_changes(&json_list, &proto_list, whole.len())?;
    metadata_pages_agree_with_the_typed_list(&cp).await
}

/// A metadata-only LIST (`live::list_meta_page`, the compaction audit's)
/// arrives in protobuf, page by page at the revision of a typed JSON LIST,
/// and names the same pods with the same UIDs and resourceVersions; so does
/// a LIST of whole pods read the same way (`ListShape::Whole`).
async fn metadata_pages_agree_with_the_typed_list(cp: &ControlPlane) -> Result<()> {
    let typed = Api::<Pod>::all(cp.client())
        .list(&ListParams::default())
        .await
        .context("listing every pod")?;
    let at = typed.metadata.resource_version.clone().unwrap_or_default();
    let want: BTreeMap<ObjectKey, LiveMeta> = typed
        .items
        .iter()
        .map(|pod| {
            let key = ObjectKey::new(
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            let meta = LiveMeta {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
            };
            (key, meta)
        })
        .collect();
    let client = cp.client();
    for shape in [ListShape::Metadata, ListShape::Whole] {
        let (mut got, mut pages) = (BTreeMap::new(), 0);
        let mut token: Option<String> = None;
        loop {
            let from = token
                .as_deref()
                .map_or(PageFrom::Exactly(&at), PageFrom::Continue);
            let page = live::list_page_as::<Pod>(&client, &(), 4, from, shape, "list")
                .await
                .with_context(|| format!("{shape:?} page {} at {at}", pages + 1))?;
            pages += 1;
            ensure!(page.protobuf, "{shape:?} page {pages} was not protobuf");
            ensure!(page.unreadable == 0, "page {pages}: {page:?}");
            got.extend(page.items);
            token = page.continue_token;
            if token.is_none() {
                break;
            }
        }
        ensure!(pages >= 3, "{} pods in {pages} pages of 4", want.len());
        assert_eq!(
            got, want,
            "the {shape:?} pages name what the typed list names"
        );
    }
    Ok(())
}

/// kube-apiserver writes a watch line's `type` before its `object`, and an
/// object's `metadata` before its other fields: the order the watcher relies
/// on to read our own write coming back no further than its metadata
/// (`peek_watch_line`; a line in another order is decoded whole). Checked on
/// a real Endpoints watch line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_watch_line_is_read_to_its_metadata() -> Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    use kube::api::WatchParams;

    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let api: Api<Endpoints> = Api::namespaced(cp.client(), "default");
    let endpoints = |ip: &str| -> Result<Endpoints> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": "peek", "labels": {"app": "peek"}},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 80}]}],
        }))?)
    };
    let created = api
        .create(&PostParams::default(), &endpoints("10.0.0.1")?)
        .await?;
    let from = created
        .metadata
        .resource_version
        .clone()
        .context("no resourceVersion")?;
    let mut changed = endpoints("10.0.0.2")?;
    changed.metadata.resource_version = Some(from.clone());
    let updated = api
        .replace("peek", &PostParams::default(), &changed)
        .await?;
    // The events after `from`, then the server ends the watch.
    let request = kube::core::Request::new("/api/v1/namespaces/default/endpoints")
        .watch(&WatchParams::default().timeout(1), &from)?;
    let text = cp.client().request_text(request).await?;
    let line = text.lines().next().context("no watch event")?;
    let (kind, meta) = hardened_watcher::peek_watch_line(line)
        .with_context(|| format!("the metadata-first read declined a real line: {line}"))?;
    ensure!(
        kind == hardened_watcher::WatchEventKind::Modified,
        "{kind:?}"
    );
    ensure!(meta.key == ObjectKey::new("default", "peek"), "{meta:?}");
    ensure!(
        Some(&meta.uid) == updated.metadata.uid.as_ref()
            && Some(&meta.resource_version) == updated.metadata.resource_version.as_ref(),
        "read {meta:?}, the update answered {:?}",
        updated.metadata
    );
    Ok(())
}
