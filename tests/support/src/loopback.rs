//! A small HTTP/1.0 client for loopback services (watch-chaos's control API,
//! Prometheus, endpoints-guard's own endpoints): one request per connection.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends one request to 127.0.0.1:`port`; returns the status code and body.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
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

/// A request whose answer must be 200 with a JSON body.
pub async fn json(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<Value> {
    let (code, text) = request(port, method, path, content_type, body).await?;
    if code != 200 {
        bail!("{method} {path}: {code} {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("{method} {path}: not JSON: {text}"))
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
