//! The control API, on its own loopback port:
//!
//! | request | body | effect |
//! | --- | --- | --- |
//! | `GET /stats` | | counters per resource, open streams, faults |
//! | `GET /faults` | | the faults in force |
//! | `POST /faults` | `{"resource":"services","fault":"drop-deletes", ...}` | sets a fault |
//! | `DELETE /faults[?resource=R]` | | clears faults (and stale snapshots) |
//! | `POST /actions/replay-old-delete` | `{"resource","namespace","name"[,"pace_ms"]}` | failure A on command |
//! | `POST /actions/inject-error` | `{"resource","code":410\|500}` | ERROR event to open watches |
//! | `POST /actions/cut-streams` | `{"resource"?}` | aborts open watches mid-stream |
//! | `POST /actions/silence-streams` | `{"resource"?}` | open watches go half-open: open, silent |
//! | `POST /actions/snapshot` | `{"resource"[,"path"]}` | retakes the stale-list snapshot |

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::{Body, json_response};
use super::faults::{FaultKind, FaultSpec};
use super::proxy::Proxy;

#[derive(Debug, Deserialize)]
struct ObjectRef {
    resource: String,
    #[serde(default)]
    namespace: Option<String>,
    name: String,
    #[serde(default)]
    pace_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ErrorRequest {
    resource: String,
    code: u16,
}

#[derive(Debug, Default, Deserialize)]
struct ResourceRef {
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    path: Option<String>,
}

/// A refused control request: its status and message.
#[derive(Debug)]
struct Reject(StatusCode, String);

impl Reject {
    fn into_response(self) -> Response<Body> {
        json_response(self.0, &json!({"error": self.1}))
    }
}

fn bad_request(message: impl std::fmt::Display) -> Reject {
    Reject(StatusCode::BAD_REQUEST, message.to_string())
}

fn ok(value: Value) -> Response<Body> {
    json_response(StatusCode::OK, &value)
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, Reject> {
    serde_json::from_slice(bytes).map_err(|e| bad_request(format!("bad JSON body: {e}")))
}

/// A body that may name a resource; empty: every resource.
fn optional_resource(body: &[u8]) -> Result<ResourceRef, Reject> {
    if body.is_empty() {
        Ok(ResourceRef::default())
    } else {
        parse(body)
    }
}

/// Answers one control request.
pub async fn handle(
    proxy: Arc<Proxy>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let bytes = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => return Ok(bad_request(format!("reading the body: {err}")).into_response()),
    };
    Ok(route(&proxy, &method, &path, &query, &bytes)
        .await
        .unwrap_or_else(Reject::into_response))
}

async fn route(
    proxy: &Proxy,
    method: &Method,
    path: &str,
    query: &str,
    body: &[u8],
) -> Result<Response<Body>, Reject> {
    let shared = &proxy.shared;
    match (method.as_str(), path) {
        ("GET", "/healthz") => Ok(ok(json!({"ok": true}))),
        ("GET", "/stats") => Ok(ok(shared.stats_json())),
        ("GET", "/faults") => Ok(ok(shared.stats_json()["faults"].clone())),
        ("POST", "/faults") => {
            let spec: FaultSpec = parse(body)?;
            let mut answer = json!({"ok": true, "fault": spec});
            if spec.fault == FaultKind::StaleList {
                let rv = proxy
                    .snapshot(&spec.resource, &spec.collection_path())
                    .await
                    .map_err(|e| bad_request(format!("taking the snapshot: {e}")))?;
                answer["snapshot_rv"] = json!(rv);
            }
            shared.set_fault(spec);
            Ok(ok(answer))
        }
        ("DELETE", "/faults") => {
            let resource = query
                .split('&')
                .find_map(|p| p.strip_prefix("resource="))
                .filter(|r| !r.is_empty());
            shared.clear_faults(resource);
            Ok(ok(json!({"ok": true})))
        }
        ("POST", "/actions/replay-old-delete") => {
            let target: ObjectRef = parse(body)?;
            let key = match &target.namespace {
                Some(ns) if !ns.is_empty() => format!("{ns}/{}", target.name),
                _ => target.name.clone(),
            };
            let pace = target.pace_ms.unwrap_or(250);
            let (rv, streams) = proxy
                .replay_old_delete(&target.resource, &key, pace)
                .map_err(bad_request)?;
            Ok(ok(
                json!({"ok": true, "rv": rv, "open_watch_streams": streams}),
            ))
        }
        ("POST", "/actions/inject-error") => {
            let request: ErrorRequest = parse(body)?;
            if !matches!(request.code, 410 | 500) {
                return Err(bad_request("code must be 410 or 500"));
            }
            let streams = proxy.inject_error(&request.resource, request.code);
            Ok(ok(json!({"ok": true, "open_watch_streams": streams})))
        }
        ("POST", "/actions/cut-streams") => {
            let target = optional_resource(body)?;
            let streams = proxy.cut_streams(target.resource.as_deref());
            Ok(ok(json!({"ok": true, "open_watch_streams": streams})))
        }
        ("POST", "/actions/silence-streams") => {
            let target = optional_resource(body)?;
            let streams = proxy.silence_streams(target.resource.as_deref());
            Ok(ok(json!({"ok": true, "open_watch_streams": streams})))
        }
        ("POST", "/actions/snapshot") => {
            let target: ResourceRef = parse(body)?;
            let resource = target
                .resource
                .ok_or_else(|| bad_request("resource is required"))?;
            let path = target.path.unwrap_or_else(|| format!("/api/v1/{resource}"));
            let rv = proxy
                .snapshot(&resource, &path)
                .await
                .map_err(|e| bad_request(format!("taking the snapshot: {e}")))?;
            Ok(ok(json!({"ok": true, "snapshot_rv": rv})))
        }
        _ => Err(Reject(
            StatusCode::NOT_FOUND,
            format!("no such control endpoint: {method} {path}"),
        )),
    }
}
