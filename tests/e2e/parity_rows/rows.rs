//! The parity rows of `tests/e2e/parity_rows.rs`, one function each: set up the
//! objects in namespace `ns`, then wait for the row's check.

use super::*;

pub async fn readiness_placement(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
        let s = only_subset(ep)?;
        expect("addresses", ips(&s.addresses), vec!["10.2.0.1".to_string()])?;
        expect(
            "notReadyAddresses",
            ips(&s.not_ready_addresses),
            vec!["10.2.0.2".into(), "10.2.0.3".into()],
        )
    })
    .await)
}

pub async fn dropped_pods(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
        let s = only_subset(ep)?;
        expect("addresses", ips(&s.addresses), vec!["10.3.0.1".to_string()])?;
        expect("notReadyAddresses", ips(&s.not_ready_addresses), vec![])
    })
    .await)
}

pub async fn publish_not_ready(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
        let s = only_subset(ep)?;
        expect(
            "addresses",
            ips(&s.addresses),
            vec!["10.4.0.1".into(), "10.4.0.2".into()],
        )
    })
    .await)
}

pub async fn empty_selector(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(expect(
        "Endpoints of a Service stored without selector",
        endpoints(cp, ns, "all").await?.is_some(),
        false,
    ))
}

pub async fn named_ports_sidecar(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
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
    .await)
}

pub async fn hostname_subdomain(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
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
    .await)
}

pub async fn node_and_target_ref(cp: &ControlPlane, ns: &str) -> RowResult {
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
            // Upstream's managed-by value: endpoints-guard writes it by default.
            (Some("x".into()), Some("endpoint-controller".into()), false),
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
    Ok(r.and(expect("targetRef.uid", got_uid, uid)))
}

pub async fn readiness_flip(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
        expect(
            "notReadyAddresses",
            ips(&only_subset(ep)?.not_ready_addresses),
            vec!["10.10.0.1".into()],
        )
    })
    .await)
}

pub async fn foreign_write_repaired(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(wait_for(cp, ns, "web", |ep| {
        expect(
            "addresses",
            ips(&only_subset(ep)?.addresses),
            vec!["10.12.0.1".into()],
        )
    })
    .await)
}

pub async fn external_name(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(expect(
        "Endpoints of an ExternalName Service",
        endpoints(cp, ns, "ext").await?.is_some(),
        false,
    ))
}

pub async fn selectorless_untouched(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(expect(
        "user Endpoints resourceVersion",
        now.and_then(|e| e.metadata.resource_version),
        created.metadata.resource_version,
    ))
}

pub async fn adopt(cp: &ControlPlane, ns: &str) -> RowResult {
    Ok(wait_for(cp, ns, "web", |ep| {
        let labels = ep.metadata.labels.clone().unwrap_or_default();
        // Adopted: upstream's label kept (endpoints-guard writes that value by
        // default), the addresses its own.
        expect(
            "managed-by",
            labels.get(MANAGED_BY).map(String::as_str),
            Some("endpoint-controller"),
        )?;
        expect(
            "addresses",
            ips(&only_subset(ep)?.addresses),
            vec!["10.1.0.1".into()],
        )
    })
    .await)
}

pub async fn sweep(cp: &ControlPlane, ns: &str) -> RowResult {
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
    Ok(r.and(expect(
        "user's orphan kept",
        endpoints(cp, ns, "orphan-user").await?.is_some(),
        true,
    )))
}
