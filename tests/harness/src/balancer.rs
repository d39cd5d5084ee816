//! HAProxy in TCP mode in front of several kube-apiservers, as production
//! control planes put a load balancer in front of theirs: each connection
//! goes to the next server (round robin), TLS passes through untouched, and
//! a server that stops answering its TCP health check is left out.
//!
//! HAProxy comes from the Debian package (`make haproxy` installs it);
//! `EG_HAPROXY` names another binary.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{Process, free_port};

/// A running load balancer; stopped when dropped.
pub struct Balancer {
    _process: Process,
    /// Where it listens, on the control plane's address.
    pub port: u16,
}

/// The HAProxy binary: `EG_HAPROXY`, else `haproxy` on the PATH or in
/// /usr/sbin (where Debian puts it).
fn haproxy() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("EG_HAPROXY") {
        return Ok(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("haproxy"))
        .find(|candidate| candidate.is_file());
    on_path.context(
        "haproxy not found (the load balancer of a control plane with several API servers): \
         run `make haproxy` (apt-get install haproxy) or set EG_HAPROXY",
    )
}

/// The configuration: TCP, round robin over `backends`, health checks every
/// second (down after two misses, up after one success), no time limit on a
/// connection's silence shorter than a watch's.
fn config(address: IpAddr, port: u16, backends: &[u16]) -> String {
    let mut text = format!(
        "global\n  maxconn 4096\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 1h\n  timeout server 1h\n\
         frontend apiservers\n  bind {address}:{port}\n  default_backend apiservers\n\
         backend apiservers\n  balance roundrobin\n  option tcp-check\n"
    );
    for (index, backend) in backends.iter().enumerate() {
        text.push_str(&format!(
            "  server apiserver-{index} {address}:{backend} check inter 1s fall 2 rise 1\n"
        ));
    }
    text
}

impl Balancer {
    /// Starts HAProxy on a free port of `address` in front of `backends`
    /// (their ports on the same address) and waits until it accepts.
    pub async fn start(
        log_dir: &Path,
        address: IpAddr,
        backends: &[u16],
        timeout: Duration,
    ) -> Result<Balancer> {
        if backends.is_empty() {
            bail!("a load balancer needs at least one API server");
        }
        let port = free_port()?;
        let cfg = log_dir.join("haproxy.cfg");
        std::fs::write(&cfg, config(address, port, backends))
            .with_context(|| format!("writing {}", cfg.display()))?;
        let args = vec![
            "-db".to_string(),
            "-f".to_string(),
            cfg.display().to_string(),
        ];
        let mut process =
            Process::spawn("haproxy", &haproxy()?, &args, &log_dir.join("haproxy.log"))?;
        process
            .wait_until(timeout, Duration::from_millis(100), || async {
                tokio::net::TcpStream::connect((address, port))
                    .await
                    .map(drop)
                    .with_context(|| format!("connecting to haproxy on {address}:{port}"))
            })
            .await?;
        Ok(Balancer {
            _process: process,
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn the_config_balances_every_backend_with_checks() {
        let text = config(IpAddr::V4(Ipv4Addr::LOCALHOST), 7000, &[6443, 6444]);
        assert!(text.contains("bind 127.0.0.1:7000"));
        assert!(text.contains("server apiserver-0 127.0.0.1:6443 check"));
        assert!(text.contains("server apiserver-1 127.0.0.1:6444 check"));
        assert!(text.contains("mode tcp"));
    }
}
