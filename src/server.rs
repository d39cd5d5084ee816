//! The HTTP endpoint operators scrape and probe: `/metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What the probes report. `ready` turns true once every cache has finished its
/// first consistent list (before that, reconciles would act on partial data).
#[derive(Clone)]
pub struct Health {
    pub ready: watch::Receiver<bool>,
}

/// Binds `addr` and returns the bound address (port 0 picks a free one) and the
/// serving future, which ends when `shutdown` turns true.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
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
                    let metrics = metrics.clone();
                    let health = health.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| {
                            let resp = route(&req, &metrics, &health);
                            async move { Ok::<_, Infallible>(resp) }
                        });
                        if let Err(err) = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await
                        {
                            tracing::debug!(error = %err, "metrics server: connection ended with an error");
                        }
                    });
                }
            }
        }
    };
    Ok((local, serve))
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}

fn route(req: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => match metrics.render() {
            Ok(body) => {
                let mut resp = text(StatusCode::OK, body);
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                resp
            }
            Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")),
        },
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            if *health.ready.borrow() {
                text(StatusCode::OK, "ok\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "caches not synced yet\n".into(),
                )
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}
