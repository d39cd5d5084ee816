//! API requests per controller from kube-apiserver's audit log.
//!
//! Each controller authenticates as its own ServiceAccount; the policy logs
//! only those users, at Metadata level and without the RequestReceived stage,
//! so the driver's own (admin) requests cost the API server no audit work. A
//! request is counted once (by auditID) at the time it was received; a watch
//! is counted when it starts (its ResponseStarted event).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use serde_json::Value;

/// The audit policy: Metadata for `users`, nothing for anyone else.
pub fn policy(users: &[String]) -> String {
    let list = users
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
         - level: Metadata\n  users: [{list}]\n- level: None\n"
    )
}

/// The kube-apiserver flags that turn the audit log on.
pub fn apiserver_args(policy_file: &Path, log_file: &Path) -> Vec<String> {
    vec![
        format!("--audit-policy-file={}", policy_file.display()),
        format!("--audit-log-path={}", log_file.display()),
        "--audit-log-format=json".to_string(),
        "--audit-log-mode=blocking".to_string(),
        "--audit-log-maxsize=0".to_string(),
    ]
}

/// One request of one user.
#[derive(Clone, Debug)]
pub struct Request {
    pub user: String,
    pub verb: String,
    /// `resource` or `resource/subresource`; empty for non-resource URLs.
    pub resource: String,
    /// Nanoseconds since the Unix epoch when kube-apiserver received it.
    pub received_ns: i128,
}

/// Every request in the audit log, once each.
pub fn read(path: &Path) -> Result<Vec<Request>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("opening {}", path.display())),
    };
    let mut seen = HashSet::new();
    let mut requests = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        if !seen.insert(text(&event["auditID"])) {
            continue;
        }
        let received: Option<k8s_openapi::jiff::Timestamp> = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok());
        let Some(received) = received else { continue };
        let object = &event["objectRef"];
        let mut resource = text(&object["resource"]);
        if resource.is_empty() {
            resource = "(non-resource)".to_string();
        }
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        requests.push(Request {
            user: text(&event["user"]["username"]),
            verb: text(&event["verb"]),
            resource,
            received_ns: received.as_nanosecond(),
        });
    }
    Ok(requests)
}

/// Nanoseconds since the Unix epoch.
pub fn epoch_ns(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

/// Requests of `user` received in `[from, to)`, by verb.
pub fn by_verb(
    requests: &[Request],
    user: &str,
    from: SystemTime,
    to: SystemTime,
) -> BTreeMap<String, u64> {
    count_by(requests, user, from, to, |r| r.verb.clone())
}

/// Requests of `user` received in `[from, to)`, by "verb resource".
pub fn by_verb_and_resource(
    requests: &[Request],
    user: &str,
    from: SystemTime,
    to: SystemTime,
) -> BTreeMap<String, u64> {
    count_by(requests, user, from, to, |r| {
        format!("{} {}", r.verb, r.resource)
    })
}

fn count_by(
    requests: &[Request],
    user: &str,
    from: SystemTime,
    to: SystemTime,
    key: impl Fn(&Request) -> String,
) -> BTreeMap<String, u64> {
    let (from, to) = (epoch_ns(from), epoch_ns(to));
    let mut counts = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.user == user && r.received_ns >= from && r.received_ns < to)
    {
        *counts.entry(key(r)).or_insert(0) += 1;
    }
    counts
}

/// Adds `more` into `into`.
pub fn add(into: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (k, v) in more {
        *into.entry(k.clone()).or_insert(0) += v;
    }
}
