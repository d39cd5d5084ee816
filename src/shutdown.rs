//! The shutdown signal every long-running task of the controller follows: a
//! `watch` channel whose value turns `true` once.

use tokio::sync::watch;

/// Resolves once `shutdown` turns true. A dropped sender means nobody can ask
/// the task to stop any more: then it never resolves.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}
