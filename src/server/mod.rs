//! The HTTP endpoints operators scrape and probe: `/metrics`, `/healthz`,
//! `/readyz`. Plain HTTP serves all three ([`bind`]), or, with the metrics
//! behind HTTPS, only the probes ([`bind_probes`]) while [`bind_secure`]
//! serves `/metrics` over TLS to callers a TokenReview authenticates and a
//! SubjectAccessReview authorizes.

pub mod auth;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use auth::{Authorizer, Decision};

/// How long a client has for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the probes report. `ready` turns true once every cache has finished its
/// first consistent list (before that, reconciles would act on partial data).
#[derive(Clone)]
pub struct Health {
    pub ready: watch::Receiver<bool>,
}

type Answer = Response<Full<Bytes>>;

/// What a server answers.
#[derive(Clone)]
enum Routes {
    /// /metrics (open), /healthz, /readyz.
    Plain {
        metrics: Arc<Metrics>,
        health: Health,
    },
    /// /healthz, /readyz; /metrics is on the HTTPS address.
    Probes { health: Health, secure: SocketAddr },
    /// /metrics only, for authorized callers.
    Secure {
        metrics: Arc<Metrics>,
        authorizer: Arc<Authorizer>,
    },
}

/// Binds `addr` and serves /metrics, /healthz and /readyz over plain HTTP.
/// Returns the bound address (port 0 picks a free one) and the serving
/// future, which ends when `shutdown` turns true.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, impl Future<Output = ()>)> {
    listen(addr, Routes::Plain { metrics, health }, None, shutdown).await
}

/// Binds `addr` and serves the probes over plain HTTP; /metrics answers 404
/// naming `secure`, where it is served.
pub async fn bind_probes(
    addr: SocketAddr,
    health: Health,
    secure: SocketAddr,
    shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, impl Future<Output = ()>)> {
    listen(addr, Routes::Probes { health, secure }, None, shutdown).await
}

/// Binds `addr` and serves /metrics over TLS (`tls`) to authorized callers.
pub async fn bind_secure(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    authorizer: Arc<Authorizer>,
    tls: Arc<rustls::ServerConfig>,
    shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, impl Future<Output = ()>)> {
    let routes = Routes::Secure {
        metrics,
        authorizer,
    };
    listen(addr, routes, Some(TlsAcceptor::from(tls)), shutdown).await
}

async fn listen(
    addr: SocketAddr,
    routes: Routes,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, impl Future<Output = ()>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Server {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| Error::Server {
        addr: addr.to_string(),
        source,
    })?;
    let serve = async move {
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                accepted = listener.accept() => {
                    let (stream, _) = match accepted {
                        Ok(conn) => conn,
                        Err(err) => {
                            tracing::warn!(error = %err, "metrics server: accept failed");
                            continue;
                        }
                    };
                    let routes = routes.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        match tls {
                            None => connection(stream, routes).await,
                            Some(acceptor) => {
                                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                    Ok(Ok(stream)) => connection(stream, routes).await,
                                    Ok(Err(err)) => tracing::debug!(error = %err, "metrics server: TLS handshake failed"),
                                    Err(_) => tracing::debug!("metrics server: TLS handshake timed out"),
                                }
                            }
                        }
                    });
                }
            }
        }
    };
    Ok((local, serve))
}

async fn connection<S>(stream: S, routes: Routes)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let routes = routes.clone();
        async move { Ok::<_, Infallible>(route(&req, &routes).await) }
    });
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(error = %err, "metrics server: connection ended with an error");
    }
}

fn text(status: StatusCode, body: String) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}

fn metrics_answer(metrics: &Metrics) -> Answer {
    match metrics.render() {
        Ok(body) => {
            let mut resp = text(StatusCode::OK, body);
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        }
        Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")),
    }
}

fn probe(path: &str, health: &Health) -> Option<Answer> {
    match path {
        "/healthz" => Some(text(StatusCode::OK, "ok\n".into())),
        "/readyz" => Some(if *health.ready.borrow() {
            text(StatusCode::OK, "ok\n".into())
        } else {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "caches not synced yet\n".into(),
            )
        }),
        _ => None,
    }
}

fn not_found() -> Answer {
    text(StatusCode::NOT_FOUND, "not found\n".into())
}

async fn route(req: &Request<Incoming>, routes: &Routes) -> Answer {
    let path = req.uri().path();
    match routes {
        Routes::Plain { metrics, health } => match path {
            "/metrics" => metrics_answer(metrics),
            _ => probe(path, health).unwrap_or_else(not_found),
        },
        Routes::Probes { health, secure } => match path {
            "/metrics" => text(
                StatusCode::NOT_FOUND,
                format!("/metrics is served over HTTPS on port {}\n", secure.port()),
            ),
            _ => probe(path, health).unwrap_or_else(not_found),
        },
        Routes::Secure {
            metrics,
            authorizer,
        } => {
            if path != "/metrics" {
                return not_found();
            }
            let authorization = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match authorizer.decide(authorization).await {
                Ok(Decision::Allowed(_)) => metrics_answer(metrics),
                Ok(Decision::Unauthenticated) => {
                    let mut resp = text(StatusCode::UNAUTHORIZED, "Unauthorized\n".into());
                    resp.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static("Bearer"),
                    );
                    resp
                }
                Ok(Decision::Forbidden(user)) => text(
                    StatusCode::FORBIDDEN,
                    format!("Forbidden: user {user:?} may not get {}\n", auth::PATH),
                ),
                Err(err) => {
                    tracing::warn!(error = %err, "metrics server: cannot check the caller");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot check the caller's token and permission\n".into(),
                    )
                }
            }
        }
    }
}
