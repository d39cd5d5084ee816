//! `make matrix` (program `eg-matrix`): what each step's own report says,
//! summed up per Kubernetes release, and what fails the matrix. The steps
//! are the existing tests and tools (`make parity`'s corpus, `eg-conformance`
//! on fake nodes, the chaos rows of etcd restores and the watch-cache ghost,
//! the real-node short form); this module only reads their reports, so the
//! verdict is the same whoever ran them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The chaos rows the matrix runs (`EG_CHAOS_ONLY` takes them as whole
/// names: the two-API-server variant of the ghost row is left out).
pub const CHAOS_ROWS: [&str; 3] = [
    "etcd-restore-plain",
    "etcd-restore-bump-revision",
    "watch-cache-lost-pod-delete",
];

/// The controller names the chaos and real-node reports use.
pub const GUARD: &str = "endpoints-guard";
pub const UPSTREAM: &str = "kube-controller-manager";

/// The real-node row judged by its repair time rather than by requests
/// (`tests/e2e/real_node/at_scale.rs`): kept out of the wrong-endpoint sums.
pub use eg_node::AT_SCALE_ROW;

/// One step's figures for the matrix report, and what in them fails it.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub figures: Value,
    pub problems: Vec<String>,
}

fn count(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items.len() as u64,
        other => other.as_u64().unwrap_or_default(),
    }
}

/// A parity report (`target/parity/report.json` or `slices-report.json`):
/// objects compared, cold start and after churn together. `what` names it
/// in problems; `version` is the release the run was for, which the report
/// must name (a report left from another release's run is not evidence).
pub fn parity(report: &Value, what: &str, version: &str) -> Summary {
    let identical = count(&report["identical"]);
    let different = count(&report["different"]);
    let mut problems = Vec::new();
    if report["kubernetes"].as_str() != Some(version) {
        problems.push(format!(
            "{what}: the report is of Kubernetes {}, not {version}",
            report["kubernetes"]
        ));
    }
    if different > 0 {
        problems.push(format!(
            "{what}: {different} object(s) differ from upstream's"
        ));
    }
    if identical + different == 0 {
        problems.push(format!("{what}: no object compared"));
    }
    let mut figures = json!({"identical": identical, "different": different});
    for round in ["cold_start", "after_churn"] {
        if report[round].is_object() {
            figures[round] = json!({
                "identical": count(&report[round]["identical"]),
                "different": count(&report[round]["different"]),
            });
        }
    }
    if let Some(scale) = report["scale"].as_str() {
        figures["scale"] = json!(scale);
    }
    Summary { figures, problems }
}

/// An `eg-conformance --nodes fake` report: the fake-node specs, how many
/// each column passed, and every spec kube-controller-manager passed that
/// endpoints-guard (in either scope) did not.
pub fn conformance(report: &Value, version: &str) -> Summary {
    let specs: Vec<&Value> = report["specs"]
        .as_array()
        .map(|s| s.iter().filter(|s| s["node"] == "fake").collect())
        .unwrap_or_default();
    let passed = |column: &str| specs.iter().filter(|s| s[column] == "pass").count();
    let mut problems = Vec::new();
    if report["context"]["kubernetes"].as_str() != Some(version) {
        problems.push(format!(
            "conformance: the report is of Kubernetes {}, not {version}",
            report["context"]["kubernetes"]
        ));
    }
    if specs.is_empty() {
        problems.push("conformance: no fake-node spec in the report".into());
    }
    for spec in &specs {
        for (column, who) in [
            ("endpoints_guard", "endpoints-guard"),
            ("opt_in", "endpoints-guard in opt-in scope"),
        ] {
            if spec["upstream"] == "pass" && spec[column] != "pass" {
                problems.push(format!(
                    "conformance: {who} did not pass {} (kube-controller-manager did): {}",
                    spec["spec"], spec[column]
                ));
            }
        }
    }
    Summary {
        figures: json!({
            "specs": specs.len(),
            "upstream_pass": passed("upstream"),
            "endpoints_guard_pass": passed("endpoints_guard"),
            "opt_in_pass": passed("opt_in"),
        }),
        problems,
    }
}

/// A chaos report (`target/chaos/report.json`) of the rows `expected`:
/// endpoints-guard's rows, how many converged and how many spurious
/// deletions they saw; kube-controller-manager's the same, for comparison.
pub fn chaos(report: &Value, expected: &[&str]) -> Summary {
    let rows: Vec<&Value> = report["scenarios"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let of = |controller: &str| {
        let mine: Vec<&&Value> = rows
            .iter()
            .filter(|r| r["controller"] == controller)
            .collect();
        json!({
            "rows": mine.len(),
            "converged": mine.iter().filter(|r| r["converged"] == true).count(),
            "spurious": mine.iter().map(|r| count(&r["spurious_deletions"])).sum::<u64>(),
        })
    };
    let mut problems = Vec::new();
    for name in expected {
        match rows
            .iter()
            .find(|r| r["name"] == *name && r["controller"] == GUARD)
        {
            None => problems.push(format!("chaos: no {name} row of endpoints-guard")),
            Some(row) => {
                if row["converged"] != true {
                    problems.push(format!("chaos: {name}: endpoints-guard did not converge"));
                }
                let spurious = count(&row["spurious_deletions"]);
                if spurious > 0 {
                    problems.push(format!(
                        "chaos: {name}: endpoints-guard made {spurious} spurious deletion(s)"
                    ));
                }
            }
        }
    }
    let mut figures = of(GUARD);
    figures["kube_controller_manager"] = of(UPSTREAM);
    Summary { figures, problems }
}

/// The real-node short form's report (`target/e2e-node/short/report.json`):
/// requests failed by wrong endpoints per controller, summed over the rows
/// of scope "all" and "opt-in" (in an opt-in row, kube-controller-manager's
/// is the Service that did not opt in); the at-scale row apart, by its
/// repair time.
pub fn real_node(report: &Value) -> Summary {
    let rows: Vec<&Value> = report["rows"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    let mut at_scale = serde_json::Map::new();
    for row in &rows {
        let controller = row["controller"].as_str().unwrap_or("unknown").to_string();
        if row["name"] == AT_SCALE_ROW {
            at_scale.insert(
                controller,
                json!({
                    "repair_s": row["repair_s"],
                    "failed_wrong_endpoints": row["failed_wrong_endpoints"],
                }),
            );
        } else if matches!(row["scope"].as_str(), Some("all" | "opt-in")) {
            *failed.entry(controller).or_default() += count(&row["failed_wrong_endpoints"]);
        }
    }
    let mut problems = Vec::new();
    match failed.get(GUARD) {
        None => problems.push("real node: no row of endpoints-guard".into()),
        Some(&n) if n > 0 => problems.push(format!(
            "real node: endpoints-guard failed {n} request(s) by wrong endpoints"
        )),
        Some(_) => {}
    }
    if report["host_clean"] != true {
        problems.push(format!(
            "real node: the host was left changed: {}",
            report["host_differences"]
        ));
    }
    let mut figures = json!({"failed_wrong_endpoints": failed, "rows": rows.len()});
    if !at_scale.is_empty() {
        figures["at_scale"] = Value::Object(at_scale);
    }
    Summary { figures, problems }
}

fn cell(figures: &Value, text: impl Fn(&Value) -> String) -> String {
    if figures.is_null() {
        "not run".into()
    } else {
        text(figures)
    }
}

/// `report.md`: one line per release, then every problem.
pub fn markdown(report: &Value) -> String {
    let mut out = format!(
        "# Kubernetes releases: endpoints-guard against each one's kube-controller-manager\n\n\
         Commit {}, {}.\n\n\
         | release | Endpoints parity: identical / different | EndpointSlice parity: identical / different | conformance (fake nodes): kube-controller-manager / endpoints-guard / opt-in scope | chaos, endpoints-guard: converged / rows, spurious deletions | real node: requests failed by wrong endpoints |\n\
         | --- | --- | --- | --- | --- | --- |\n",
        report["commit"].as_str().unwrap_or("unknown"),
        report["date"].as_str().unwrap_or("unknown"),
    );
    let versions = report["versions"].as_array().cloned().unwrap_or_default();
    for v in &versions {
        let parity = |p: &Value| format!("{} / {}", p["identical"], p["different"]);
        let conformance = |c: &Value| {
            format!(
                "{} / {} / {} of {}",
                c["upstream_pass"], c["endpoints_guard_pass"], c["opt_in_pass"], c["specs"]
            )
        };
        let chaos = |c: &Value| format!("{} / {}, {}", c["converged"], c["rows"], c["spurious"]);
        let real = |r: &Value| {
            let failed = &r["failed_wrong_endpoints"];
            let mut text = format!(
                "endpoints-guard {}, kube-controller-manager {}",
                failed[GUARD], failed[UPSTREAM]
            );
            if let Some(at_scale) = r["at_scale"].as_object() {
                let repairs: Vec<String> = at_scale
                    .iter()
                    .map(|(who, row)| match row["repair_s"].as_f64() {
                        Some(seconds) => format!("{who} {seconds} s"),
                        None => format!("{who} not repaired within the row"),
                    })
                    .collect();
                text.push_str(&format!("; at scale, repaired in: {}", repairs.join(", ")));
            }
            text
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            v["version"].as_str().unwrap_or("?"),
            cell(&v["parity_endpoints"], parity),
            cell(&v["parity_slices"], parity),
            cell(&v["conformance"], conformance),
            cell(&v["chaos"], chaos),
            cell(&v["real_node"], real),
        ));
    }
    let problems: Vec<String> = versions
        .iter()
        .flat_map(|v| {
            let version = v["version"].as_str().unwrap_or("?").to_string();
            v["problems"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |p| format!("- {version}: {}", p.as_str().unwrap_or_default()))
        })
        .collect();
    if problems.is_empty() {
        out.push_str("\nNo problem.\n");
    } else {
        out.push_str("\nProblems:\n\n");
        out.push_str(&problems.join("\n"));
        out.push('\n');
    }
    out.push_str(
        "\nEach step's own report is under `<release>/`; its output in `<release>/<step>.log`.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parity_counts_objects_and_fails_on_a_difference_or_another_release() {
        let endpoints = json!({"kubernetes": "v1.34.4", "identical": 380, "different": 0,
            "cold_start": {"identical": 190, "different": []},
            "after_churn": {"identical": 190, "different": []}, "scale": "full"});
        let s = parity(&endpoints, "Endpoints parity", "v1.34.4");
        assert_eq!(s.problems, Vec::<String>::new());
        assert_eq!(s.figures["identical"], 380);
        assert_eq!(s.figures["after_churn"]["different"], 0);
        // The Endpoints report of before listed its differences.
        let listed =
            json!({"kubernetes": "v1.34.4", "identical": 33, "different": [{"service": "a/b"}]});
        let s = parity(&listed, "Endpoints parity", "v1.34.4");
        assert_eq!(s.figures["different"], 1);
        assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
        let s = parity(&endpoints, "Endpoints parity", "v1.35.4");
        assert!(s.problems[0].contains("not v1.35.4"), "{:?}", s.problems);
        let s = parity(&json!({"kubernetes": "v1.34.4"}), "x", "v1.34.4");
        assert!(
            s.problems[0].contains("no object compared"),
            "{:?}",
            s.problems
        );
    }

    #[test]
    fn conformance_fails_on_a_spec_only_upstream_passes_and_counts_fake_nodes_only() {
        let spec = |name: &str, node: &str, up: &str, eg: &str, opt: &str| json!({"spec": name, "node": node, "upstream": up, "endpoints_guard": eg, "opt_in": opt});
        let report = json!({"context": {"kubernetes": "v1.37.2"}, "specs": [
            spec("a", "fake", "pass", "pass", "pass"),
            spec("b", "fake", "fail", "fail", "pass"),
            spec("c", "real", "skip", "skip", "skip"),
        ]});
        let s = conformance(&report, "v1.37.2");
        assert_eq!(
            s.figures,
            json!({"specs": 2, "upstream_pass": 1, "endpoints_guard_pass": 1, "opt_in_pass": 2})
        );
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        let report = json!({"context": {"kubernetes": "v1.37.2"}, "specs": [
            spec("a", "fake", "pass", "fail", "pass"),
            spec("b", "fake", "pass", "pass", "skip"),
        ]});
        let s = conformance(&report, "v1.37.2");
        assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
        assert!(s.problems[1].contains("opt-in scope"), "{:?}", s.problems);
    }

    #[test]
    fn chaos_fails_on_a_missing_unconverged_or_spurious_row_of_endpoints_guard() {
        let row = |name: &str, who: &str, converged: bool, spurious: u64| json!({"name": name, "controller": who, "converged": converged, "spurious_deletions": spurious});
        let report = json!({"scenarios": [
            row("etcd-restore-plain", GUARD, true, 0),
            row("etcd-restore-plain", UPSTREAM, false, 2),
            row("etcd-restore-bump-revision", GUARD, true, 0),
            row("etcd-restore-bump-revision", UPSTREAM, true, 0),
            row("watch-cache-lost-pod-delete", GUARD, true, 0),
            row("watch-cache-lost-pod-delete", UPSTREAM, false, 0),
        ]});
        let s = chaos(&report, &CHAOS_ROWS);
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.figures["rows"], 3);
        assert_eq!(s.figures["converged"], 3);
        assert_eq!(s.figures["spurious"], 0);
        assert_eq!(
            s.figures["kube_controller_manager"],
            json!({"rows": 3, "converged": 1, "spurious": 2})
        );
        let report = json!({"scenarios": [
            row("etcd-restore-plain", GUARD, false, 0),
            row("etcd-restore-bump-revision", GUARD, true, 1),
        ]});
        let s = chaos(&report, &CHAOS_ROWS);
        assert_eq!(s.problems.len(), 3, "{:?}", s.problems);
    }

    #[test]
    fn real_node_sums_all_and_opt_in_rows_and_keeps_the_at_scale_row_apart() {
        let row = |name: &str, who: &str, scope: &str, failed: u64| json!({"name": name, "controller": who, "scope": scope, "failed_wrong_endpoints": failed});
        let mut at_scale = row(AT_SCALE_ROW, GUARD, "all", 12);
        at_scale["repair_s"] = json!(101.5);
        let report = json!({"host_clean": true, "rows": [
            row("failure A: old pod DELETEs replayed", GUARD, "all", 0),
            row("failure A: old pod DELETEs replayed", UPSTREAM, "all", 439),
            row("opted in", GUARD, "opt-in", 0),
            row("opted in", UPSTREAM, "opt-in", 3),
            at_scale,
        ]});
        let s = real_node(&report);
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(
            s.figures["failed_wrong_endpoints"],
            json!({GUARD: 0, UPSTREAM: 442})
        );
        assert_eq!(s.figures["at_scale"][GUARD]["repair_s"], 101.5);
        let report = json!({"host_clean": false, "rows": [row("opted in", GUARD, "opt-in", 2)]});
        let s = real_node(&report);
        assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
        assert!(!real_node(&json!({"host_clean": true})).problems.is_empty());
    }

    #[test]
    fn markdown_gives_the_repair_at_scale_or_says_there_was_none() {
        let report = json!({"commit": "abc1234", "date": "2026-11-27", "versions": [
            {"version": "v1.37.2",
             "real_node": {"failed_wrong_endpoints": {GUARD: 0, UPSTREAM: 880}, "at_scale": {
                 GUARD: {"repair_s": 85.2}, UPSTREAM: {"repair_s": null}}}},
        ]});
        let md = markdown(&report);
        assert!(
            md.contains("repaired in: endpoints-guard 85.2 s, kube-controller-manager not repaired within the row |"),
            "{md}"
        );
    }

    #[test]
    fn markdown_says_what_did_not_run_and_lists_problems() {
        let report = json!({"commit": "abc1234", "date": "2026-11-27", "versions": [
            {"version": "v1.34.4",
             "parity_endpoints": {"identical": 380, "different": 0},
             "parity_slices": {"identical": 362, "different": 0},
             "conformance": {"specs": 9, "upstream_pass": 9, "endpoints_guard_pass": 9, "opt_in_pass": 9},
             "chaos": null, "real_node": null,
             "problems": ["Endpoints parity: the report is of Kubernetes \"v1.37.2\", not v1.34.4"]},
        ]});
        let md = markdown(&report);
        assert!(
            md.contains("| v1.34.4 | 380 / 0 | 362 / 0 | 9 / 9 / 9 of 9 | not run | not run |"),
            "{md}"
        );
        assert!(
            md.contains("- v1.34.4: Endpoints parity: the report is of"),
            "{md}"
        );
    }
}
