//! etcd on loopback, and a tiny HTTP/1.1 client for its JSON gRPC gateway
//! (health, current revision, compaction).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{Process, free_ports};

/// Where an etcd listens: its client and peer ports on 127.0.0.1, and the
/// peer port it advertises: its own, or etcd-peer-proxy's route to it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EtcdPorts {
    pub client: u16,
    pub peer: u16,
    pub advertised_peer: u16,
}

impl EtcdPorts {
    /// Free ports; `proxied` gives the advertised peer port one of its own.
    pub fn free(proxied: bool) -> Result<Self> {
        let [client, peer, route] = free_ports()?;
        Ok(Self {
            client,
            peer,
            advertised_peer: if proxied { route } else { peer },
        })
    }

    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer)
    }

    pub fn advertised_peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.advertised_peer)
    }

    /// Whether the peers reach this member through etcd-peer-proxy.
    pub fn proxied(&self) -> bool {
        self.advertised_peer != self.peer
    }
}

/// One member of the etcd cluster: its name and ports.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub name: String,
    pub ports: EtcdPorts,
}

impl Member {
    /// `count` members on free ports: `eg` alone, or `eg-0`, `eg-1`, ...
    /// whose peers reach each other through etcd-peer-proxy.
    pub fn free(count: usize) -> Result<Vec<Member>> {
        (0..count.max(1))
            .map(|i| {
                Ok(Member {
                    name: if count <= 1 {
                        "eg".to_string()
                    } else {
                        format!("eg-{i}")
                    },
                    ports: EtcdPorts::free(count > 1)?,
                })
            })
            .collect()
    }

    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.client)
    }

    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.client))
    }
}

/// `--initial-cluster` for `members`.
pub(crate) fn initial_cluster(members: &[Member]) -> String {
    members
        .iter()
        .map(|m| format!("{}={}", m.name, m.ports.advertised_peer_url()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts etcd member `member` of `cluster` (its `--initial-cluster`) with
/// its data in `data_dir`, listening only on 127.0.0.1; [`wait_healthy`]
/// waits for it (a member of several reports healthy once a quorum elected
/// a leader, so every member is spawned before any is waited for).
pub(crate) fn spawn(
    etcd: &Path,
    data_dir: &Path,
    log_path: &Path,
    extra_args: &[String],
    member: &Member,
    cluster: &str,
) -> Result<Process> {
    let client_url = member.client_url();
    let peer_url = member.ports.peer_url();
    let advertised_peer_url = member.ports.advertised_peer_url();
    let mut args = vec![
        format!("--name={}", member.name),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={advertised_peer_url}"),
        format!("--initial-cluster={cluster}"),
        "--initial-cluster-state=new".to_string(),
        // --listen-metrics-urls stays unset: metrics are served on the client
        // URL, with no listener of their own.
        // Tests do not need durability: skipping fsync makes writes fast.
        "--unsafe-no-fsync".to_string(),
        format!("--quota-backend-bytes={}", 8u64 << 30),
        "--log-level=warn".to_string(),
    ];
    args.extend(extra_args.iter().cloned());
    Process::spawn(&format!("etcd {}", member.name), etcd, &args, log_path)
}

/// Waits until the member at `addr` reports healthy.
pub(crate) async fn wait_healthy(
    process: &mut Process,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<()> {
    process
        .wait_until(timeout, Duration::from_millis(100), || async {
            match request(addr, "GET", "/health", None).await? {
                (200, body) if body.get("health").and_then(Value::as_str) == Some("true") => Ok(()),
                (code, body) => bail!("http://{addr}/health: {code} {body}"),
            }
        })
        .await
}

/// Starts a one-member etcd ([`spawn`] and [`wait_healthy`]).
pub(crate) async fn start(
    etcd: &Path,
    data_dir: &Path,
    log_path: &Path,
    extra_args: &[String],
    member: &Member,
    timeout: Duration,
) -> Result<Process> {
    let cluster = initial_cluster(std::slice::from_ref(member));
    let mut process = spawn(etcd, data_dir, log_path, extra_args, member, &cluster)?;
    wait_healthy(&mut process, member.client_addr(), timeout).await?;
    Ok(process)
}

/// The member id of the etcd at `addr` and the id of the leader it knows.
pub async fn member_status(addr: SocketAddr) -> Result<(String, String)> {
    let body = call(addr, "/v3/maintenance/status", &json!({})).await?;
    let id = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Ok((id(&body["header"]["member_id"]), id(&body["leader"])))
}

/// The current revision of the etcd at `addr` (from a range request's header).
pub async fn current_revision(addr: SocketAddr) -> Result<i64> {
    // Key "eg" (base64 "ZWc="); only the response header matters.
    let body = call(addr, "/v3/kv/range", &json!({"key": "ZWc=", "limit": 1})).await?;
    header_revision(&body)
}

/// Compacts the etcd at `addr` at its current revision (physically, so the
/// call returns once the old revisions are gone) and returns that revision.
pub async fn compact(addr: SocketAddr) -> Result<i64> {
    let revision = current_revision(addr).await?;
    call(
        addr,
        "/v3/kv/compaction",
        &json!({"revision": revision.to_string(), "physical": true}),
    )
    .await
    .with_context(|| format!("compacting etcd at revision {revision}"))?;
    Ok(revision)
}

/// Deletes `key` (exactly that key) and returns how many keys went.
pub async fn delete_key(addr: SocketAddr, key: &str) -> Result<i64> {
    let encoded = base64_encode(key.as_bytes());
    let body = call(addr, "/v3/kv/deleterange", &json!({"key": encoded})).await?;
    let deleted = body.get("deleted").cloned().unwrap_or(Value::Null);
    match deleted {
        Value::String(s) => s.parse().with_context(|| format!("deleted {s:?}")),
        Value::Number(n) => n.as_i64().ok_or_else(|| anyhow!("deleted {n}")),
        // The gateway omits zero values.
        _ => Ok(0),
    }
}

/// Standard base64 with padding (etcd's gateway takes keys as bytes).
fn base64_encode(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn header_revision(body: &Value) -> Result<i64> {
    // gRPC-gateway renders int64 as a JSON string.
    let revision = body
        .pointer("/header/revision")
        .ok_or_else(|| anyhow!("no header.revision in etcd's answer {body}"))?;
    match revision {
        Value::String(s) => s.parse().with_context(|| format!("revision {s:?}")),
        Value::Number(n) => n.as_i64().ok_or_else(|| anyhow!("revision {n}")),
        other => bail!("revision {other}"),
    }
}

async fn call(addr: SocketAddr, path: &str, body: &Value) -> Result<Value> {
    let (status, answer) = request(addr, "POST", path, Some(body))
        .await
        .with_context(|| format!("POST http://{addr}{path}"))?;
    if status != 200 || answer.get("error").is_some() {
        bail!("POST http://{addr}{path} {body}: HTTP {status}: {answer}");
    }
    Ok(answer)
}

/// One HTTP/1.1 request with `Connection: close`; returns the status code and
/// the body parsed as JSON (`null` when empty).
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let payload = body.map(Value::to_string).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            payload.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(payload.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| anyhow!("no answer within 30 s"))??;
    parse_response(&response)
}

fn parse_response(response: &[u8]) -> Result<(u16, Value)> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response"))?;
    let head = String::from_utf8_lossy(&response[..split]);
    let raw_body = &response[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("malformed status line in {head:?}"))?;
    let chunked = head.lines().any(|line| {
        let lower = line.to_ascii_lowercase();
        lower.starts_with("transfer-encoding:") && lower.contains("chunked")
    });
    let body = if chunked {
        dechunk(raw_body)?
    } else {
        raw_body.to_vec()
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((status, Value::Null));
    }
    let value = serde_json::from_slice(&body).with_context(|| {
        format!(
            "HTTP {status} body is not JSON: {}",
            String::from_utf8_lossy(&body)
        )
    })?;
    Ok((status, value))
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunked body"))?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("chunk size {size_text:?}"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = raw.get(..size).ok_or_else(|| anyhow!("truncated chunk"))?;
        out.extend_from_slice(chunk);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::{base64_encode, header_revision, parse_response};
    use serde_json::json;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{\"health\":\"true\"}";
        assert_eq!(
            parse_response(plain).unwrap(),
            (200, json!({"health": "true"}))
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                        5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, json!({"a": 1})));
    }

    #[test]
    fn reads_the_revision_as_string_or_number() {
        assert_eq!(
            header_revision(&json!({"header": {"revision": "42"}})).unwrap(),
            42
        );
        assert_eq!(
            header_revision(&json!({"header": {"revision": 7}})).unwrap(),
            7
        );
        assert!(header_revision(&json!({})).is_err());
    }

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64_encode(b"eg"), "ZWc=");
        assert_eq!(base64_encode(b"abc"), "YWJj");
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(
            base64_encode(b"/registry/services/specs/default/x"),
            "L3JlZ2lzdHJ5L3NlcnZpY2VzL3NwZWNzL2RlZmF1bHQveA=="
        );
    }
}
