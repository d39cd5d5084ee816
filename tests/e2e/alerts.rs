//! The chart's alerts under Prometheus's own tools, on the rules `helm
//! template` renders with the default values (so a template change cannot
//! silently break them): `promtool check rules`, and the promtool unit tests in
//! `tests/alerts/`: each alert fires on the series it is for (a counter alert
//! also on a series that appears at its first increment), stays silent on
//! quiet series, and resolves. The unit tests are shown to be able to fail:
//! with an alert that never fires, or a counter alert cut back to `increase()`
//! alone, promtool must report failures.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use eg_chart::prometheus::{alert_names, render_chart_monitoring};
use eg_harness::binaries::{program, workspace_root};
use serde_yaml::Value;

/// The rule file the test files load (`rule_files`), beside them.
const RULES_FILE: &str = "endpoints-guard-rules.yaml";

fn rendered_rules() -> Result<String> {
    Ok(render_chart_monitoring(&[])?.rules)
}

fn test_files() -> Result<Vec<PathBuf>> {
    let dir = workspace_root()?.join("tests/alerts");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in {}", dir.display());
    Ok(files)
}

/// Runs `promtool test rules` on the test files (those that test alert
/// `only`, if given), copied into a fresh folder beside `rules`: whether it
/// passed, and what it printed.
fn promtool_test(rules: &str, only: Option<&str>) -> Result<(bool, String)> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join(RULES_FILE), rules)?;
    let mut copies = Vec::new();
    for file in test_files()? {
        if let Some(name) = only
            && !std::fs::read_to_string(&file)?.contains(&format!("alertname: {name}\n"))
        {
            continue;
        }
        let copy = dir.path().join(file.file_name().context("file name")?);
        std::fs::copy(&file, &copy)?;
        copies.push(copy);
    }
    promtool(dir.path(), "test", &copies)
}

fn promtool(dir: &Path, verb: &str, files: &[PathBuf]) -> Result<(bool, String)> {
    let out = Command::new(program("promtool")?)
        .args([verb, "rules"])
        .args(files)
        .current_dir(dir)
        .output()
        .context("running promtool")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// `rules` with the expression of alert `name` changed by `change`.
fn with_expr(rules: &str, name: &str, change: impl Fn(&str) -> String) -> Result<String> {
    let mut parsed: Value = serde_yaml::from_str(rules)?;
    let mut found = false;
    for group in parsed["groups"].as_sequence_mut().into_iter().flatten() {
        for rule in group["rules"].as_sequence_mut().into_iter().flatten() {
            if rule["alert"].as_str() == Some(name) {
                let expr = rule["expr"].as_str().context("expr")?.to_string();
                rule["expr"] = Value::String(change(&expr));
                found = true;
            }
        }
    }
    assert!(found, "no alert {name}");
    Ok(serde_yaml::to_string(&parsed)?)
}

#[test]
fn rendered_rules_pass_promtool_check() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join(RULES_FILE);
    std::fs::write(&file, rendered_rules()?)?;
    let (ok, text) = promtool(dir.path(), "check", &[file])?;
    assert!(ok, "promtool check rules:\n{text}");
    eprintln!("{text}");
    Ok(())
}

/// Every alert of the chart has unit tests that see it fire and see it
/// silent, and no test names an alert the chart does not have (promtool
/// would pass such a test vacuously).
#[test]
fn every_alert_has_unit_tests_that_pass() -> Result<()> {
    let rules = rendered_rules()?;
    let alerts: BTreeSet<String> = alert_names(&rules)?.into_iter().collect();
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for file in test_files()? {
        let parsed: Value = serde_yaml::from_str(&std::fs::read_to_string(&file)?)
            .with_context(|| format!("parsing {}", file.display()))?;
        for case in parsed["tests"].as_sequence().into_iter().flatten() {
            for check in case["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = check["alertname"]
                    .as_str()
                    .context("alertname")?
                    .to_string();
                let expected = check["exp_alerts"].as_sequence().map_or(0, Vec::len);
                if expected > 0 {
                    &mut fires
                } else {
                    &mut silent
                }
                .insert(name);
            }
        }
    }
    assert_eq!(fires, alerts, "alerts seen firing by the unit tests");
    assert_eq!(silent, alerts, "alerts seen silent by the unit tests");
    let (ok, text) = promtool_test(&rules, None)?;
    assert!(ok, "promtool test rules:\n{text}");
    eprintln!("{text}");
    Ok(())
}

#[test]
fn the_unit_tests_catch_an_alert_that_never_fires() -> Result<()> {
    let rules = rendered_rules()?;
    for name in alert_names(&rules)? {
        let broken = with_expr(&rules, &name, |_| "vector(1) < 0".to_string())?;
        let (ok, text) = promtool_test(&broken, Some(&name))?;
        assert!(!ok, "{name} never fires, yet its tests pass:\n{text}");
        assert!(
            text.contains(&format!("alertname: {name},")),
            "{name}: {text}"
        );
    }
    Ok(())
}

/// The issue this guards against: a counter series that first appears
/// already at 1 has no `increase()`, so an alert on `increase() > 0` alone
/// stays silent. Every alert on `increase()` adds a second part for it; cut
/// back to the first, its "appears at its first increment" tests fail.
#[test]
fn the_unit_tests_catch_a_counter_alert_blind_to_a_series_first_increment() -> Result<()> {
    let rules = rendered_rules()?;
    let parsed: Value = serde_yaml::from_str(&rules)?;
    let counter_alerts: Vec<(String, String)> = parsed["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .filter(|(_, expr)| expr.contains("increase("))
        .collect();
    assert!(!counter_alerts.is_empty(), "no alert on increase()");
    for (name, expr) in counter_alerts {
        let (first, second) = expr
            .split_once("\nor\n")
            .with_context(|| format!("{name} has no part for a series' first increment: {expr}"))?;
        assert!(
            first.contains("increase(") && !second.contains("increase("),
            "{name}: {expr}"
        );
        let cut = with_expr(&rules, &name, |_| first.to_string())?;
        let (ok, text) = promtool_test(&cut, Some(&name))?;
        assert!(
            !ok && text.contains("appears at its first increment"),
            "{name} with increase() alone passes its first-increment tests:\n{text}"
        );
    }
    Ok(())
}
