//! Which TCP addresses a process listens on, from /proc: lets tests check
//! that the control plane listens on loopback only.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{Context, Result, anyhow};

/// The TCP addresses process `pid` listens on (Linux only).
pub fn listening_addrs(pid: u32) -> Result<Vec<SocketAddr>> {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(&fd_dir).with_context(|| format!("reading {fd_dir}"))? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut addrs = Vec::new();
    for table in ["tcp", "tcp6"] {
        // The process's own view, in case it has its own network namespace.
        let path = format!("/proc/{pid}/net/{table}");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if *state == "0A" && inodes.contains(*inode) {
                addrs.push(parse_proc_addr(local).with_context(|| format!("{path}: {line}"))?);
            }
        }
    }
    Ok(addrs)
}

/// Parses `0100007F:1F90` (IPv4) or the 32-hex-digit IPv6 form: each 32-bit
/// word is printed from memory in the machine's byte order.
fn parse_proc_addr(text: &str) -> Result<SocketAddr> {
    let (ip, port) = text
        .split_once(':')
        .ok_or_else(|| anyhow!("no port in {text}"))?;
    let port = u16::from_str_radix(port, 16)?;
    let word = |i: usize| -> Result<[u8; 4]> {
        let hex = ip
            .get(i * 8..i * 8 + 8)
            .ok_or_else(|| anyhow!("short address {ip}"))?;
        Ok(u32::from_str_radix(hex, 16)?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return Err(anyhow!("unexpected address {ip}")),
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::{listening_addrs, parse_proc_addr};
    use std::net::TcpListener;

    #[test]
    fn parses_proc_net_addresses() {
        assert_eq!(
            parse_proc_addr("0100007F:1F90").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            parse_proc_addr("00000000000000000000000001000000:0050").unwrap(),
            "[::1]:80".parse().unwrap()
        );
    }

    #[test]
    fn finds_our_own_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addrs = listening_addrs(std::process::id()).unwrap();
        assert!(addrs.contains(&listener.local_addr().unwrap()), "{addrs:?}");
    }
}
