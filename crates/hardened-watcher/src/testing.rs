//! A scripted API peer for unit tests (feature `testing`): an HTTP/1.1
//! server on loopback that answers each request with the next reply of a
//! script, or with a standing reply for requests that match a route. It
//! speaks just enough HTTP to feed bytes to a client's decoder; it is no
//! Kubernetes API server, and end-to-end tests never use it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with a JSON body.
    Body(String),
    /// An API error: this HTTP code with a JSON body (a `Status`, usually).
    Error(u16, String),
    /// An HTTP error with a plain-text body, as a proxy would send.
    Text(u16, String),
    /// 200, then these lines (watch events), then the connection closes.
    Stream(Vec<String>),
    /// 200 headers, then nothing for a minute (a watch that stays open, or a
    /// server that never answers).
    Hang,
}

impl Reply {
    /// A LIST answer of `kind` (e.g. `ServiceList`) at `rv`.
    pub fn list(kind: &str, items: Vec<Value>, rv: &str, continue_token: Option<&str>) -> Self {
        Self::Body(
            json!({"kind": kind, "apiVersion": "v1",
                   "metadata": {"resourceVersion": rv, "continue": continue_token},
                   "items": items})
            .to_string(),
        )
    }

    /// kube-apiserver's NotFound for `name` of `resource` (plural).
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::status(
            404,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
            Some(json!({"name": name, "kind": resource})),
        )
    }

    /// An API error `code` with a `Status` of `reason`.
    pub fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Self {
        let mut status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "code": code, "reason": reason, "message": message});
        if let Some(details) = details {
            status["details"] = details;
        }
        Self::Error(code, status.to_string())
    }
}

/// One watch event line.
pub fn event(kind: &str, object: Value) -> String {
    json!({"type": kind, "object": object}).to_string()
}

/// A reply for every request whose first line (`METHOD /path?query HTTP/1.1`)
/// starts with `method` and contains `path`, ahead of the script.
#[derive(Clone, Debug)]
struct Route {
    method: String,
    path: String,
    reply: Reply,
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    routes: Vec<Route>,
    log: Vec<String>,
}

/// The scripted peer; it stops when dropped.
pub struct ScriptedApi {
    url: String,
    script: Arc<Mutex<Script>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedApi {
    /// Listens on a free loopback port and answers with `replies`, in order;
    /// once they run out, requests hang.
    pub async fn start(replies: Vec<Reply>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let script = Arc::new(Mutex::new(Script {
            replies: replies.into(),
            ..Script::default()
        }));
        let task = tokio::spawn(serve(listener, script.clone()));
        Ok(Self { url, script, task })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers every request made with `method` whose path contains `path`
    /// with `reply`, whatever the script says (e.g. Event posts).
    pub fn route(&self, method: &str, path: &str, reply: Reply) {
        self.lock().routes.push(Route {
            method: method.to_owned(),
            path: path.to_owned(),
            reply,
        });
    }

    /// Adds replies at the end of the script.
    pub fn push(&self, reply: Reply) {
        self.lock().replies.push_back(reply);
    }

    /// A client for this peer, whose requests give up after `read_timeout`.
    pub fn client(&self, read_timeout: Duration) -> kube::Client {
        let url = self
            .url
            .parse()
            .unwrap_or_else(|err| panic!("scripted peer URL {}: {err}", self.url));
        let mut config = kube::Config::new(url);
        config.read_timeout = Some(read_timeout);
        kube::Client::try_from(config).unwrap_or_else(|err| panic!("scripted peer client: {err}"))
    }

    /// The first line of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.lock().log.clone()
    }
}

async fn serve(listener: TcpListener, script: Arc<Mutex<Script>>) {
    while let Ok((sock, _)) = listener.accept().await {
        // Each request takes the next reply when its head has arrived: the
        // order of requests (one client, one after the other) is the order of
        // the script. A hanging reply blocks only its own connection.
        tokio::spawn(answer(sock, script.clone()));
    }
}

async fn answer(mut sock: TcpStream, script: Arc<Mutex<Script>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let reply = {
        let mut script = script.lock().unwrap_or_else(PoisonError::into_inner);
        script.log.push(line.clone());
        let routed = script
            .routes
            .iter()
            .find(|r| line.starts_with(&r.method) && line.contains(&r.path))
            .map(|r| r.reply.clone());
        routed.or_else(|| script.replies.pop_front())
    };
    let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n";
    let error = |code: u16, content_type: &str, body: &str| {
        format!(
            "HTTP/1.1 {code} Err\r\nContent-Type: {content_type}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    match reply {
        Some(Reply::Body(body)) => {
            let msg = format!("{ok}Content-Length: {}\r\n\r\n{body}", body.len());
            let _ = sock.write_all(msg.as_bytes()).await;
        }
        Some(Reply::Error(code, body)) => {
            let _ = sock
                .write_all(error(code, "application/json", &body).as_bytes())
                .await;
        }
        Some(Reply::Text(code, body)) => {
            let _ = sock
                .write_all(error(code, "text/plain", &body).as_bytes())
                .await;
        }
        Some(Reply::Stream(lines)) => {
            let _ = sock.write_all(format!("{ok}\r\n").as_bytes()).await;
            for line in lines {
                let _ = sock.write_all(format!("{line}\n").as_bytes()).await;
            }
        }
        Some(Reply::Hang) | None => {
            let _ = sock.write_all(format!("{ok}\r\n").as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    }
    let _ = sock.shutdown().await;
}
