use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::*;
use crate::desired::PodFields;
use crate::desired::PodInfo;
use hardened_watcher::{Cache, WatchEventKind};

use crate::reconcile::testkit::context;

fn service(ns: &str, name: &str, app: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": ns, "name": name, "uid": name, "resourceVersion": "1"},
        "spec": {"selector": {"app": app}},
    }))
    .expect("service")
}

fn pod(ns: &str, app: &str, rv: &str) -> PodInfo {
    PodFields {
        namespace: ns.into(),
        name: "p".into(),
        uid: "p-uid".into(),
        resource_version: rv.into(),
        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
        ..PodFields::default()
    }
    .pack()
}

fn queued(ctx: &Context) -> Vec<String> {
    let queue = &ctx.endpoints.queue;
    let mut keys = Vec::new();
    while queue.len() > 0 {
        let Some(taken) = futures::executor::block_on(queue.next()) else {
            break;
        };
        keys.push(taken.key.to_string());
        queue.done(&taken.key);
    }
    keys.sort();
    keys
}

#[tokio::test]
async fn relabelled_pod_queues_old_and_new_services_of_its_namespace_only() {
    let ctx = context();
    {
        let services = &ctx.stores.services;
        for svc in [
            service("ns", "a", "a"),
            service("ns", "b", "b"),
            service("ns", "c", "c"),
            service("other", "a", "a"),
        ] {
            services.apply_watch_event(WatchEventKind::Added, CachedService::new(svc));
        }
    }
    let change = Change::Updated {
        old: Arc::new(pod("ns", "a", "1")),
        new: Arc::new(pod("ns", "b", "2")),
    };
    on_pod(&ctx, &change, None);
    assert_eq!(queued(&ctx), vec!["ns/a", "ns/b"]);
}

#[tokio::test]
async fn pod_change_that_endpoints_do_not_depend_on_queues_nothing() {
    let ctx = context();
    ctx.stores.services.apply_watch_event(
        WatchEventKind::Added,
        CachedService::new(service("ns", "a", "a")),
    );
    // Only the resourceVersion moved (say, an annotation was added).
    let change = Change::Updated {
        old: Arc::new(pod("ns", "a", "1")),
        new: Arc::new(pod("ns", "a", "2")),
    };
    on_pod(&ctx, &change, None);
    assert!(queued(&ctx).is_empty());
}

#[tokio::test]
async fn deleted_pod_named_by_no_endpoints_is_released_at_once() {
    let ctx = context();
    let p = pod("ns", "a", "1");
    let pods = &ctx.stores.pods;
    pods.apply_watch_event(WatchEventKind::Added, p.clone());
    pods.apply_watch_event(WatchEventKind::Deleted, pod("ns", "a", "2"));
    assert_eq!(pods.with_cache(Cache::tombstone_count), 1);
    on_pod(&ctx, &Change::DeletionCandidate(Arc::new(p)), None);
    assert_eq!(ctx.stores.pods.with_cache(Cache::tombstone_count), 0);
}

/// The metrics' fixed `resource` labels are the watched kinds, in order:
/// `metrics::RESOURCES` sits below the reconcile and cannot read
/// `for_each_kind`, so this holds the two lists together.
#[test]
fn the_metrics_resources_are_the_watched_kinds() {
    struct Names(Vec<&'static str>);
    impl super::KindVisitor for Names {
        fn visit<K: super::Kind>(&mut self) {
            self.0.push(K::RESOURCE);
        }
    }
    let mut names = Names(Vec::new());
    super::for_each_kind(&mut names);
    assert_eq!(names.0, crate::metrics::RESOURCES);
}
