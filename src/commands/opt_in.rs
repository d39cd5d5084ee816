//! `endpoints-guard opt-in`, `opt-out` and `hand-back --all`: the steps of
//! docs/opt-in.md, each followed by its wait, so that the Service's ready
//! endpoints are published by someone at every moment.
//!
//! They patch Services with the caller's own credentials (a person's
//! kubeconfig: the controller itself never changes a Service), each patch
//! carrying the resourceVersion it was planned from, so a change made in
//! between (a GitOps sync) is refused rather than overwritten. `--dry-run`
//! prints the patches and changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::service_view::{ServiceName, ServiceView, Standing};
use crate::config::StepArgs;
use crate::desired::scope::{
    ANNOTATION_ENDPOINTS, ANNOTATION_SELECTOR, LABEL_OPT_IN, LABEL_SKIP_MIRROR, OptInState,
};
use crate::desired::slices::UPSTREAM_SLICE_MANAGER;
use crate::desired::{MANAGER, UPSTREAM_MANAGER};
use crate::error::{Error, Result};

/// The field manager of the subcommands' patches: what a GitOps tool's
/// diff names as the one who changed the Service.
pub const CLI_FIELD_MANAGER: &str = "endpoints-guard-cli";

/// How often the waits read again.
const POLL: Duration = Duration::from_secs(1);

/// Opts `name` in: the selector into the annotation and the labels on;
/// once endpoints-guard's slices list every ready address upstream's do,
/// `spec.selector` goes; returns once endpoints-guard alone publishes.
pub async fn opt_in(client: &Client, name: &ServiceName, options: StepArgs) -> Result<()> {
    let view = ServiceView::read(client, name).await?;
    let standing = view.standing();
    let Some(selector) = view.spec_selector().cloned() else {
        return match standing {
            Standing::State(OptInState::Protecting) => {
                say(name, "already opted in; endpoints-guard publishes it alone");
                Ok(())
            }
            _ => Err(Error::Config(format!(
                "Service {name} has no spec.selector to opt in with ({standing}): put its selector in annotation {ANNOTATION_SELECTOR} and label it {LABEL_OPT_IN}=true yourself (docs/opt-in.md)"
            ))),
        };
    };
    if selector.is_empty() {
        return Err(Error::Config(format!(
            "Service {name} has an empty spec.selector (every pod of the namespace): endpoints-guard does not take such a Service"
        )));
    }
    if let Some(annotated) = view.annotated_selector()
        && annotated != selector
    {
        return Err(Error::Config(format!(
            "Service {name}: annotation {ANNOTATION_SELECTOR} {annotated:?} differs from spec.selector {selector:?}; remove the annotation or make it equal first"
        )));
    }
    let selector_json =
        serde_json::to_string(&selector).map_err(|e| Error::Config(e.to_string()))?;
    let mark = json!({"metadata": {
        "resourceVersion": view.resource_version(),
        "labels": {LABEL_OPT_IN: "true", LABEL_SKIP_MIRROR: "true"},
        "annotations": {ANNOTATION_SELECTOR: selector_json},
    }});
    let unselect =
        json!({"metadata": {"resourceVersion": "<after step 1>"}, "spec": {"selector": null}});
    if options.dry_run {
        dry_run(name, 1, "label it and copy its selector", &mark);
        say(
            name,
            "2. wait until endpoints-guard's slices list every ready address upstream's do",
        );
        dry_run(name, 3, "remove spec.selector", &unselect);
        say(
            name,
            "4. wait until upstream's slices are gone and endpoints-guard publishes alone",
        );
        return Ok(());
    }
    let marked = patch(client, name, &mark).await?;
    say(
        name,
        "1. labelled and annotated; endpoints-guard publishes beside upstream",
    );
    let beside = wait(client, name, options.timeout, "endpoints-guard's slices beside upstream's", |v| {
        !v.slices_of(MANAGER).is_empty() && v.ready_of(MANAGER).is_superset(&v.ready_of(UPSTREAM_SLICE_MANAGER))
    })
    .await
    .map_err(|why| {
        Error::Config(format!(
            "{why}. Is endpoints-guard running, leading, in opt-in scope? Nothing was removed: {name} is opted in beside upstream (undo: endpoints-guard opt-out {name})"
        ))
    })?;
    let unselect = json!({"metadata": {"resourceVersion": marked.metadata.resource_version}, "spec": {"selector": null}});
    patch(client, name, &unselect).await.map_err(|err| {
        Error::Config(format!(
            "{err}: {name} changed since step 1 (a GitOps sync?); it is opted in beside upstream, nothing removed. Run opt-in again"
        ))
    })?;
    say(
        name,
        &format!(
            "2. endpoints-guard lists {} ready address(es); 3. spec.selector removed",
            beside.ready_of(MANAGER).len()
        ),
    );
    let taken = wait(client, name, options.timeout, "endpoints-guard publishing alone", |v| {
        v.standing() == Standing::State(OptInState::Protecting)
            && !v.upstream_slices_exist()
            && !v.slices_of(MANAGER).is_empty()
    })
    .await
    .map_err(|why| {
        Error::Config(format!(
            "{why}. upstream's slices keep serving until endpoints-guard takes over; see its Events: kubectl -n {} get events --field-selector involvedObject.name={}",
            name.namespace, name.name
        ))
    })?;
    say(
        name,
        &format!(
            "4. opted in: endpoints-guard alone publishes {} ready address(es)",
            taken.ready_of(MANAGER).len()
        ),
    );
    Ok(())
}

/// Opts `name` out: the hand-back of one Service.
pub async fn opt_out(client: &Client, name: &ServiceName, options: StepArgs) -> Result<()> {
    let view = ServiceView::read(client, name).await?;
    if view.standing() == Standing::NotOptedIn && !view.is_marked() {
        say(name, "not opted in; nothing to do");
        return Ok(());
    }
    hand_back(client, vec![view], options).await
}

/// Every Service endpoints-guard publishes (of `namespace`, or all) back to
/// kube-controller-manager, together, as `opt-out` hands back one.
pub async fn hand_back_all(
    client: &Client,
    namespace: Option<&str>,
    options: StepArgs,
) -> Result<()> {
    let views = super::status::marked_services(client, namespace).await?;
    let views: Vec<ServiceView> = views
        .into_iter()
        .filter(|v| v.standing() != Standing::NotOptedIn || v.is_marked())
        .collect();
    if views.is_empty() {
        println!("no Service is opted in");
        return Ok(());
    }
    hand_back(client, views, options).await
}

/// One Service's way back to upstream.
struct Handing {
    view: ServiceView,
    /// The selector it gets back (`None`: it has one).
    restore: Option<BTreeMap<String, String>>,
}

/// Hands `views` back to kube-controller-manager, all together, step by
/// step: 1. each gets its `spec.selector` back (from the annotation); 2.
/// wait until upstream's slices list every ready address endpoints-guard's
/// do; 3. the opt-in label and annotations go; 4. endpoints-guard removes
/// its slices (if it does not, being down, they are deleted here: upstream's
/// cover them). A Service whose selector cannot be restored (no usable
/// annotation) is left as it is and named in the error.
async fn hand_back(client: &Client, views: Vec<ServiceView>, options: StepArgs) -> Result<()> {
    let mut failed: Vec<String> = Vec::new();
    let mut handing: Vec<Handing> = Vec::new();
    for view in views {
        let restore = match (view.spec_selector(), view.annotated_selector()) {
            (Some(_), _) => None,
            (None, Some(selector)) => Some(selector),
            (None, None) => {
                failed.push(format!(
                    "{}: no spec.selector and no usable annotation {ANNOTATION_SELECTOR}; give it its selector by hand",
                    view.name
                ));
                continue;
            }
        };
        handing.push(Handing { view, restore });
    }
    // 1. Selectors back.
    for item in &mut handing {
        let Some(selector) = &item.restore else {
            continue;
        };
        let body = json!({"metadata": {"resourceVersion": item.view.resource_version()}, "spec": {"selector": selector}});
        if options.dry_run {
            dry_run(&item.view.name, 1, "give it its selector back", &body);
            continue;
        }
        match patch(client, &item.view.name, &body).await {
            Ok(_) => say(
                &item.view.name,
                "1. spec.selector back: kube-controller-manager publishes beside endpoints-guard",
            ),
            Err(err) => failed.push(format!("{}: {err}", item.view.name)),
        }
    }
    // 2. Upstream covers ours.
    let mut covered: Vec<ServiceView> = Vec::new();
    for item in &handing {
        let name = &item.view.name;
        if options.dry_run {
            say(
                name,
                "2. wait until kube-controller-manager's slices list every ready address endpoints-guard's do",
            );
            covered.push(item.view.clone());
            continue;
        }
        if failed.iter().any(|f| f.starts_with(&format!("{name}:"))) {
            continue;
        }
        match wait(client, name, options.timeout, "kube-controller-manager's slices covering endpoints-guard's", upstream_covers).await {
            Ok(view) => covered.push(view),
            Err(why) => failed.push(format!(
                "{name}: {why}; its selector is back and endpoints-guard keeps publishing: nothing lost (is kube-controller-manager's endpointslice controller running?)"
            )),
        }
    }
    // 3. The opt-in goes.
    for view in &covered {
        let name = &view.name;
        let body = json!({"metadata": {
            "resourceVersion": view.resource_version(),
            "labels": {LABEL_OPT_IN: null, LABEL_SKIP_MIRROR: null},
            "annotations": {ANNOTATION_SELECTOR: null, ANNOTATION_ENDPOINTS: null},
        }});
        if options.dry_run {
            dry_run(name, 3, "remove the opt-in label and annotations", &body);
            say(
                name,
                "4. wait until endpoints-guard's slices are gone (deleted here if it does not)",
            );
            continue;
        }
        if let Err(err) = patch(client, name, &body).await {
            failed.push(format!("{name}: {err}"));
            continue;
        }
        say(name, "3. opt-in label and annotations removed");
        match finish(client, name, options.timeout).await {
            Ok(note) => say(name, &format!("4. {note}")),
            Err(err) => failed.push(format!("{name}: {err}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{} Service(s) not handed back: {}",
            failed.len(),
            failed.join("; ")
        )))
    }
}

/// Whether upstream's slices list every ready address endpoints-guard's do.
fn upstream_covers(view: &ServiceView) -> bool {
    view.ready_of(UPSTREAM_SLICE_MANAGER)
        .is_superset(&view.ready_of(MANAGER))
        && !view.slices_of(UPSTREAM_SLICE_MANAGER).is_empty()
}

/// Waits for endpoints-guard to remove its slices of the opted-out
/// Service; deletes those left after half the timeout, while upstream's
/// still cover them (endpoints-guard is down), each with the UID and
/// resourceVersion read. Then waits for upstream to rewrite the Endpoints.
async fn finish(client: &Client, name: &ServiceName, timeout: Duration) -> Result<String> {
    let gone = |v: &ServiceView| v.slices_of(MANAGER).is_empty();
    let note = match wait(
        client,
        name,
        timeout / 2,
        "endpoints-guard's slices gone",
        gone,
    )
    .await
    {
        Ok(_) => "opted out: endpoints-guard removed its slices".to_string(),
        Err(_) => {
            let view = ServiceView::read(client, name).await?;
            if !upstream_covers(&view) {
                return Err(Error::Config(
                    "endpoints-guard's slices are still there and upstream's no longer cover them; left as they are".into(),
                ));
            }
            let ours = view.slices_of(MANAGER);
            delete_slices(client, name, &ours).await?;
            format!(
                "opted out: endpoints-guard did not remove its {} slice(s) (is it running?); deleted here, upstream's covering them",
                ours.len()
            )
        }
    };
    let rewritten = |v: &ServiceView| v.endpoints_manager().as_deref() != Some(MANAGER);
    match wait(
        client,
        name,
        timeout,
        "kube-controller-manager's Endpoints",
        rewritten,
    )
    .await
    {
        Ok(view) => Ok(format!(
            "{note}; Endpoints by {}",
            view.endpoints_manager()
                .unwrap_or_else(|| UPSTREAM_MANAGER.to_string())
        )),
        Err(why) => Ok(format!(
            "{note}; {why} (upstream's Endpoints controller rewrites them when it syncs)"
        )),
    }
}

async fn delete_slices(
    client: &Client,
    name: &ServiceName,
    slices: &[EndpointSlice],
) -> Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &name.namespace);
    for slice in slices {
        let slice_name = slice.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: slice.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&slice_name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(Error::kube("deleting an EndpointSlice", slice_name, err)),
        }
    }
    Ok(())
}

/// Reads `name` every second until `done` holds (returns that view), or
/// fails after `timeout` with what was waited for and where things stood.
async fn wait(
    client: &Client,
    name: &ServiceName,
    timeout: Duration,
    what: &str,
    done: impl Fn(&ServiceView) -> bool,
) -> std::result::Result<ServiceView, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let view = ServiceView::read(client, name)
            .await
            .map_err(|err| format!("{name}: {err}"))?;
        if done(&view) {
            return Ok(view);
        }
        if tokio::time::Instant::now() + POLL > deadline {
            return Err(format!(
                "{name}: no {what} within {timeout:?} (state {}, ready addresses by manager {:?})",
                view.standing(),
                view.publishers()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A JSON merge patch of the Service, as the CLI's field manager.
async fn patch(client: &Client, name: &ServiceName, body: &Value) -> Result<Service> {
    let api: Api<Service> = Api::namespaced(client.clone(), &name.namespace);
    let params = PatchParams {
        field_manager: Some(CLI_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch(&name.name, &params, &Patch::Merge(body))
        .await
        .map_err(|e| Error::kube("patching the Service", name.to_string(), e))
}

fn dry_run(name: &ServiceName, step: u32, what: &str, body: &Value) {
    say(
        name,
        &format!(
            "{step}. would {what}: kubectl -n {} patch svc {} --type=merge -p '{body}'",
            name.namespace, name.name
        ),
    );
}

fn say(name: &ServiceName, what: &str) {
    println!("{name}: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn slice(manager: &str, ready: &[&str]) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{manager}"), "labels": {
                "kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": manager}},
            "addressType": "IPv4",
            "endpoints": ready.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        }))
        .unwrap_or_else(|e| panic!("slice: {e}"))
    }

    fn view(slices: Vec<EndpointSlice>) -> ServiceView {
        ServiceView {
            name: ServiceName {
                namespace: "shop".into(),
                name: "web".into(),
            },
            service: Service::default(),
            slices,
            endpoints: None,
        }
    }

    #[test]
    fn upstream_covers_only_with_every_ready_address_of_ours() {
        let both = view(vec![
            slice(MANAGER, &["10.0.0.1", "10.0.0.2"]),
            slice(UPSTREAM_SLICE_MANAGER, &["10.0.0.1"]),
        ]);
        assert!(!upstream_covers(&both));
        let more = view(vec![
            slice(MANAGER, &["10.0.0.1"]),
            slice(UPSTREAM_SLICE_MANAGER, &["10.0.0.1", "10.0.0.2"]),
        ]);
        assert!(upstream_covers(&more));
        assert_eq!(more.ready_of(MANAGER).len(), 1);
        let none = view(vec![slice(MANAGER, &[])]);
        assert!(!upstream_covers(&none), "no slice of upstream's yet");
    }
}
