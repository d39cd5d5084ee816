//! A small HTTP/1.0 client for local services (watch-chaos's control API,
//! Prometheus, endpoints-guard's own endpoints, on loopback or at a pod's
//! address on the real node's bridge): one request per connection.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Sends one request to 127.0.0.1:`port`; returns the status code and body.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<(u16, String)> {
    request_to(local(port), method, path, content_type, body).await
}

/// Sends one request to `addr`; returns the status code and body.
pub async fn request_to(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let host = addr.ip();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, text.to_string()))
}

/// GET `path` on 127.0.0.1:`port`, answered within 5 s: the body of a 200
/// answer (endpoints-guard's `/metrics` and `/readyz`), else an error.
pub async fn get(port: u16, path: &str) -> Result<String> {
    let (code, body) = tokio::time::timeout(
        Duration::from_secs(5),
        request(port, "GET", path, "text/plain", ""),
    )
    .await
    .with_context(|| format!("GET {path} on port {port} timed out"))??;
    if code != 200 {
        bail!("GET {path}: {code} {body}");
    }
    Ok(body)
}

/// A request to 127.0.0.1:`port` whose answer must be 200 with a JSON body.
pub async fn json(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<Value> {
    json_to(local(port), method, path, content_type, body).await
}

/// A request to `addr` whose answer must be 200 with a JSON body.
pub async fn json_to(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<Value> {
    let (code, text) = request_to(addr, method, path, content_type, body).await?;
    if code != 200 {
        bail!("{method} {path}: {code} {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("{method} {path}: not JSON: {text}"))
}

/// A JSON request (`body`, if any) to 127.0.0.1:`port` whose answer must be
/// 200 with a JSON body: the control APIs of watch-chaos and etcd-fault-proxy.
pub async fn http_json(port: u16, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    json(port, method, path, "application/json", &body).await
}

/// `application/x-www-form-urlencoded` encoding of one value.
pub fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::form_value;

    #[test]
    fn form_values_escape_everything_but_unreserved_characters() {
        assert_eq!(
            form_value(r#"up{job="a b"} > 0"#),
            "up%7Bjob%3D%22a%20b%22%7D%20%3E%200"
        );
        assert_eq!(form_value("a-z_0.9~"), "a-z_0.9~");
    }
}
