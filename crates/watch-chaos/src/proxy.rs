//! The proxy itself: plain HTTP/1.1 on loopback in front, kube-apiserver over
//! TLS behind, watch streams transformed event by event per the faults in
//! force, on the wire (JSON or protobuf) the API server answered on.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::body::{Body, BoxError, full, json_response, status_response};
use super::credentials::Credentials;
use super::events::{self, rv_number};
use super::faults::FaultKind;
use super::protobuf;
use super::request::{Kind, Query, Target, classify, parse_path, parse_query};
use super::state::{Command, Shared, Snapshot};
use super::stream::{Pump, Replay, stream_body};
use super::wire::Wire;

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "host",
    // Never let the API server compress: the proxy reads the answers.
    "accept-encoding",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(HeaderName::from_static(name));
    }
    headers.remove(header::CONTENT_LENGTH);
}

/// The connection to kube-apiserver.
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    base: String,
    credentials: Credentials,
}

impl Upstream {
    /// From a kubeconfig (its CA, and its client certificate or token); `None`
    /// infers the configuration as kube clients do: $KUBECONFIG or
    /// ~/.kube/config, else in-cluster (`KUBERNETES_SERVICE_HOST`/`PORT`,
    /// the ServiceAccount's CA and projected token, which needs no cluster DNS).
    pub async fn from_kubeconfig(
        path: Option<&Path>,
        context: Option<String>,
    ) -> anyhow::Result<Self> {
        let options = KubeConfigOptions {
            context,
            ..KubeConfigOptions::default()
        };
        let config = match path {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
            }
            None if options.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
            None => kube::Config::infer().await?,
        };
        let credentials = Credentials::from_config(&config)?;
        let connector = config.rustls_https_connector()?;
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let base = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        Ok(Self {
            client,
            base,
            credentials,
        })
    }

    /// The API server's URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        mut parts: http::request::Parts,
        body: Body,
    ) -> Result<Response<Incoming>, BoxError> {
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = format!("{}{path}", self.base).parse()?;
        strip_hop_by_hop(&mut parts.headers);
        if !parts.headers.contains_key(header::AUTHORIZATION)
            && let Some(value) = self.credentials.header(Instant::now())?
        {
            parts.headers.insert(header::AUTHORIZATION, value);
        }
        Ok(self
            .client
            .request(Request::from_parts(parts, body))
            .await?)
    }

    /// GET `path` accepting `accept`: the answer's body and wire.
    async fn get(
        &self,
        path: &str,
        accept: &'static str,
    ) -> Result<(Bytes, Option<Wire>), BoxError> {
        let (mut parts, ()) = Request::get(path).body(())?.into_parts();
        parts
            .headers
            .insert(header::ACCEPT, header::HeaderValue::from_static(accept));
        let response = self.send(parts, full(Bytes::new())).await?;
        let status = response.status();
        let wire = Wire::of_answer(response.headers());
        let bytes = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            return Err(
                format!("GET {path}: {status}: {}", String::from_utf8_lossy(&bytes)).into(),
            );
        }
        Ok((bytes, wire))
    }

    async fn get_json(&self, path: &str) -> Result<Value, BoxError> {
        let (bytes, _) = self.get(path, "application/json").await?;
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// The proxy: shared state and the upstream connection.
pub struct Proxy {
    pub shared: Arc<Shared>,
    upstream: Upstream,
}

impl Proxy {
    pub fn new(upstream: Upstream) -> Self {
        Self {
            shared: Arc::new(Shared::new()),
            upstream,
        }
    }

    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Takes the snapshot that `stale-list` serves: a consistent LIST now.
    pub async fn snapshot(&self, resource: &str, path: &str) -> Result<String, BoxError> {
        let body = self.upstream.get_json(path).await?;
        let rv = body
            .get("metadata")
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // The same list for protobuf clients, read at exactly that RV.
        let separator = if path.contains('?') { '&' } else { '?' };
        let exact = format!("{path}{separator}resourceVersion={rv}&resourceVersionMatch=Exact");
        let protobuf = match self.upstream.get(&exact, protobuf::MEDIA_TYPE).await {
            Ok((bytes, Some(Wire::Protobuf))) => Some(bytes),
            Ok(_) => None,
            Err(err) => {
                warn!(resource, error = %err, "no protobuf snapshot: protobuf clients get the JSON one");
                None
            }
        };
        info!(resource, %rv, protobuf = protobuf.is_some(), "snapshot taken for stale lists");
        self.shared.set_snapshot(
            resource,
            Snapshot {
                rv: rv.clone(),
                body,
                protobuf,
            },
        );
        Ok(rv)
    }

    /// Failure A on command: sends the open watch streams of `resource` a
    /// DELETED event for the live object `namespace/name` carrying the RV of
    /// its last version (old), then ends them; a client resuming there gets
    /// the API server's replay of history, paced by `pace_ms`.
    pub fn replay_old_delete(
        &self,
        resource: &str,
        key: &str,
        pace_ms: u64,
    ) -> Result<(String, usize), String> {
        let (object, rv) = self
            .shared
            .live_object(resource, key)
            .ok_or_else(|| format!("no live {resource} {key} seen through the proxy"))?;
        self.shared.register_replay(resource, &rv, pace_ms);
        let namespace = key.split_once('/').map(|(ns, _)| ns.to_string());
        let streams = self.shared.broadcast(Command::Inject {
            resource: resource.to_string(),
            namespace,
            events: vec![events::deleted_event(&object, &rv)],
            close: true,
        });
        self.shared.bump(resource, "old_deletes_replayed");
        info!(resource, key, %rv, streams, "sent an old DELETE");
        Ok((rv, streams))
    }

    /// Sends ERROR `code` (410 Expired or 500 PrevKv=nil) to the open watch
    /// streams of `resource` and ends them.
    pub fn inject_error(&self, resource: &str, code: u16) -> usize {
        let rv = self.shared.max_rv(resource).to_string();
        let event = if code == 410 {
            events::expired_event(&rv)
        } else {
            events::prevkv_nil_event(resource, "injected", &rv)
        };
        self.shared.bump(resource, "errors_injected");
        self.shared.broadcast(Command::Inject {
            resource: resource.to_string(),
            namespace: None,
            events: vec![event],
            close: true,
        })
    }

    /// Aborts open watch streams mid-stream.
    pub fn cut_streams(&self, resource: Option<&str>) -> usize {
        self.shared.broadcast(Command::Cut {
            resource: resource.map(str::to_string),
        })
    }

    /// Makes the open watch streams of `resource` (all for `None`) half-open;
    /// returns how many streams took it.
    pub fn silence_streams(&self, resource: Option<&str>) -> usize {
        self.shared.broadcast(Command::Silence {
            resource: resource.map(str::to_string),
        })
    }

    /// Answers one client request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        debug!(method = %req.method(), uri = %req.uri(), "request");
        let target = parse_path(req.uri().path());
        let query = parse_query(req.uri().query());
        let kind = classify(req.method(), target.as_ref(), &query);
        if let Some(t) = &target {
            if self.shared.fault(&t.resource, FaultKind::Refuse).is_some() {
                self.shared.bump(&t.resource, "requests_refused");
                return Ok(status_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "refused by watch-chaos",
                ));
            }
            if let Some(delay) = self.shared.fault(&t.resource, FaultKind::Delay) {
                self.shared.bump(&t.resource, "requests_delayed");
                tokio::time::sleep(Duration::from_millis(delay.delay_ms())).await;
            }
            let get_one = req.method() == http::Method::GET
                && t.name.is_some()
                && t.subresource.is_none()
                && !query.watch;
            if get_one && self.shared.fault(&t.resource, FaultKind::Bare404).is_some() {
                self.shared.bump(&t.resource, "gets_answered_bare_404");
                let mut response = Response::new(full("404 page not found\n"));
                *response.status_mut() = StatusCode::NOT_FOUND;
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                return Ok(response);
            }
        }
        let (parts, body) = req.into_parts();
        let body = body.map_err(|e| Box::new(e) as BoxError).boxed_unsync();
        if parts.uri.path() == "/version"
            && let Some(spec) = self.shared.fault("version", FaultKind::ServerVersion)
        {
            self.shared.bump("version", "versions_rewritten");
            return Ok(self
                .newer_version(parts, body, spec.minor())
                .await
                .unwrap_or_else(|err| {
                    status_response(
                        StatusCode::BAD_GATEWAY,
                        "InternalError",
                        &format!("watch-chaos: upstream: {err}"),
                    )
                }));
        }
        let result = match (kind, target) {
            (Kind::Watch, Some(t)) => self.watch(t, query, parts, body).await,
            (Kind::List, Some(t)) => self.list(t, query, parts, body).await,
            _ => self.upstream.send(parts, body).await.map(passthrough),
        };
        Ok(result.unwrap_or_else(|err| {
            warn!(error = %err, "upstream request failed");
            status_response(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                &format!("watch-chaos: upstream: {err}"),
            )
        }))
    }

    /// The server's `/version` with its minor replaced by `minor`.
    async fn newer_version(
        &self,
        parts: http::request::Parts,
        body: Body,
        minor: u64,
    ) -> Result<Response<Body>, BoxError> {
        let response = self.upstream.send(parts, body).await?;
        let bytes = response.into_body().collect().await?.to_bytes();
        let mut version: Value = serde_json::from_slice(&bytes)?;
        let major = version["major"].as_str().unwrap_or("1").to_string();
        version["minor"] = Value::String(minor.to_string());
        version["gitVersion"] = Value::String(format!("v{major}.{minor}.0-watch-chaos"));
        Ok(json_response(StatusCode::OK, &version))
    }

    async fn list(
        &self,
        target: Target,
        query: Query,
        parts: http::request::Parts,
        body: Body,
    ) -> Result<Response<Body>, BoxError> {
        let resource = &target.resource;
        if query.resource_version.as_deref() == Some("0")
            && self.shared.fault(resource, FaultKind::StaleList).is_some()
            && let Some(snapshot) = self.shared.snapshot(resource)
        {
            self.shared.bump(resource, "stale_lists_served");
            debug!(resource, rv = %snapshot.rv, "serving a stale list");
            if let (Wire::Protobuf, Some(list)) =
                (Wire::accepted_by(&parts.headers), &snapshot.protobuf)
            {
                let list = match target.namespace.as_deref() {
                    Some(namespace) => protobuf::filter_list_namespace(list, namespace)?.into(),
                    None => list.clone(),
                };
                return Ok(protobuf_response(list));
            }
            let body = events::filter_list_namespace(&snapshot.body, target.namespace.as_deref());
            return Ok(json_response(StatusCode::OK, &body));
        }
        let response = self.upstream.send(parts, body).await?;
        let wire = Wire::of_answer(response.headers());
        let Some(wire) = wire.filter(|_| response.status() == StatusCode::OK) else {
            return Ok(passthrough(response));
        };
        let (mut parts, body) = response.into_parts();
        let bytes = body.collect().await?.to_bytes();
        let list = match wire {
            Wire::Json => serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string()),
            Wire::Protobuf => {
                self.shared.bump(resource, "protobuf_lists");
                protobuf::decode_list(&bytes)
            }
        };
        match list {
            Ok(list) => self.shared.record_list(resource, &list),
            Err(err) => debug!(resource, error = %err, "an unreadable LIST answer, passed on"),
        }
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, full(bytes)))
    }

    async fn watch(
        &self,
        target: Target,
        query: Query,
        parts: http::request::Parts,
        body: Body,
    ) -> Result<Response<Body>, BoxError> {
        let resource = target.resource.clone();
        let rv = query.resource_version.clone().unwrap_or_default();
        let resume_at = rv_number(&rv).filter(|n| *n > 0);
        if resume_at.is_some() && self.shared.fault(&resource, FaultKind::Error410).is_some() {
            self.shared.bump(&resource, "watch_410_injected");
            let wire = Wire::accepted_by(&parts.headers);
            return Ok(events_response(wire, &[events::expired_event(&rv)]));
        }
        if let Some(stale) = self.shared.fault(&resource, FaultKind::StaleList)
            && let Some(snapshot) = self.shared.snapshot(&resource)
            && resume_at.is_some_and(|n| rv_number(&snapshot.rv).is_some_and(|s| n <= s))
            && stale.lag_ms() > 0
        {
            self.shared.bump(&resource, "stale_watches_lagged");
            tokio::time::sleep(Duration::from_millis(stale.lag_ms())).await;
        }
        let replay = self.shared.replay_pace(&resource, &rv).map(|pace| {
            self.shared.bump(&resource, "replays_served");
            info!(%resource, %rv, "a client resumes from an old RV: pacing the replay");
            Replay {
                until: self.shared.max_rv(&resource),
                pace: Duration::from_millis(pace),
            }
        });
        let response = self.upstream.send(parts, body).await?;
        let wire = Wire::of_answer(response.headers());
        let Some(wire) = wire.filter(|_| response.status() == StatusCode::OK) else {
            return Ok(passthrough(response));
        };
        if wire == Wire::Protobuf {
            self.shared.bump(&resource, "protobuf_watches");
        }
        let (mut parts, upstream_body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let (tx, rx) = mpsc::channel(64);
        let pump = Pump {
            shared: self.shared.clone(),
            resource,
            namespace: target.namespace,
            wire,
            tx,
            replay,
        };
        tokio::spawn(pump.run(upstream_body));
        Ok(Response::from_parts(parts, stream_body(rx)))
    }
}

fn passthrough(response: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    let keep_length = parts.headers.get(header::CONTENT_LENGTH).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(length) = keep_length {
        parts.headers.insert(header::CONTENT_LENGTH, length);
    }
    Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
    )
}

/// A watch answer of these events, on `wire`.
fn events_response(wire: Wire, events: &[Value]) -> Response<Body> {
    let body: Vec<u8> = events.iter().flat_map(|e| wire.encode(e)).collect();
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(wire.watch_content_type()),
    );
    response
}

/// A protobuf LIST answer.
fn protobuf_response(body: Bytes) -> Response<Body> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(protobuf::MEDIA_TYPE),
    );
    response
}
