//! No file of the repository names an address the project does not own.
//!
//! The project owns no domain and no account anywhere, so the rule for every
//! file `git ls-files` lists is:
//!
//! - no mention of the GitHub account `endpoints-guard` (`github.com/` and
//!   that name), with or without a scheme: that account is not the
//!   project's;
//! - every `http://` or `https://` address is either local (loopback, a
//!   name without a dot, or a placeholder the code fills in:
//!   `http://{addr}`, `https://<bind>`, `http://ADDR`), a
//!   domain reserved for examples (RFC 2606: `example.com`, `example.org`,
//!   `example.net`, `*.example`), or one of [`STANDARD_REFERENCES`], each a
//!   fixed name of a standard or a tool's official home, with why it is
//!   there.
//!
//! A link to the project's own source, issues or runbook cannot be given:
//! documents name files by their path in the repository, and the chart's
//! alerts link a runbook only where the operator hosts one.

use std::process::Command;

use anyhow::{Context, Result, bail};
use eg_harness::binaries::workspace_root;

/// Addresses that may appear, as prefixes, and why.
const STANDARD_REFERENCES: &[(&str, &str)] = &[
    (
        "http://json-schema.org/draft-07/schema#",
        "the `$schema` identifier of values.schema.json",
    ),
    (
        "http://www.w3.org/2000/svg",
        "the SVG namespace of the plots in docs/ and of the code that draws them",
    ),
    (
        "https://github.com/rust-lang/crates.io-index",
        "Cargo.lock's name for the crates.io registry",
    ),
    (
        "https://rustup.rs",
        "where the Makefile tells to install Rust",
    ),
    (
        "https://go.dev/doc/install",
        "where the Makefile and the control plane build tell to install Go",
    ),
];

/// Hosts that are no one's address.
fn local_or_example(host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    // A name without a dot is no domain on the internet: a local name or a
    // placeholder.
    let single_label = !host.contains('.') && !host.starts_with('[');
    single_label
        || ["127.0.0.1", "[::1]", "0.0.0.0"].contains(&host.as_str())
        || ["example.com", "example.org", "example.net"]
            .iter()
            .any(|domain| host == *domain || host.ends_with(&format!(".{domain}")))
        || host.ends_with(".example")
}

/// Why `url` (from its scheme on, to the end of the line) may not appear,
/// if it may not.
fn refused(url: &str) -> Option<String> {
    if STANDARD_REFERENCES
        .iter()
        .any(|(prefix, _)| url.starts_with(prefix))
    {
        return None;
    }
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    // `{`, `<` or `$` right after the scheme: the code or the reader fills
    // the host in.
    if after_scheme.starts_with(['{', '<', '$']) {
        return None;
    }
    let host: String = after_scheme
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || ".-[]:".contains(*c))
        .collect();
    // Up to the port, keeping an IPv6 literal whole.
    let host = match host.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next().unwrap_or_default()),
        None => host.split(':').next().unwrap_or_default().to_owned(),
    };
    if local_or_example(&host) {
        return None;
    }
    Some(format!("{host} is not the project's"))
}

/// Every `http://` or `https://` address in `text`, with its line number,
/// each from its scheme to the end of its line.
fn addresses(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let mut from = 0;
        while let Some(at) = ["http://", "https://"]
            .iter()
            .filter_map(|scheme| lower[from..].find(scheme).map(|i| from + i))
            .min()
        {
            found.push((number + 1, &line[at..]));
            from = at + 1;
        }
    }
    found
}

#[test]
fn no_file_names_an_address_the_project_does_not_own() -> Result<()> {
    let root = workspace_root()?;
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .context("running git ls-files")?;
    if !out.status.success() {
        bail!(
            "git ls-files failed in {}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Built here so that this file does not name it itself.
    let not_ours = ["github.com", "endpoints-guard"].join("/");
    let mut files = 0;
    let mut problems = Vec::new();
    for path in String::from_utf8(out.stdout)?.split('\0') {
        if path.is_empty() {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(path)) else {
            // Not text (or removed from the working tree): no address to read.
            continue;
        };
        files += 1;
        for (number, line) in text.lines().enumerate() {
            if line.to_ascii_lowercase().contains(&not_ours) {
                problems.push(format!("{path}:{}: names {not_ours}", number + 1));
            }
        }
        for (number, url) in addresses(&text) {
            if let Some(why) = refused(url) {
                problems.push(format!("{path}:{number}: {why}: {url}"));
            }
        }
    }
    assert!(files > 0, "git ls-files listed no readable file");
    assert!(
        problems.is_empty(),
        "addresses the project does not own (rule: tests/e2e/addresses.rs):\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// The rule refuses what it must and lets through what it may.
#[test]
fn the_rule_tells_owned_from_foreign_addresses() {
    for allowed in [
        "http://json-schema.org/draft-07/schema#\",",
        "https://127.0.0.1:6443",
        "http://localhost:8080/metrics",
        "https://[::1]:443/",
        "http://{addr}{path}",
        "https://<bind>:<port>",
        "https://runbooks.example.com/eg.md#x",
        "https://registry.example/eg",
        "https://rustup.rs)\"; exit 1; }",
        "http://ADDR)\")",
    ] {
        assert_eq!(refused(allowed), None, "{allowed}");
    }
    // The scheme added here, so that this file does not name them itself.
    for foreign in [
        "github.com/someone/endpoints-guard",
        "raw.githubusercontent.com/kubernetes/kubernetes/master/logo/logo.svg",
        "docs.rs/hardened-watcher",
        "example.com.evil.io/",
        "json-schema.org.evil.io/draft-07/schema#",
    ] {
        let url = format!("https://{foreign}");
        assert!(refused(&url).is_some(), "{url}");
    }
    assert_eq!(
        addresses("see HTTPS://a.example and http://b.example\nnone here\n(https://c.example)"),
        [
            (1, "HTTPS://a.example and http://b.example"),
            (1, "http://b.example"),
            (3, "https://c.example)")
        ]
    );
}
