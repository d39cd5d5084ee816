//! `make conformance`: upstream's own e2e specs for the Endpoints,
//! EndpointSlice and EndpointSlice-mirroring controllers, run against
//! endpoints-guard and against kube-controller-manager's endpoint controllers
//! on the same kind of cluster (the local control plane, kube-scheduler, KWOK
//! fake nodes). This module holds what needs no cluster: which specs run and
//! why, reading ginkgo's JSON report, and the report (`report.json`,
//! `report.md`). The binary `eg-conformance` starts the clusters and runs the
//! suite; `docs/conformance.md` has the results.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A spec of upstream's network suite and why it is (or is not) run here.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The ginkgo name, as `e2e.test` reports it.
    pub name: &'static str,
    /// Which controller it exercises and how.
    pub why: &'static str,
}

/// Every spec of `k8s.io/kubernetes/test/e2e/network` (v1.36.3) that
/// exercises the Endpoints, EndpointSlice or EndpointSlice-mirroring
/// controllers and runs on fake nodes: it needs no exec into a container, no
/// container logs, no DNS and no traffic to a pod.
pub const FAKE_NODE_SPECS: [Spec; 9] = [
    Spec {
        name: "[sig-network] API Server should have Endpoints and EndpointSlices pointing to API Server [Conformance]",
        why: "the kubernetes Service's slice comes from kube-apiserver's lease reconciler; the controllers must leave it alone",
    },
    Spec {
        name: "[sig-network] Endpoints should test the lifecycle of an Endpoint [Conformance]",
        why: "user-made Endpoints of a selector-less Service are created, patched, deleted by collection; the Endpoints controller must not touch them",
    },
    Spec {
        name: "[sig-network] EndpointsController should create and delete Endpoints for a Service with a selector that matches no pods [Conformance]",
        why: "Endpoints controller: empty Endpoints for a selector matching nothing, deleted with the Service",
    },
    Spec {
        name: "[sig-network] EndpointsController should create Endpoints for Pods matching a Service [Conformance]",
        why: "Endpoints controller: pods added, relabelled and deleted change the addresses",
    },
    Spec {
        name: "[sig-network] EndpointSlice should create and delete EndpointSlices for a Service with a selector that matches no pods [Conformance]",
        why: "EndpointSlice controller: the placeholder slice, its labels (managed-by included), deleted with the Service",
    },
    Spec {
        name: "[sig-network] EndpointSlice should create Endpoints and EndpointSlices for Pods matching a Service [Conformance]",
        why: "both controllers: endpoints of matching pods, hostnames, node names, ports",
    },
    Spec {
        name: "[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]",
        why: "user-made slices (another managed-by value) are created, updated, deleted by collection; the EndpointSlice controller must not touch them",
    },
    Spec {
        name: "[sig-network] EndpointSliceMirroring should mirror a custom Endpoints resource through create update and delete [Conformance]",
        why: "mirroring controller beside ours: user Endpoints of a selector-less Service become slices",
    },
    Spec {
        name: "[sig-network] Service endpoints latency should not be very high [Conformance]",
        why: "EndpointSlice controller: 200 Services over one Deployment's pod, the time until each has a slice with an endpoint",
    },
];

/// The fake-node specs of v1.34.4's suite, where they were named and cut
/// otherwise: 1.35 moved the API Server and Endpoints lifecycle specs to
/// `apiserver.go` and `endpoints.go` (describes "API Server", "Endpoints"),
/// split "create and delete Endpoints and EndpointSlices for a Service with a
/// selector specified" into one spec per controller, and added
/// "EndpointsController should create Endpoints for Pods matching a
/// Service". Read in `test/e2e/network/` of each release.
pub const FAKE_NODE_SPECS_1_34: [Spec; 7] = [
    Spec {
        name: "[sig-network] EndpointSlice should have Endpoints and EndpointSlices pointing to API Server [Conformance]",
        why: "the kubernetes Service's slice comes from kube-apiserver's lease reconciler; the controllers must leave it alone",
    },
    Spec {
        name: "[sig-network] Services should test the lifecycle of an Endpoint [Conformance]",
        why: "user-made Endpoints of a selector-less Service are created, patched, deleted by collection; the Endpoints controller must not touch them",
    },
    Spec {
        name: "[sig-network] EndpointSlice should create and delete Endpoints and EndpointSlices for a Service with a selector specified [Conformance]",
        why: "both controllers: an empty Endpoints and the placeholder slice for a selector matching nothing, deleted with the Service",
    },
    FAKE_NODE_SPECS[5],
    FAKE_NODE_SPECS[6],
    FAKE_NODE_SPECS[7],
    FAKE_NODE_SPECS[8],
];

/// The fake-node specs of the suite of `kubernetes` (`v1.34.4`, ...): as
/// [`FAKE_NODE_SPECS_1_34`] names them up to 1.34, as [`FAKE_NODE_SPECS`]
/// from 1.35.
pub fn fake_node_specs(kubernetes: &str) -> &'static [Spec] {
    let minor = kubernetes
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(minor) if minor <= 34 => &FAKE_NODE_SPECS_1_34,
        _ => &FAKE_NODE_SPECS,
    }
}

/// Specs of the same suite that exercise these controllers but need a real
/// node (exec into a container, container logs, traffic through kube-proxy,
/// Service names resolved, readiness from a kubelet's probes), and why: run
/// on the real one-node cluster of [`crate`] where it can run.
pub const REAL_NODE_SPECS: [Spec; 11] = [
    Spec {
        name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]",
        why: "checks the Service by connecting from an exec pod (kube-proxy, a container runtime)",
    },
    Spec {
        name: "[sig-network] Services should serve multiport endpoints from pods [Conformance]",
        why: "connects from an exec pod to each port",
    },
    Spec {
        name: "[sig-network] EndpointSlice should support a Service with multiple ports specified in multiple EndpointSlices [Conformance]",
        why: "connects from an exec pod through the Service",
    },
    Spec {
        name: "[sig-network] EndpointSlice should support a Service with multiple endpoint IPs specified in multiple EndpointSlices [Conformance]",
        why: "connects from an exec pod through the Service",
    },
    Spec {
        name: "[sig-network] Services should create endpoints for unready pods",
        why: "readiness comes from an exec probe run by a kubelet; KWOK marks every pod ready",
    },
    Spec {
        name: "[sig-network] Services should be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is true",
        why: "exec probes and traffic to terminating pods",
    },
    Spec {
        name: "[sig-network] Services should not be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is false",
        why: "exec probes and traffic to terminating pods",
    },
    Spec {
        name: "[sig-network] Services should serve endpoints on same port and different protocols [Conformance]",
        why: "TCP and UDP traffic from an exec pod",
    },
    Spec {
        name: "[sig-network] Services should support named targetPorts that resolve to different ports on different endpoints",
        why: "traffic from an exec pod to each endpoint",
    },
    Spec {
        name: "[sig-network] EndpointSliceMirroring should mirror a custom Endpoint with multiple subsets and same IP address",
        why: "checks the mirrored slices by connecting through the Service from an exec pod (kubectl exec ... curl)",
    },
    Spec {
        name: "[sig-network] Services should implement service.kubernetes.io/headless",
        why: "checks reachability from a host-exec pod (kube-proxy)",
    },
];

/// Whether `spec` (our name) is one of [`REAL_NODE_SPECS`].
pub fn needs_real_node(spec: &str) -> bool {
    REAL_NODE_SPECS.iter().any(|s| s.name == spec)
}

/// One column's verdict on a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    Skip,
}

impl Outcome {
    fn from_ginkgo(state: &str) -> Self {
        match state {
            "passed" => Outcome::Pass,
            "skipped" | "pending" => Outcome::Skip,
            // failed, panicked, interrupted, aborted, timedout
            _ => Outcome::Fail,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        }
    }
}

/// What one run of the suite said about one spec.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecResult {
    pub outcome: Outcome,
    pub seconds: f64,
    /// The failure message, first line, when it failed; the suite's reason
    /// when it skipped itself (a spec that needs two nodes, say).
    pub failure: Option<String>,
}

/// A spec name without its bracketed tags (`[sig-network]`, `[Conformance]`,
/// ...), spaces collapsed: how the names the suite reports are matched to
/// ours, whichever way a ginkgo version places the tags.
pub fn bare_name(name: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `--ginkgo.focus` regular expression that selects exactly `spec`: its
/// bare name, regex metacharacters escaped.
pub fn focus(spec: &Spec) -> String {
    let mut out = String::new();
    for c in bare_name(spec.name).chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Reads ginkgo's JSON report (`--ginkgo.json-report`): the result of every
/// spec of `specs` found in it, by our name. Specs the run left out are
/// absent.
pub fn read_ginkgo_report(text: &str, specs: &[Spec]) -> Result<BTreeMap<String, SpecResult>> {
    let suites: Vec<Value> =
        serde_json::from_str(text).context("the ginkgo JSON report is not a list of suites")?;
    let wanted: BTreeMap<String, &Spec> = specs.iter().map(|s| (bare_name(s.name), s)).collect();
    let mut found = BTreeMap::new();
    for suite in &suites {
        let Some(reports) = suite.get("SpecReports").and_then(Value::as_array) else {
            bail!("a suite of the ginkgo report has no SpecReports");
        };
        for report in reports {
            if report.get("LeafNodeType").and_then(Value::as_str) != Some("It") {
                continue;
            }
            let containers = report
                .get("ContainerHierarchyTexts")
                .and_then(Value::as_array)
                .map(|texts| {
                    texts
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let leaf = report
                .get("LeafNodeText")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(spec) = wanted.get(&bare_name(&format!("{containers} {leaf}"))) else {
                continue;
            };
            let state = report
                .get("State")
                .and_then(Value::as_str)
                .context("a spec report without State")?;
            let outcome = Outcome::from_ginkgo(state);
            // RunTime is in nanoseconds.
            let seconds = report.get("RunTime").and_then(Value::as_f64).unwrap_or(0.0) / 1e9;
            let failure = (outcome != Outcome::Pass).then(|| {
                report
                    .pointer("/Failure/Message")
                    .and_then(Value::as_str)
                    .unwrap_or(state)
                    .lines()
                    .next()
                    .unwrap_or(state)
                    .to_string()
            });
            found.insert(
                spec.name.to_string(),
                SpecResult {
                    outcome,
                    seconds,
                    failure,
                },
            );
        }
    }
    Ok(found)
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub spec: String,
    pub upstream: Option<SpecResult>,
    /// endpoints-guard in all scope, in place of kube-controller-manager's
    /// endpoint controllers.
    pub endpoints_guard: Option<SpecResult>,
    /// endpoints-guard in opt-in scope, beside kube-controller-manager's
    /// endpoint controllers (it must disturb none of the suite's Services).
    pub opt_in: Option<SpecResult>,
}

impl Row {
    fn outcome(result: &Option<SpecResult>) -> Outcome {
        result.as_ref().map_or(Outcome::Skip, |r| r.outcome)
    }

    pub fn upstream_outcome(&self) -> Outcome {
        Self::outcome(&self.upstream)
    }

    pub fn guard_outcome(&self) -> Outcome {
        Self::outcome(&self.endpoints_guard)
    }

    pub fn opt_in_outcome(&self) -> Outcome {
        Self::outcome(&self.opt_in)
    }

    /// endpoints-guard's columns: who, and the result.
    fn guard_columns(&self) -> [(&'static str, &Option<SpecResult>); 2] {
        [
            ("endpoints-guard", &self.endpoints_guard),
            ("endpoints-guard in opt-in scope", &self.opt_in),
        ]
    }

    /// The longest of the runs, seconds.
    pub fn seconds(&self) -> f64 {
        [&self.upstream, &self.endpoints_guard, &self.opt_in]
            .into_iter()
            .flatten()
            .map(|r| r.seconds)
            .fold(0.0, f64::max)
    }
}

/// The results of each column, by spec name; a column that was not run is
/// `None`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Columns<'a> {
    pub upstream: Option<&'a BTreeMap<String, SpecResult>>,
    pub endpoints_guard: Option<&'a BTreeMap<String, SpecResult>>,
    pub opt_in: Option<&'a BTreeMap<String, SpecResult>>,
}

/// The rows, one per spec of `specs`, in that order. A column that was not
/// run is `None` in every row.
pub fn rows(specs: &[Spec], columns: Columns<'_>) -> Vec<Row> {
    let get = |column: Option<&BTreeMap<String, SpecResult>>, spec: &Spec| {
        column.and_then(|m| m.get(spec.name).cloned())
    };
    specs
        .iter()
        .map(|spec| Row {
            spec: spec.name.to_string(),
            upstream: get(columns.upstream, spec),
            endpoints_guard: get(columns.endpoints_guard, spec),
            opt_in: get(columns.opt_in, spec),
        })
        .collect()
}

/// What is wrong: a spec one of endpoints-guard's columns that ran does not
/// pass although kube-controller-manager passes it (or, without the
/// upstream column, does not pass at all unless the suite skipped it
/// itself), and a spec no column ran.
pub fn verdict(rows: &[Row], columns: Columns<'_>) -> Vec<String> {
    let upstream_ran = columns.upstream.is_some();
    let ran = [columns.endpoints_guard.is_some(), columns.opt_in.is_some()];
    let mut problems = Vec::new();
    for row in rows {
        let up = row.upstream_outcome();
        for ((who, result), ran) in row.guard_columns().into_iter().zip(ran) {
            let ours = Row::outcome(result);
            // Without the upstream column, a spec the suite skipped itself
            // (it needs two nodes, say) says nothing about endpoints-guard.
            let suite_skipped = result.as_ref().is_some_and(|r| r.outcome == Outcome::Skip);
            if ran
                && ours != Outcome::Pass
                && (up == Outcome::Pass || (!upstream_ran && !suite_skipped))
            {
                let why = result
                    .as_ref()
                    .and_then(|r| r.failure.clone())
                    .unwrap_or_else(|| "not run".into());
                problems.push(format!(
                    "{who}: {} ({}; kube-controller-manager: {}): {why}",
                    row.spec,
                    ours.as_str(),
                    up.as_str()
                ));
            }
        }
        if row.upstream.is_none() && row.endpoints_guard.is_none() && row.opt_in.is_none() {
            problems.push(format!("{}: run by neither column", row.spec));
        }
    }
    problems
}

/// `report.json`: `specs` (one object per spec: `spec`, `node` (`fake` or
/// `real`), `upstream`, `endpoints_guard`, `opt_in`, `seconds`) and the run's
/// context.
pub fn report_json(rows: &[Row], context: Value) -> Value {
    let specs: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "spec": row.spec,
                "node": if needs_real_node(&row.spec) { "real" } else { "fake" },
                "upstream": row.upstream_outcome().as_str(),
                "endpoints_guard": row.guard_outcome().as_str(),
                "opt_in": row.opt_in_outcome().as_str(),
                "seconds": (row.seconds() * 10.0).round() / 10.0,
            })
        })
        .collect();
    json!({"specs": specs, "context": context})
}

/// `report.md`: the table, then the failure messages.
pub fn report_markdown(rows: &[Row], header: &str) -> String {
    let mut out = format!("{header}\n\n");
    out.push_str("| spec | node | kube-controller-manager | endpoints-guard | endpoints-guard, opt-in scope | seconds |\n");
    out.push_str("| --- | --- | --- | --- | --- | ---: |\n");
    for row in rows {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {:.1} |\n",
            row.spec,
            if needs_real_node(&row.spec) {
                "real"
            } else {
                "KWOK"
            },
            row.upstream_outcome().as_str(),
            row.guard_outcome().as_str(),
            row.opt_in_outcome().as_str(),
            row.seconds()
        ));
    }
    let failures: Vec<String> = rows
        .iter()
        .flat_map(|row| {
            std::iter::once(("kube-controller-manager", &row.upstream))
                .chain(row.guard_columns())
                .filter_map(move |(who, r)| {
                    r.as_ref()
                        .and_then(|r| r.failure.as_ref())
                        .map(|f| format!("- {who}, `{}`: {f}", row.spec))
                })
        })
        .collect();
    if !failures.is_empty() {
        out.push_str("\nFailures, and why the suite skipped a spec:\n\n");
        out.push_str(&failures.join("\n"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(entries: &[(&[&str], &str, &str, f64)]) -> String {
        let specs: Vec<Value> = entries
            .iter()
            .map(|(containers, leaf, state, seconds)| {
                json!({"ContainerHierarchyTexts": containers, "LeafNodeText": leaf,
                       "LeafNodeType": "It", "State": state, "RunTime": seconds * 1e9,
                       "Failure": {"Message": format!("{leaf} went wrong\nstack")}})
            })
            .collect();
        json!([{"SuitePath": "/x", "SpecReports": specs}]).to_string()
    }

    #[test]
    fn bare_names_and_focus() {
        assert_eq!(
            bare_name("[sig-network] EndpointSlice should x [Conformance]"),
            "EndpointSlice should x"
        );
        assert_eq!(bare_name("a  [Feature:X]  b"), "a b");
        let spec = Spec {
            name: "[sig-network] Services should serve (x) on a.b [Conformance]",
            why: "",
        };
        assert_eq!(focus(&spec), r"Services should serve \(x\) on a\.b");
        // Every listed name is unique once bare.
        let mut names: Vec<String> = FAKE_NODE_SPECS
            .iter()
            .chain(&REAL_NODE_SPECS)
            .map(|s| bare_name(s.name))
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FAKE_NODE_SPECS.len() + REAL_NODE_SPECS.len());
    }

    #[test]
    fn each_release_runs_its_own_names_of_the_fake_node_specs() {
        assert_eq!(fake_node_specs("v1.34.4").len(), 7);
        for newer in ["v1.35.4", "v1.36.3", "v1.37.2", "1.37"] {
            assert_eq!(
                fake_node_specs(newer).len(),
                FAKE_NODE_SPECS.len(),
                "{newer}"
            );
        }
        let mut names: Vec<String> = FAKE_NODE_SPECS_1_34
            .iter()
            .chain(&REAL_NODE_SPECS)
            .map(|s| bare_name(s.name))
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            FAKE_NODE_SPECS_1_34.len() + REAL_NODE_SPECS.len()
        );
        // The names 1.35 changed are not asked of 1.34's suite.
        for spec in &FAKE_NODE_SPECS_1_34 {
            assert!(!spec.name.contains("EndpointsController"), "{}", spec.name);
            assert!(
                !spec.name.starts_with("[sig-network] API Server"),
                "{}",
                spec.name
            );
        }
    }

    #[test]
    fn ginkgo_reports_are_read_by_name_whatever_the_tags() {
        let specs = &FAKE_NODE_SPECS[..3];
        let text = report(&[
            // Tags in the container text and the leaf, as the suite writes them.
            (
                &["[sig-network] API Server"],
                "should have Endpoints and EndpointSlices pointing to API Server [Conformance]",
                "passed",
                1.5,
            ),
            (
                &["[sig-network]", "Endpoints"],
                "should test the lifecycle of an Endpoint",
                "failed",
                2.0,
            ),
            (&["[sig-network] Other"], "something else", "passed", 1.0),
        ]);
        let found = read_ginkgo_report(&text, specs).expect("reads");
        assert_eq!(found.len(), 2);
        let api = &found[specs[0].name];
        assert_eq!(
            (api.outcome, api.seconds, api.failure.clone()),
            (Outcome::Pass, 1.5, None)
        );
        let lifecycle = &found[specs[1].name];
        assert_eq!(lifecycle.outcome, Outcome::Fail);
        assert_eq!(
            lifecycle.failure.as_deref(),
            Some("should test the lifecycle of an Endpoint went wrong")
        );
        assert!(!found.contains_key(specs[2].name), "not in the report");
        assert!(read_ginkgo_report("{}", specs).is_err());
        assert!(read_ginkgo_report(r#"[{"SuitePath": "/x"}]"#, specs).is_err());
    }

    fn result(outcome: Outcome) -> SpecResult {
        SpecResult {
            outcome,
            seconds: 3.0,
            failure: (outcome == Outcome::Fail).then(|| "boom".to_string()),
        }
    }

    #[test]
    fn the_verdict_fails_on_what_only_endpoints_guard_fails() {
        use Outcome::*;
        let row = |up: Option<Outcome>, ours: Option<Outcome>| Row {
            spec: "s".into(),
            upstream: up.map(result),
            endpoints_guard: ours.map(result),
            opt_in: None,
        };
        let ran = BTreeMap::new();
        let both = Columns {
            upstream: Some(&ran),
            endpoints_guard: Some(&ran),
            opt_in: None,
        };
        let guard_only = Columns {
            upstream: None,
            ..both
        };
        let upstream_only = Columns {
            endpoints_guard: None,
            ..both
        };
        // Both pass, both fail: nothing to say about endpoints-guard.
        assert!(verdict(&[row(Some(Pass), Some(Pass))], both).is_empty());
        assert!(verdict(&[row(Some(Fail), Some(Fail))], both).is_empty());
        // Only endpoints-guard fails, or skips: fails.
        assert_eq!(verdict(&[row(Some(Pass), Some(Fail))], both).len(), 1);
        assert_eq!(verdict(&[row(Some(Pass), Some(Skip))], both).len(), 1);
        assert_eq!(verdict(&[row(Some(Pass), None)], both).len(), 1);
        // Without the upstream column, endpoints-guard must pass everything.
        assert_eq!(verdict(&[row(None, Some(Fail))], guard_only).len(), 1);
        assert!(verdict(&[row(None, Some(Pass))], guard_only).is_empty());
        assert!(verdict(&[row(None, Some(Skip))], guard_only).is_empty());
        // Without endpoints-guard's column, only the upstream run counts.
        assert!(verdict(&[row(Some(Pass), None)], upstream_only).is_empty());
        // Run by neither: the name matches nothing any more.
        let problems = verdict(&[row(None, None)], both);
        assert!(
            problems.iter().any(|p| p.contains("run by neither")),
            "{problems:?}"
        );
        // Skipped by the suite itself in both columns: shown, not a problem.
        assert!(verdict(&[row(Some(Skip), Some(Skip))], both).is_empty());
        assert!(!verdict(&[row(None, None)], upstream_only).is_empty());
    }

    /// The opt-in column is judged as the other: beside kube-controller-
    /// manager's controllers, every spec they pass must still pass.
    #[test]
    fn the_verdict_judges_the_opt_in_column_too() {
        use Outcome::*;
        let row = |up: Outcome, opt_in: Option<Outcome>| Row {
            spec: "s".into(),
            upstream: Some(result(up)),
            endpoints_guard: None,
            opt_in: opt_in.map(result),
        };
        let ran = BTreeMap::new();
        let columns = Columns {
            upstream: Some(&ran),
            endpoints_guard: None,
            opt_in: Some(&ran),
        };
        assert!(verdict(&[row(Pass, Some(Pass))], columns).is_empty());
        let problems = verdict(&[row(Pass, Some(Fail))], columns);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("endpoints-guard in opt-in scope"),
            "{problems:?}"
        );
        assert_eq!(verdict(&[row(Pass, None)], columns).len(), 1);
        assert!(verdict(&[row(Fail, Some(Fail))], columns).is_empty());
    }

    #[test]
    fn reports_carry_every_column() {
        let specs = &FAKE_NODE_SPECS[..2];
        let up: BTreeMap<String, SpecResult> = [
            (specs[0].name.to_string(), result(Outcome::Pass)),
            (specs[1].name.to_string(), result(Outcome::Fail)),
        ]
        .into();
        let upstream_only = Columns {
            upstream: Some(&up),
            ..Columns::default()
        };
        let rows = rows(specs, upstream_only);
        let json = report_json(&rows, json!({"commit": "abc"}));
        assert_eq!(json["specs"][0]["upstream"], "pass");
        assert_eq!(json["specs"][0]["node"], "fake");
        assert_eq!(json["specs"][0]["endpoints_guard"], "skip");
        assert_eq!(json["specs"][0]["opt_in"], "skip");
        assert_eq!(json["specs"][1]["upstream"], "fail");
        assert_eq!(json["specs"][1]["seconds"], 3.0);
        assert_eq!(json["context"]["commit"], "abc");
        let md = report_markdown(&rows, "# Report");
        assert!(md.contains("| KWOK | pass | skip | skip | 3.0 |"), "{md}");
        let real = super::rows(&REAL_NODE_SPECS[..1], upstream_only);
        assert_eq!(report_json(&real, json!({}))["specs"][0]["node"], "real");
        assert!(report_markdown(&real, "#").contains("| real | skip | skip | skip |"));
        assert!(md.contains("- kube-controller-manager, `"), "{md}");
    }
}
