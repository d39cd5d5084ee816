//! What a pass reads: the pods our objects name and their Services, those
//! behind ready addresses first.

use std::collections::HashSet;

use hardened_watcher::{Cached, ObjectKey};

use super::{Kind, Target};
use crate::reconcile::Context;

/// Every pod an address of our Endpoints or an endpoint of our slices names,
/// and every Service with Endpoints or slices of ours, that the caches hold
/// now; each once. Pods behind a ready address come first: a ghost among
/// them is where traffic goes and fails, so a pass reads them before the
/// rest (not-ready and terminating pods, Services).
pub(super) fn targets(ctx: &Context) -> Vec<Target> {
    let managers = ctx.policy.scope.managers();
    // (Service key, the pods its objects name, each with whether it is
    // named by a ready address), from either controller.
    let mut named: Vec<(ObjectKey, Vec<(String, bool)>)> = Vec::new();
    let endpoints: Vec<_> = ctx.stores.endpoints.with_cache(|endpoints| {
        endpoints
            .iter()
            .filter(|ep| managers.endpoints(ep.managed_by()))
            .cloned()
            .collect()
    });
    for ep in endpoints {
        let Ok(decoded) = ep.decode() else { continue };
        let subsets = decoded.subsets.iter().flatten();
        let pods = subsets
            .flat_map(|s| {
                let ready = s.addresses.iter().flatten().map(|a| (a, true));
                let not_ready = s.not_ready_addresses.iter().flatten().map(|a| (a, false));
                ready.chain(not_ready)
            })
            .filter_map(|(address, ready)| {
                let target = address.target_ref.as_ref()?;
                (target.kind.as_deref() == Some("Pod")).then_some(())?;
                Some((target.name.clone()?, ready))
            })
            .collect();
        named.push((ep.key(), pods));
    }
    let slices: Vec<_> = ctx.stores.slices.with_cache(|slices| {
        slices
            .iter()
            .filter(|s| s.is_ours(managers))
            .cloned()
            .collect()
    });
    for slice in slices {
        let (Some(key), Ok(decoded)) = (slice.service_key(), slice.decode()) else {
            continue;
        };
        let pods = decoded
            .endpoints
            .iter()
            .flatten()
            .filter_map(|endpoint| {
                let target = endpoint.target_ref.as_ref()?;
                (target.kind.as_deref() == Some("Pod")).then_some(())?;
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                Some((target.name.clone()?, ready))
            })
            .collect();
        named.push((key, pods));
    }

    let services = &ctx.stores.services;
    let pod_store = &ctx.stores.pods;
    let mut seen: HashSet<(Kind, ObjectKey)> = HashSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    // Ready before not ready, so a pod named both ways counts as ready.
    let ordered = named.iter().flat_map(|(key, pods)| {
        pods.iter()
            .filter(|(_, ready)| *ready)
            .map(move |(name, _)| (key, name, true))
    });
    let not_ready = named.iter().flat_map(|(key, pods)| {
        pods.iter()
            .filter(|(_, ready)| !*ready)
            .map(move |(name, _)| (key, name, false))
    });
    for (key, name, ready) in ordered.chain(not_ready) {
        let pod_key = ObjectKey::new(key.namespace.clone(), name.as_str());
        if let Some(pod) = pod_store.get(&pod_key)
            && seen.insert((Kind::Pod, pod_key.clone()))
        {
            let target = Target {
                kind: Kind::Pod,
                uid: pod.uid().to_owned(),
                key: pod_key,
            };
            if ready {
                first.push(target)
            } else {
                rest.push(target)
            }
        }
    }
    for (key, _) in &named {
        if let Some(svc) = services.get(key)
            && seen.insert((Kind::Service, key.clone()))
        {
            rest.push(Target {
                kind: Kind::Service,
                uid: svc.uid().to_owned(),
                key: key.clone(),
            });
        }
    }
    first.extend(rest);
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass reads the pods behind ready addresses first (of Endpoints or
    /// slices), then the not-ready ones, then the Services.
    #[tokio::test]
    async fn a_pass_reads_pods_behind_ready_addresses_first() {
        use hardened_watcher::WatchEventKind::Added;

        use crate::reconcile::kinds::{CachedEndpoints, CachedService, CachedSlice};
        use crate::reconcile::testkit::{context, endpoints, pod, service};

        let ctx = context();
        ctx.stores
            .services
            .apply_watch_event(Added, CachedService::new(service("ns", "web", "web")));
        for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
            ctx.stores
                .pods
                .apply_watch_event(Added, pod("ns", name, "web", ip, "1"));
        }
        let mut ep = endpoints("ns", "web", &[("a", "10.0.0.1")]);
        let not_ready = endpoints("ns", "web", &[("b", "10.0.0.2")]);
        if let (Some(subset), Some(other)) = (
            ep.subsets.as_mut().and_then(|s| s.first_mut()),
            not_ready.subsets.and_then(|s| s.into_iter().next()),
        ) {
            subset.not_ready_addresses = other.addresses;
        }
        if let Some(cached) = CachedEndpoints::new(ep) {
            ctx.stores.endpoints.apply_watch_event(Added, cached);
        }
        let slice = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "uid": "s1", "resourceVersion": "3",
                "labels": {"kubernetes.io/service-name": "web",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false},
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "b", "uid": "b-uid"}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "c", "uid": "c-uid"}},
            ],
        }))
        .unwrap_or_else(|err| panic!("slice: {err}"));
        if let Some(cached) = CachedSlice::new(slice) {
            ctx.stores.slices.apply_watch_event(Added, cached);
        }
        let order: Vec<String> = targets(&ctx)
            .iter()
            .map(|t| format!("{:?} {}", t.kind, t.key.name))
            .collect();
        assert_eq!(order, ["Pod a", "Pod c", "Pod b", "Service web"]);
    }
}
