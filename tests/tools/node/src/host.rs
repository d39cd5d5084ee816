//! What a real node changes on the host, and putting it back: a snapshot of
//! the host-wide things a kubelet, containerd, kube-proxy and the CNI bridge
//! create (processes, mounts, links, routes, iptables and nftables,
//! sysctls, cgroups, folders, listening ports), compared before and after.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Process names (`/proc/<pid>/comm`, 15 characters at most) of the node
/// that could outlive a run: the control plane's programs are children of
/// the test and die with it, but containerd's shims detach by design, and
/// the pods' processes are the kubelet's (their cgroups are checked too).
pub const NODE_PROCESSES: [&str; 6] = [
    "kubelet",
    "containerd",
    "containerd-shim",
    "kube-proxy",
    "pause",
    "testserver",
];

/// sysctls a node's programs are known to change.
pub const SYSCTLS: [&str; 7] = [
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/netfilter/nf_conntrack_max",
];

/// Folders outside the run's own folder that a kubelet, containerd or the
/// CNI plugins create at fixed paths.
pub const FIXED_PATHS: [&str; 7] = [
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/etc/cni",
    "/opt/cni",
];

/// Ports the kubelet and kube-proxy listen on by default.
pub const NODE_PORTS: [u16; 5] = [10248, 10249, 10250, 10256, 10257];

/// One look at the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostSnapshot {
    pub processes: BTreeMap<String, usize>,
    pub mounts: BTreeSet<String>,
    pub links: BTreeSet<String>,
    pub routes: BTreeSet<String>,
    pub iptables: BTreeSet<String>,
    pub nft_tables: BTreeSet<String>,
    pub sysctls: BTreeMap<String, String>,
    pub cgroups: BTreeSet<String>,
    pub paths: BTreeSet<String>,
    pub ports: BTreeSet<u16>,
}

impl HostSnapshot {
    pub fn take() -> Result<Self> {
        Ok(Self {
            processes: processes()?,
            mounts: mounts()?,
            links: lines("ip", &["-o", "link", "show"])?
                .into_iter()
                .filter_map(|line| line.split(':').nth(1).map(|n| n.trim().to_string()))
                .map(|name| name.split('@').next().unwrap_or_default().to_string())
                .collect(),
            routes: lines("ip", &["route", "show", "table", "all"])?
                .into_iter()
                .collect(),
            iptables: iptables_rules()?,
            nft_tables: lines("nft", &["list", "tables"])?.into_iter().collect(),
            sysctls: SYSCTLS
                .iter()
                .filter_map(|name| {
                    let value = std::fs::read_to_string(format!("/proc/sys/{name}")).ok()?;
                    Some((name.to_string(), value.trim().to_string()))
                })
                .collect(),
            cgroups: kubepods_cgroups(),
            paths: FIXED_PATHS
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| p.to_string())
                .collect(),
            ports: listening_ports()?
                .into_iter()
                .filter(|port| NODE_PORTS.contains(port))
                .collect(),
        })
    }

    /// What `after` has that `self` had not, and the other way round, one
    /// line each; empty when the host is as it was.
    pub fn differences(&self, after: &Self) -> Vec<String> {
        let mut out = Vec::new();
        for name in NODE_PROCESSES {
            let (a, b) = (
                self.processes.get(name).copied().unwrap_or(0),
                after.processes.get(name).copied().unwrap_or(0),
            );
            if a != b {
                out.push(format!("processes named {name}: {a} before, {b} after"));
            }
        }
        set_diff(&mut out, "mount", &self.mounts, &after.mounts);
        set_diff(&mut out, "link", &self.links, &after.links);
        set_diff(&mut out, "route", &self.routes, &after.routes);
        set_diff(&mut out, "iptables", &self.iptables, &after.iptables);
        set_diff(&mut out, "nftables", &self.nft_tables, &after.nft_tables);
        set_diff(&mut out, "cgroup", &self.cgroups, &after.cgroups);
        set_diff(&mut out, "path", &self.paths, &after.paths);
        set_diff(&mut out, "listening port", &self.ports, &after.ports);
        for (name, before) in &self.sysctls {
            match after.sysctls.get(name) {
                Some(now) if now == before => {}
                now => out.push(format!(
                    "sysctl {name}: {before} before, {} after",
                    now.map_or("(gone)", String::as_str)
                )),
            }
        }
        for name in after.sysctls.keys() {
            if !self.sysctls.contains_key(name) {
                out.push(format!("sysctl {name}: appeared"));
            }
        }
        out
    }
}

fn set_diff<T: Ord + std::fmt::Display>(
    out: &mut Vec<String>,
    what: &str,
    before: &BTreeSet<T>,
    after: &BTreeSet<T>,
) {
    for gone in before.difference(after) {
        out.push(format!("{what} removed: {gone}"));
    }
    for added in after.difference(before) {
        out.push(format!("{what} left behind: {added}"));
    }
}

/// Runs a program and returns its standard output, failing with its
/// standard error.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {}: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn lines(program: &str, args: &[&str]) -> Result<Vec<String>> {
    Ok(run(program, args)?
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn processes() -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        // A zombie has exited: only its parent's reaping is left.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            let comm = comm.trim();
            if NODE_PROCESSES.contains(&comm) {
                *counts.entry(comm.to_string()).or_insert(0) += 1;
            }
        }
    }
    Ok(counts)
}

/// Mount points with their source and type (from /proc/self/mountinfo).
fn mounts() -> Result<BTreeSet<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(format!(
                "{} ({} {})",
                fields.get(4)?,
                fields.get(dash + 1)?,
                fields.get(dash + 2)?
            ))
        })
        .collect())
}

/// Every iptables and ip6tables rule and chain, without counters.
fn iptables_rules() -> Result<BTreeSet<String>> {
    let mut rules = BTreeSet::new();
    for program in ["iptables-save", "ip6tables-save"] {
        let mut table = String::new();
        for line in lines(program, &[])? {
            if line.starts_with('#') || line == "COMMIT" {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                table = name.to_string();
                continue;
            }
            // ":CHAIN POLICY [packets:bytes]" → ":CHAIN POLICY".
            let line = match line.rfind(" [") {
                Some(i) if line.starts_with(':') => line[..i].to_string(),
                _ => line,
            };
            rules.insert(format!("{program} {table} {line}"));
        }
    }
    Ok(rules)
}

/// The kubelet's cgroups (cgroupfs driver): `kubepods` in each hierarchy.
fn kubepods_cgroups() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        for entry in entries.flatten() {
            for name in ["kubepods", "kubepods.slice"] {
                let path = entry.path().join(name);
                if path.exists() {
                    out.insert(path.display().to_string());
                }
            }
        }
    }
    out
}

/// TCP ports something listens on (IPv4 and IPv6).
pub fn listening_ports() -> Result<BTreeSet<u16>> {
    let mut ports = BTreeSet::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // State 0A is LISTEN; local address is "ADDR:PORT" in hex.
            if fields.get(3) == Some(&"0A")
                && let Some(port) = fields.get(1).and_then(|a| a.rsplit(':').next())
                && let Ok(port) = u16::from_str_radix(port, 16)
            {
                ports.insert(port);
            }
        }
    }
    Ok(ports)
}

/// Puts back what a run left, using the snapshot taken before it: new
/// iptables chains and rules of kube-proxy, the kubelet and the CNI plugins
/// (KUBE-*, CNI-*), nftables tables that did not exist, changed sysctls,
/// kubepods cgroups, and fixed folders that did not exist. Best effort:
/// returns what it could not undo.
pub fn restore(before: &HostSnapshot) -> Vec<String> {
    let mut problems = Vec::new();
    let mut note = |what: String, result: Result<String>| {
        if let Err(err) = result {
            problems.push(format!("{what}: {err:#}"));
        }
    };
    // Rules first (a chain with references cannot be deleted), then chains.
    if let Ok(now) = iptables_rules() {
        // "iptables-save nat -A KUBE-..." → ("iptables", "nat", "-A KUBE-...").
        let added: Vec<(&str, &str, &str)> = now
            .difference(&before.iptables)
            .filter_map(|line| {
                let mut parts = line.splitn(3, ' ');
                let program = parts.next()?.trim_end_matches("-save");
                Some((program, parts.next()?, parts.next()?))
            })
            .collect();
        for (program, table, rule) in &added {
            if let Some(spec) = rule.strip_prefix("-A ") {
                // iptables-save quotes comments; split_rule takes the quotes off.
                let words = split_rule(spec);
                let mut args = vec!["-t", table, "-D"];
                args.extend(words.iter().map(String::as_str));
                note(
                    format!("{program} -t {table} -D {spec}"),
                    run(program, &args),
                );
            }
        }
        for (program, table, rule) in &added {
            if let Some(chain) = rule.strip_prefix(':').and_then(|r| r.split(' ').next())
                && (chain.starts_with("KUBE-") || chain.starts_with("CNI-"))
            {
                note(
                    format!("{program} -t {table} -X {chain}"),
                    run(program, &["-t", table, "-F", chain])
                        .and_then(|_| run(program, &["-t", table, "-X", chain])),
                );
            }
        }
    }
    if let Ok(tables) = lines("nft", &["list", "tables"]) {
        for table in tables {
            if !before.nft_tables.contains(&table) {
                // "table ip nat" → nft delete table ip nat
                let words: Vec<&str> = table.split_whitespace().skip(1).collect();
                let mut args = vec!["delete", "table"];
                args.extend(words);
                note(format!("nft {}", args.join(" ")), run("nft", &args));
            }
        }
    }
    for (name, value) in &before.sysctls {
        let path = format!("/proc/sys/{name}");
        if std::fs::read_to_string(&path)
            .map(|v| v.trim().to_string())
            .ok()
            .as_ref()
            != Some(value)
        {
            note(
                format!("restoring {name}={value}"),
                std::fs::write(&path, format!("{value}\n"))
                    .map(|()| String::new())
                    .with_context(|| format!("writing {path}")),
            );
        }
    }
    for cgroup in kubepods_cgroups().difference(&before.cgroups) {
        note(
            format!("removing cgroup {cgroup}"),
            remove_cgroup_tree(Path::new(cgroup)),
        );
    }
    for path in FIXED_PATHS {
        if Path::new(path).exists() && !before.paths.contains(path) {
            note(
                format!("removing {path}"),
                std::fs::remove_dir_all(path)
                    .map(|()| String::new())
                    .with_context(|| format!("removing {path}")),
            );
        }
    }
    problems
}

/// Splits an iptables-save rule into arguments, honouring double quotes.
fn split_rule(rule: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in rule.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
                any = false;
            }
            c => current.push(c),
        }
    }
    if any || !current.is_empty() {
        args.push(current);
    }
    args
}

/// Kills every process in a cgroup tree, then removes its folders, deepest
/// first.
pub fn remove_cgroup_tree(root: &Path) -> Result<String> {
    let mut dirs = Vec::new();
    collect_dirs(root, &mut dirs);
    for dir in &dirs {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs
                .lines()
                .filter_map(|p| p.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill(2) with a pid read from the cgroup; at worst
                // the process already exited.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for dir in dirs {
        match std::fs::remove_dir(&dir) {
            // The kubelet or a shim exiting removed it first.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            other => other.with_context(|| format!("rmdir {}", dir.display()))?,
        }
    }
    Ok(String::new())
}

fn collect_dirs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_split_like_a_shell_keeps_quoted_comments_whole() {
        assert_eq!(
            split_rule(r#"FORWARD -i cni0 ! -o cni0 -m comment --comment "eg e2e-node" -j DROP"#),
            [
                "FORWARD",
                "-i",
                "cni0",
                "!",
                "-o",
                "cni0",
                "-m",
                "comment",
                "--comment",
                "eg e2e-node",
                "-j",
                "DROP"
            ]
        );
    }

    #[test]
    fn differences_name_what_was_left_and_what_was_lost() {
        let before = HostSnapshot {
            links: ["lo", "eth0"].map(String::from).into(),
            sysctls: [("net/ipv4/ip_forward".to_string(), "0".to_string())].into(),
            ..Default::default()
        };
        let mut after = before.clone();
        assert!(before.differences(&after).is_empty());
        after.links.insert("cni0".to_string());
        after
            .sysctls
            .insert("net/ipv4/ip_forward".to_string(), "1".to_string());
        after.processes.insert("kubelet".to_string(), 1);
        let diff = before.differences(&after);
        assert_eq!(
            diff,
            [
                "processes named kubelet: 0 before, 1 after",
                "link left behind: cni0",
                "sysctl net/ipv4/ip_forward: 0 before, 1 after",
            ]
        );
    }
}
