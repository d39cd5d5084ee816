//! Running helm and reading what it renders.

use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};
use serde_yaml::Value;

use super::{CHART, NAMESPACE, RELEASE};

/// The workspace root, where the chart and the scripts are.
pub fn root() -> PathBuf {
    match eg_harness::binaries::workspace_root() {
        Ok(root) => root,
        Err(err) => panic!("{err:#}"),
    }
}

pub fn helm() -> PathBuf {
    match eg_harness::binaries::program("helm") {
        Ok(path) => path,
        Err(err) => panic!("{err:#}"),
    }
}

pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .current_dir(root())
        .env("HELM", helm())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

pub fn stdout(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8(run(cmd)?.stdout)?)
}

pub fn template(sets: &[&str]) -> Result<String> {
    template_with(&[], sets)
}

/// `helm template` with more arguments (e.g. `--skip-tests`, `--show-only`).
pub fn template_with(args: &[&str], sets: &[&str]) -> Result<String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE, CHART, "--namespace", NAMESPACE]);
    cmd.args(args);
    for set in sets {
        cmd.args(["--set", set]);
    }
    stdout(&mut cmd)
}

/// Every rendered object of `kind`.
pub fn find_all<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde::Deserialize::deserialize(doc)?;
        if !matches!(value, Value::Null) {
            docs.push(value);
        }
    }
    Ok(docs)
}

pub fn find<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .with_context(|| format!("no {kind} rendered"))
}

pub fn container<'a>(deployment: &'a Value, name: &str) -> Result<&'a Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|c| c["name"].as_str() == Some(name))
        .with_context(|| format!("no container {name}"))
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}
