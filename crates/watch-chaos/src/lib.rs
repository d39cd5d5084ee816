//! watch-chaos: a reverse proxy between any Kubernetes client and
//! kube-apiserver that makes watches fail the ways they fail in production
//! (see the repository's `docs/watch-failures.md`), per resource, on command.
//!
//! - [`request`]: what a request is about (resource, namespace, watch/list).
//! - [`body`]: the bodies it sends.
//! - [`faults`]: the faults and their parameters.
//! - [`events`]: the pure transforms of watch events.
//! - [`wire`], [`protobuf`]: the wires events come on, read and written.
//! - [`state`]: what the proxy remembers (object versions, old RVs, snapshots).
//! - [`credentials`]: how the proxy authenticates upstream.
//! - [`proxy`]: the proxy: plain HTTP in front, TLS to the API server behind.
//! - [`stream`]: one watch stream, transformed.
//! - [`control`]: the control API.
//!
//! JSON and protobuf alike: a LIST or WATCH is answered on the wire the API
//! server chose for the client's Accept header, with the same faults, so a
//! protobuf client (client-go by default) runs its own decoder under them.

pub mod body;
pub mod control;
pub mod credentials;
pub mod events;
pub mod faults;
pub mod protobuf;
pub mod proxy;
pub mod request;
pub mod state;
pub mod stream;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::debug;

pub use faults::{FaultKind, FaultSpec};
pub use proxy::{Proxy, Upstream};

/// A running proxy and control API.
pub struct Running {
    pub proxy_addr: SocketAddr,
    pub control_addr: SocketAddr,
    pub proxy: Arc<Proxy>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting connections (open ones end with their tasks).
    pub fn stop(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the proxy and control listeners and serves them in the background.
pub async fn start(
    upstream: Upstream,
    listen: SocketAddr,
    control: SocketAddr,
    faults: Vec<FaultSpec>,
) -> anyhow::Result<Running> {
    let proxy = Arc::new(Proxy::new(upstream));
    for spec in faults {
        if spec.fault == FaultKind::StaleList {
            proxy
                .snapshot(&spec.resource, &spec.collection_path())
                .await
                .map_err(|e| anyhow::anyhow!("taking the stale-list snapshot: {e}"))?;
        }
        proxy.shared.set_fault(spec);
    }
    let proxy_listener = TcpListener::bind(listen).await?;
    let control_listener = TcpListener::bind(control).await?;
    let proxy_addr = proxy_listener.local_addr()?;
    let control_addr = control_listener.local_addr()?;
    let serving = {
        let proxy = proxy.clone();
        serve(proxy_listener, move |req| proxy.clone().handle(req))
    };
    let controlling = {
        let proxy = proxy.clone();
        serve(control_listener, move |req| {
            control::handle(proxy.clone(), req)
        })
    };
    Ok(Running {
        proxy_addr,
        control_addr,
        proxy,
        tasks: vec![tokio::spawn(serving), tokio::spawn(controlling)],
    })
}

async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<http::Response<body::Body>, std::convert::Infallible>>
        + Send
        + 'static,
{
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                debug!(error = %err, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(handler);
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %err, "connection ended");
            }
        });
    }
}

/// A kubeconfig for clients of the proxy: `server: http://<addr>`, no
/// credentials (the proxy authenticates to the API server itself).
pub fn client_kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: watch-chaos\n  cluster:\n    server: http://{addr}\nusers:\n- name: watch-chaos\n  user: {{}}\ncontexts:\n- name: watch-chaos\n  context:\n    cluster: watch-chaos\n    user: watch-chaos\ncurrent-context: watch-chaos\n"
    )
}
