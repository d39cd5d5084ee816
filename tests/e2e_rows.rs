//! One end-to-end case per parity row (../shared/parity.md), each in its own
//! namespace on one real control plane, with endpoints-guard running in-process.
//! Then: once everything has converged, 60 s without changes must bring zero
//! Endpoints writes, counted by an independent watch.

#[allow(dead_code)] // Each test binary uses a different part of the shared helpers.
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::Guard;
use eg_testsupport::{
    ControlPlane, ControlPlaneOptions, PodBuilder, PodStatusSpec, ServiceBuilder,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";

type Check = fn(&Endpoints) -> Result<(), String>;

fn ips(list: &Option<Vec<EndpointAddress>>) -> Vec<String> {
    list.iter().flatten().map(|a| a.ip.clone()).collect()
}

fn only_subset(ep: &Endpoints) -> Result<&EndpointSubset, String> {
    match ep.subsets.as_deref() {
        Some([s]) => Ok(s),
        other => Err(format!("expected one subset, got {other:?}")),
    }
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

async fn endpoints(cp: &ControlPlane, ns: &str, name: &str) -> anyhow::Result<Option<Endpoints>> {
    Ok(Api::<Endpoints>::namespaced(cp.client(), ns)
        .get_opt(name)
        .await?)
}

/// Waits until the Endpoints pass `check`, returning the last failure on timeout.
async fn wait_for(cp: &ControlPlane, ns: &str, name: &str, check: Check) -> Result<(), String> {
    let mut last = String::from("no Endpoints yet");
    for _ in 0..150 {
        match endpoints(cp, ns, name).await {
            Ok(Some(ep)) => match check(&ep) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            },
            Ok(None) => {}
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

async fn pod(
    cp: &ControlPlane,
    b: PodBuilder,
    status: Option<PodStatusSpec>,
) -> anyhow::Result<Pod> {
    let b = b.node_name("node-a");
    match status {
        Some(s) => cp.create_pod_with_status(b, s).await,
        None => cp.create_pod(b).await,
    }
}

fn web(ns: &str, name: &str) -> PodBuilder {
    PodBuilder::serving(ns, name, "web")
}

fn web_service(ns: &str) -> ServiceBuilder {
    ServiceBuilder::new(ns, "web")
        .selector("app", "web")
        .named_port("http", 80, "http", "TCP")
}

/// Objects that must exist before endpoints-guard starts (adoption, start-up sweep).
async fn before_start(cp: &ControlPlane) -> anyhow::Result<()> {
    cp.create_namespace("adopt").await?;
    cp.create_service(web_service("adopt").label("team", "a"))
        .await?;
    pod(
        cp,
        web("adopt", "w1"),
        Some(PodStatusSpec::ready(["10.1.0.1"])),
    )
    .await?;
    let stale: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "adopt", "labels": {MANAGED_BY: "endpoint-controller"}},
        "subsets": [{"addresses": [{"ip": "10.1.9.9"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
    }))?;
    Api::<Endpoints>::namespaced(cp.client(), "adopt")
        .create(&PostParams::default(), &stale)
        .await?;

    cp.create_namespace("sweep").await?;
    for (name, labels) in [
        (
            "orphan-upstream",
            json!({MANAGED_BY: "endpoint-controller"}),
        ),
        ("orphan-ours", json!({MANAGED_BY: "endpoints-guard"})),
        ("orphan-user", json!({"owner": "someone"})),
    ] {
        let ep: Endpoints = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "sweep", "labels": labels}}),
        )?;
        Api::<Endpoints>::namespaced(cp.client(), "sweep")
            .create(&PostParams::default(), &ep)
            .await?;
    }
    Ok(())
}

/// Each row: set up objects in namespace `ns`, then wait for its check.
async fn row(cp: &ControlPlane, name: &str) -> anyhow::Result<Result<(), String>> {
    let ns = name;
    if !matches!(name, "adopt" | "sweep") {
        cp.create_namespace(ns).await?;
    }
    let r = match name {
        "readiness-placement" => {
            cp.create_service(web_service(ns)).await?;
            pod(
                cp,
                web(ns, "ready"),
                Some(PodStatusSpec::ready(["10.2.0.1"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "notready"),
                Some(PodStatusSpec::not_ready(["10.2.0.2"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "pending"),
                Some(PodStatusSpec::not_ready(["10.2.0.3"]).phase("Pending")),
            )
            .await?;
            wait_for(cp, ns, "web", |ep| {
                let s = only_subset(ep)?;
                expect("addresses", ips(&s.addresses), vec!["10.2.0.1".to_string()])?;
                expect(
                    "notReadyAddresses",
                    ips(&s.not_ready_addresses),
                    vec!["10.2.0.2".into(), "10.2.0.3".into()],
                )
            })
            .await
        }
        "dropped-pods" => {
            cp.create_service(web_service(ns)).await?;
            pod(cp, web(ns, "ok"), Some(PodStatusSpec::ready(["10.3.0.1"]))).await?;
            pod(
                cp,
                web(ns, "succeeded"),
                Some(PodStatusSpec::ready(["10.3.0.2"]).phase("Succeeded")),
            )
            .await?;
            pod(
                cp,
                web(ns, "failed"),
                Some(PodStatusSpec::not_ready(["10.3.0.3"]).phase("Failed")),
            )
            .await?;
            pod(cp, web(ns, "noip"), None).await?;
            pod(
                cp,
                web(ns, "terminating"),
                Some(PodStatusSpec::ready(["10.3.0.4"])),
            )
            .await?;
            cp.delete_pod_gracefully(ns, "terminating", 3600).await?;
            wait_for(cp, ns, "web", |ep| {
                let s = only_subset(ep)?;
                expect("addresses", ips(&s.addresses), vec!["10.3.0.1".to_string()])?;
                expect("notReadyAddresses", ips(&s.not_ready_addresses), vec![])
            })
            .await
        }
        "publish-not-ready" => {
            cp.create_service(web_service(ns).publish_not_ready_addresses())
                .await?;
            pod(
                cp,
                web(ns, "notready"),
                Some(PodStatusSpec::not_ready(["10.4.0.1"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "terminating"),
                Some(PodStatusSpec::ready(["10.4.0.2"])),
            )
            .await?;
            cp.delete_pod_gracefully(ns, "terminating", 3600).await?;
            wait_for(cp, ns, "web", |ep| {
                let s = only_subset(ep)?;
                expect(
                    "addresses",
                    ips(&s.addresses),
                    vec!["10.4.0.1".into(), "10.4.0.2".into()],
                )
            })
            .await
        }
        "empty-selector" => {
            // `selector: {}` does not survive the API server: it is stored as no
            // selector, so upstream (checked against kube-controller-manager
            // v1.36.3) and endpoints-guard both leave the Service alone.
            cp.create_service(
                ServiceBuilder::new(ns, "all")
                    .port("p", 80, 80, "TCP")
                    .spec(|s| s.selector = Some(BTreeMap::new())),
            )
            .await?;
            pod(
                cp,
                PodBuilder::new(ns, "a").label("x", "1"),
                Some(PodStatusSpec::ready(["10.5.0.1"])),
            )
            .await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            expect(
                "Endpoints of a Service stored without selector",
                endpoints(cp, ns, "all").await?.is_some(),
                false,
            )
        }
        "ipv6-family" => {
            cp.create_service(web_service(ns).spec(|s| {
                s.ip_family_policy = Some("PreferDualStack".into());
                s.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
            }))
            .await?;
            pod(
                cp,
                web(ns, "dual"),
                Some(PodStatusSpec::ready(["10.6.0.1", "fd00:10:6::1"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "v4only"),
                Some(PodStatusSpec::ready(["10.6.0.2"])),
            )
            .await?;
            wait_for(cp, ns, "web", |ep| {
                expect(
                    "addresses",
                    ips(&only_subset(ep)?.addresses),
                    vec!["fd00:10:6::1".into()],
                )
            })
            .await
        }
        "named-ports-sidecar" => {
            cp.create_service(web_service(ns).named_port("proxy", 15001, "proxy", "TCP"))
                .await?;
            pod(
                cp,
                web(ns, "both").sidecar_port("proxy", 15001, "TCP"),
                Some(PodStatusSpec::ready(["10.7.0.1"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "httponly"),
                Some(PodStatusSpec::ready(["10.7.0.2"])),
            )
            .await?;
            // Upstream groups ports by the set of addresses offering them: http is
            // offered by both pods, proxy only by the one with the sidecar.
            wait_for(cp, ns, "web", |ep| {
                let subsets = ep.subsets.clone().unwrap_or_default();
                let mut shapes: Vec<(Vec<String>, Vec<String>)> = subsets
                    .iter()
                    .map(|s| {
                        (
                            ips(&s.addresses),
                            s.ports
                                .iter()
                                .flatten()
                                .filter_map(|p| p.name.clone())
                                .collect(),
                        )
                    })
                    .collect();
                shapes.sort();
                expect(
                    "subsets (addresses, port names)",
                    shapes,
                    vec![
                        (vec!["10.7.0.1".into()], vec!["proxy".into()]),
                        (
                            vec!["10.7.0.1".into(), "10.7.0.2".into()],
                            vec!["http".into()],
                        ),
                    ],
                )
            })
            .await
        }
        "hostname-subdomain" => {
            cp.create_service(web_service(ns).headless()).await?;
            pod(
                cp,
                web(ns, "named").hostname("h1").subdomain("web"),
                Some(PodStatusSpec::ready(["10.8.0.1"])),
            )
            .await?;
            pod(
                cp,
                web(ns, "other").hostname("h2").subdomain("elsewhere"),
                Some(PodStatusSpec::ready(["10.8.0.2"])),
            )
            .await?;
            wait_for(cp, ns, "web", |ep| {
                let s = only_subset(ep)?;
                let hosts: Vec<Option<String>> = s
                    .addresses
                    .iter()
                    .flatten()
                    .map(|a| a.hostname.clone())
                    .collect();
                expect("hostnames", hosts, vec![Some("h1".into()), None])?;
                let labels = ep.metadata.labels.clone().unwrap_or_default();
                expect(
                    "headless label",
                    labels.get("service.kubernetes.io/headless").cloned(),
                    Some(String::new()),
                )
            })
            .await
        }
        "node-and-target-ref" => {
            cp.create_service(web_service(ns).label("team", "x"))
                .await?;
            let p = pod(cp, web(ns, "p"), Some(PodStatusSpec::ready(["10.9.0.1"]))).await?;
            let uid = p.metadata.uid.clone();
            let r = wait_for(cp, ns, "web", |ep| {
                let a = only_subset(ep)?.addresses.clone().unwrap_or_default();
                let t = a
                    .first()
                    .and_then(|a| a.target_ref.clone())
                    .ok_or("no targetRef")?;
                expect("nodeName", a[0].node_name.as_deref(), Some("node-a"))?;
                expect(
                    "targetRef",
                    (
                        t.kind.as_deref(),
                        t.namespace.as_deref(),
                        t.name.as_deref(),
                        t.resource_version.is_none(),
                    ),
                    (Some("Pod"), Some("node-and-target-ref"), Some("p"), true),
                )?;
                let labels = ep.metadata.labels.clone().unwrap_or_default();
                expect(
                    "labels",
                    (
                        labels.get("team").cloned(),
                        labels.get(MANAGED_BY).cloned(),
                        labels.contains_key("service.kubernetes.io/headless"),
                    ),
                    (Some("x".into()), Some("endpoints-guard".into()), false),
                )?;
                let annotations = ep.metadata.annotations.clone().unwrap_or_default();
                let trigger = annotations
                    .get("endpoints.kubernetes.io/last-change-trigger-time")
                    .cloned()
                    .unwrap_or_default();
                expect(
                    "trigger-time annotation in RFC 3339, UTC",
                    trigger.ends_with('Z') && trigger.contains('T'),
                    true,
                )
            })
            .await;
            let got = endpoints(cp, ns, "web").await?;
            let got_uid = got.and_then(|e| {
                e.subsets?
                    .first()?
                    .addresses
                    .as_ref()?
                    .first()?
                    .target_ref
                    .clone()?
                    .uid
            });
            r.and(expect("targetRef.uid", got_uid, uid))
        }
        "readiness-flip" => {
            cp.create_service(web_service(ns)).await?;
            pod(cp, web(ns, "p"), Some(PodStatusSpec::ready(["10.10.0.1"]))).await?;
            if let Err(e) = wait_for(cp, ns, "web", |ep| {
                expect(
                    "addresses",
                    ips(&only_subset(ep)?.addresses),
                    vec!["10.10.0.1".into()],
                )
            })
            .await
            {
                return Ok(Err(format!("before the flip: {e}")));
            }
            cp.set_pod_status(ns, "p", PodStatusSpec::not_ready(["10.10.0.1"]))
                .await?;
            wait_for(cp, ns, "web", |ep| {
                expect(
                    "notReadyAddresses",
                    ips(&only_subset(ep)?.not_ready_addresses),
                    vec!["10.10.0.1".into()],
                )
            })
            .await
        }
        "foreign-write-repaired" => {
            cp.create_service(web_service(ns)).await?;
            pod(cp, web(ns, "p"), Some(PodStatusSpec::ready(["10.12.0.1"]))).await?;
            if let Err(e) = wait_for(cp, ns, "web", |ep| {
                expect(
                    "addresses",
                    ips(&only_subset(ep)?.addresses),
                    vec!["10.12.0.1".into()],
                )
            })
            .await
            {
                return Ok(Err(format!("before the foreign write: {e}")));
            }
            // Someone else rewrites the addresses; the Endpoints change event
            // brings the Service back to the queue and the write is undone.
            Api::<Endpoints>::namespaced(cp.client(), ns)
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"subsets": [{"addresses": [{"ip": "10.12.9.9"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]})),
                )
                .await?;
            wait_for(cp, ns, "web", |ep| {
                expect(
                    "addresses",
                    ips(&only_subset(ep)?.addresses),
                    vec!["10.12.0.1".into()],
                )
            })
            .await
        }
        "external-name" => {
            cp.create_service(
                ServiceBuilder::new(ns, "ext")
                    .selector("app", "web")
                    .spec(|s| {
                        s.type_ = Some("ExternalName".into());
                        s.external_name = Some("example.invalid".into());
                    }),
            )
            .await?;
            pod(cp, web(ns, "p"), Some(PodStatusSpec::ready(["10.11.0.1"]))).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            expect(
                "Endpoints of an ExternalName Service",
                endpoints(cp, ns, "ext").await?.is_some(),
                false,
            )
        }
        "selectorless-untouched" => {
            cp.create_service(ServiceBuilder::new(ns, "manual").port("p", 80, 80, "TCP"))
                .await?;
            let user: Endpoints =
                serde_json::from_value(json!({"metadata": {"name": "manual", "namespace": ns},
                "subsets": [{"addresses": [{"ip": "192.0.2.1"}], "ports": [{"port": 80}]}]}))?;
            let created = Api::<Endpoints>::namespaced(cp.client(), ns)
                .create(&PostParams::default(), &user)
                .await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let now = endpoints(cp, ns, "manual").await?;
            expect(
                "user Endpoints resourceVersion",
                now.and_then(|e| e.metadata.resource_version),
                created.metadata.resource_version,
            )
        }
        "adopt" => {
            wait_for(cp, ns, "web", |ep| {
                let labels = ep.metadata.labels.clone().unwrap_or_default();
                expect(
                    "managed-by",
                    labels.get(MANAGED_BY).map(String::as_str),
                    Some("endpoints-guard"),
                )?;
                expect(
                    "addresses",
                    ips(&only_subset(ep)?.addresses),
                    vec!["10.1.0.1".into()],
                )
            })
            .await
        }
        "sweep" => {
            let mut r = Ok(());
            for gone in ["orphan-upstream", "orphan-ours"] {
                let mut left = true;
                for _ in 0..100 {
                    if endpoints(cp, ns, gone).await?.is_none() {
                        left = false;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if left {
                    r = Err(format!("{gone} was not deleted by the start-up sweep"));
                }
            }
            r.and(expect(
                "user's orphan kept",
                endpoints(cp, ns, "orphan-user").await?.is_some(),
                true,
            ))
        }
        other => Err(format!("no such row {other}")),
    };
    Ok(r)
}

const ROWS: &[&str] = &[
    "readiness-placement",
    "dropped-pods",
    "publish-not-ready",
    "empty-selector",
    "ipv6-family",
    "named-ports-sidecar",
    "hostname-subdomain",
    "node-and-target-ref",
    "readiness-flip",
    "foreign-write-repaired",
    "external-name",
    "selectorless-untouched",
    "adopt",
    "sweep",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_rows_then_quiet_steady_state() -> anyhow::Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    before_start(&cp).await?;
    let guard = Guard::start(cp.client(), &["--resync-interval", "0"]).await?;

    let results = futures::future::join_all(
        ROWS.iter()
            .map(|name| async { (*name, row(&cp, name).await) }),
    )
    .await;
    let mut failures = Vec::new();
    for (name, result) in results {
        match result {
            Ok(Ok(())) => eprintln!("row {name}: ok"),
            Ok(Err(why)) => failures.push(format!("{name}: {why}")),
            Err(err) => failures.push(format!("{name}: setup failed: {err:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "parity rows failed:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        guard.metric("endpoints_guard_unmanaged_orphan_endpoints{scope=\"cluster\"}"),
        1.0,
        "the user's orphan is reported"
    );

    // A pod change that touches nothing Endpoints are made of must not cause a write.
    let before = endpoints(&cp, "readiness-placement", "web")
        .await?
        .and_then(|e| e.metadata.resource_version);
    Api::<Pod>::namespaced(cp.client(), "readiness-placement")
        .patch(
            "ready",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await?;

    // Steady state: 60 s with no changes, counted by an independent watch.
    let writes_before = guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}");
    let eps: Api<Endpoints> = Api::all(cp.client());
    let rv = eps
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let stream = eps.watch(&WatchParams::default().timeout(90), &rv).await?;
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            while let Some(event) = stream.next().await {
                if let Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) =
                    event
                {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    counter.abort();
    let writes = seen.load(Ordering::SeqCst);
    let after = endpoints(&cp, "readiness-placement", "web")
        .await?
        .and_then(|e| e.metadata.resource_version);
    eprintln!("steady state: {writes} Endpoints writes seen by an independent watch in 60 s");
    assert_eq!(
        before, after,
        "an annotation-only pod change rewrote Endpoints"
    );
    assert_eq!(writes, 0, "Endpoints were written in steady state");
    assert_eq!(
        guard.metric("endpoints_guard_endpoints_writes_total{verb=\"update\"}"),
        writes_before
    );
    guard.stop().await;
    Ok(())
}
