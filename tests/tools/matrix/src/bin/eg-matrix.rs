//! `make matrix`: endpoints-guard against the kube-controller-manager of each
//! pinned Kubernetes release (`tests/controlplane/kubernetes/v1.3X/`), each
//! step the test or tool that already proves it, run with `KUBE_VERSION` set:
//!
//! - build: `make controlplane conformance-build` (reused once built);
//! - parity: `make parity`'s corpus, Endpoints and EndpointSlices, cold
//!   start and after churn (`EG_PARITY_SCALE=full cargo test --release
//!   --test e2e -- endpoints_parity:: slice_parity::`);
//! - conformance: upstream's e2e specs of the same release on fake nodes, in
//!   the three columns (`eg-conformance --nodes fake`, the release binary);
//! - chaos: the rows of etcd restores and of a pod DELETE lost in the watch
//!   cache (`EG_CHAOS=full EG_CHAOS_ONLY=... cargo test --test e2e --
//!   chaos::matrix`);
//! - real-node: the real-node short form (`hack/e2e-node.sh short`, the
//!   debug image; as root, else it skips and the matrix fails for want of
//!   its report).
//!
//! Each step's own report is copied to `<out>/<version>/<step>/`, its
//! output to `<out>/<version>/<step>.log`; `<out>/report.json` and
//! `report.md` sum them up (`eg_matrix`), keeping the releases of an
//! earlier run that this one did not run. Exits non-zero when a step fails
//! or its report shows a problem: an object different from upstream's, a
//! spec upstream passes that endpoints-guard does not, a chaos row of
//! endpoints-guard not converged or with a spurious deletion, a request
//! failed by wrong endpoints on the real node.
//!
//! Usage: `eg-matrix [--versions 1.34,1.37] [--only parity,conformance,chaos,real-node]
//! [--out DIR]` (default every pinned release, every step, `target/matrix`);
//! `eg-matrix --support-table [--out DIR]` prints the README's support table
//! from the report, running nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use eg_harness::binaries::{self, Minor, workspace_root};
use eg_matrix::{self as matrix, CHAOS_ROWS, Summary};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Parity,
    Conformance,
    Chaos,
    RealNode,
}

impl Step {
    const ALL: [Step; 4] = [Step::Parity, Step::Conformance, Step::Chaos, Step::RealNode];

    fn name(self) -> &'static str {
        match self {
            Step::Parity => "parity",
            Step::Conformance => "conformance",
            Step::Chaos => "chaos",
            Step::RealNode => "real-node",
        }
    }
}

const USAGE: &str = "eg-matrix [--versions 1.34,1.37] [--only parity,conformance,chaos,real-node] [--out DIR] | --support-table [--out DIR]";

struct Options {
    versions: Vec<Minor>,
    steps: Vec<Step>,
    out: PathBuf,
    support_table: bool,
}

fn parse_args(root: &Path) -> Result<Options> {
    let pinned = binaries::pinned_minors(root)?;
    let mut options = Options {
        versions: pinned.clone(),
        steps: Step::ALL.to_vec(),
        out: root.join("target/matrix"),
        support_table: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{arg} needs a value ({USAGE})"))
        };
        match arg.as_str() {
            "--versions" => {
                options.versions = value()?
                    .split(',')
                    .map(|v| {
                        Minor::parse(v.trim())
                            .filter(|m| pinned.contains(m))
                            .with_context(|| format!("--versions: {v:?} is not a pinned release"))
                    })
                    .collect::<Result<_>>()?
            }
            "--only" => {
                options.steps = value()?
                    .split(',')
                    .map(|s| {
                        Step::ALL
                            .into_iter()
                            .find(|step| step.name() == s.trim())
                            .with_context(|| {
                                format!(
                                    "--only: {s:?} is not parity, conformance, chaos or real-node"
                                )
                            })
                    })
                    .collect::<Result<_>>()?
            }
            "--out" => options.out = PathBuf::from(value()?),
            "--support-table" => options.support_table = true,
            other => bail!("unknown argument {other:?} (usage: {USAGE})"),
        }
    }
    Ok(options)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs `command` in the workspace root, its output appended to `log`;
/// whether it succeeded, and how long it took.
fn run_logged(root: &Path, command: &mut Command, log: &Path) -> Result<(bool, f64)> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let started = Instant::now();
    let status = command
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running {command:?}"))?;
    Ok((status.success(), started.elapsed().as_secs_f64()))
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Copies `files` from `from` into `to` (created); the copies' paths.
fn copy_reports(from: &Path, files: &[&str], to: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(to)?;
    let mut copied = Vec::new();
    for file in files {
        let source = from.join(file);
        if source.is_file() {
            std::fs::copy(&source, to.join(file))
                .with_context(|| format!("copying {}", source.display()))?;
            copied.push(to.join(file));
        }
    }
    Ok(copied)
}

/// Removes the reports a step writes where every release's run writes
/// them, so that a run that writes none is not judged by another's.
fn remove_stale(dir: &Path, files: &[&str]) -> Result<()> {
    for file in files {
        let path = dir.join(file);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// One release's run: its figures by step and its problems.
struct VersionRun {
    minor: Minor,
    version: String,
    dir: PathBuf,
    figures: serde_json::Map<String, Value>,
    steps: Vec<Value>,
    problems: Vec<String>,
}

impl VersionRun {
    /// Runs one step's command with `KUBE_VERSION` set; false (and a
    /// problem) when it failed.
    fn command(&mut self, root: &Path, step: &str, mut command: Command) -> Result<bool> {
        command.env(binaries::KUBE_VERSION_ENV, self.minor.to_string());
        let log = self.dir.join(format!("{step}.log"));
        eprintln!("matrix: {}: {step} (log {})", self.version, log.display());
        let (ok, seconds) = run_logged(root, &mut command, &log)?;
        eprintln!(
            "matrix: {}: {step}: {} in {seconds:.0} s",
            self.version,
            if ok { "done" } else { "FAILED" }
        );
        self.steps
            .push(json!({"step": step, "ok": ok, "seconds": seconds.round()}));
        if !ok {
            self.problems
                .push(format!("{step}: the command failed (see {step}.log)"));
        }
        Ok(ok)
    }

    fn take(&mut self, field: &str, summary: Summary) {
        self.figures.insert(field.into(), summary.figures);
        self.problems.extend(summary.problems);
    }

    /// Reads a copied report into `field`, or says it is missing.
    fn summarise(&mut self, field: &str, report: &Path, read: impl Fn(&Value) -> Summary) {
        match read_json(report) {
            Ok(value) => self.take(field, read(&value)),
            Err(err) => {
                self.figures.insert(field.into(), Value::Null);
                self.problems.push(format!("{field}: no report: {err:#}"));
            }
        }
    }

    fn parity(&mut self, root: &Path) -> Result<()> {
        let written = root.join("target/parity");
        let files = ["report.json", "slices-report.json"];
        remove_stale(&written, &files)?;
        let mut command = Command::new(cargo());
        command
            .args(["test", "--release", "--test", "e2e", "--", "--nocapture"])
            .args(["endpoints_parity::", "slice_parity::"])
            .env("EG_PARITY_SCALE", "full");
        self.command(root, "parity", command)?;
        let to = self.dir.join("parity");
        copy_reports(&written, &files, &to)?;
        let version = self.version.clone();
        self.summarise("parity_endpoints", &to.join(files[0]), |r| {
            matrix::parity(r, "Endpoints parity", &version)
        });
        self.summarise("parity_slices", &to.join(files[1]), |r| {
            matrix::parity(r, "EndpointSlice parity", &version)
        });
        Ok(())
    }

    fn conformance(&mut self, root: &Path) -> Result<()> {
        let to = self.dir.join("conformance");
        let mut command = Command::new(cargo());
        command
            .args(["run", "-p", "eg-node", "--bin", "eg-conformance", "--"])
            .args(["--nodes", "fake", "--out"])
            .arg(&to)
            .env("EG_BINARY", root.join("target/release/endpoints-guard"));
        self.command(root, "conformance", command)?;
        let version = self.version.clone();
        self.summarise("conformance", &to.join("report.json"), |r| {
            matrix::conformance(r, &version)
        });
        Ok(())
    }

    fn chaos(&mut self, root: &Path) -> Result<()> {
        let written = root.join("target/chaos");
        let files = ["report.json", "report.md"];
        remove_stale(&written, &files)?;
        let mut command = Command::new(cargo());
        command
            .args(["test", "--test", "e2e", "--", "--nocapture", "--exact"])
            .arg("chaos::matrix")
            .env("EG_CHAOS", "full")
            .env("EG_CHAOS_ONLY", CHAOS_ROWS.join(","));
        self.command(root, "chaos", command)?;
        let to = self.dir.join("chaos");
        copy_reports(&written, &files, &to)?;
        self.summarise("chaos", &to.join("report.json"), |r| {
            matrix::chaos(r, &CHAOS_ROWS)
        });
        Ok(())
    }

    fn real_node(&mut self, root: &Path) -> Result<()> {
        let written = root.join("target/e2e-node/short");
        let files = ["report.json", "report.md"];
        remove_stale(&written, &files)?;
        let mut command = Command::new("bash");
        command
            .args(["hack/e2e-node.sh", "short"])
            .env("EG_IMAGE_PROFILE", "debug")
            .env("CARGO", cargo());
        self.command(root, "real-node", command)?;
        let to = self.dir.join("real-node");
        copy_reports(&written, &files, &to)?;
        self.summarise("real_node", &to.join("report.json"), matrix::real_node);
        Ok(())
    }

    fn into_json(self, date: &str, commit: &str) -> Value {
        let mut out = json!({
            "version": self.version,
            "date": date,
            "commit": commit,
            "parity_endpoints": null,
            "parity_slices": null,
            "conformance": null,
            "chaos": null,
            "real_node": null,
        });
        for (field, value) in self.figures {
            out[field] = value;
        }
        out["steps"] = json!(self.steps);
        out["problems"] = json!(self.problems);
        out
    }
}

/// Builds what the steps share across releases: the release binary
/// eg-conformance runs, the debug watch-chaos the chaos rows put in front of
/// the controllers.
fn prepare(root: &Path, steps: &[Step], out: &Path) -> Result<()> {
    let log = out.join("prepare.log");
    let mut builds: Vec<Vec<&str>> = Vec::new();
    if steps.contains(&Step::Conformance) {
        builds.push(vec![
            "build",
            "--release",
            "-p",
            "endpoints-guard",
            "--bin",
            "endpoints-guard",
        ]);
    }
    if steps.contains(&Step::Chaos) {
        builds.push(vec!["build", "-p", "watch-chaos", "--bins"]);
    }
    for args in builds {
        let (ok, _) = run_logged(root, Command::new(cargo()).args(&args), &log)?;
        if !ok {
            bail!("cargo {} failed (see {})", args.join(" "), log.display());
        }
    }
    Ok(())
}

fn version_key(version: &Value) -> Option<Minor> {
    version["version"].as_str().and_then(Minor::parse)
}

/// What endpoints-guard does differently on a release, in one line
/// (docs/versions.md has each with where upstream's code was read).
fn what_changes(minor: Minor) -> &'static str {
    match minor {
        Minor(1, 34) => {
            "MD5 order of ports and subsets; `PreferSameTrafficDistribution` may be off (`--feature-gates`)"
        }
        Minor(1, 35) => "FNV-1a 128 order; that gate locked on",
        Minor(1, 36) => "as 1.35 (the bugs 1.36 fixed stay fixed on every release)",
        Minor(1, 37) => "as 1.36",
        _ => "see docs/versions.md",
    }
}

/// README's support table: one line per pinned release, with what
/// `report.json` holds for it and "not yet measured" for the rest.
fn support_table(root: &Path, report: &Value) -> Result<String> {
    let mut out = String::from(
        "| Kubernetes | what changes | proven against its own kube-controller-manager | measured |\n| --- | --- | --- | --- |\n",
    );
    let measured = report["versions"].as_array().cloned().unwrap_or_default();
    for minor in binaries::pinned_minors(root)? {
        let version = binaries::pinned_version(root, minor)?;
        let found = measured.iter().find(|v| version_key(v) == Some(minor));
        let (proven, when) = match found {
            None => ("not yet measured".to_string(), "–".to_string()),
            Some(v) => (
                proven_text(v),
                format!(
                    "{}, commit {}",
                    v["date"].as_str().unwrap_or("?"),
                    v["commit"].as_str().unwrap_or("?")
                ),
            ),
        };
        out.push_str(&format!(
            "| {version} | {} | {proven} | {when} |\n",
            what_changes(minor)
        ));
    }
    Ok(out)
}

fn proven_text(v: &Value) -> String {
    let mut parts = Vec::new();
    let mut missing = Vec::new();
    let parity = |p: &Value| {
        let compared = p["identical"].as_u64().unwrap_or_default()
            + p["different"].as_u64().unwrap_or_default();
        format!("{} of {compared} identical", p["identical"])
    };
    match (&v["parity_endpoints"], &v["parity_slices"]) {
        (Value::Null, _) | (_, Value::Null) => missing.push("parity"),
        (e, s) => parts.push(format!(
            "parity: Endpoints {}, EndpointSlices {}",
            parity(e),
            parity(s)
        )),
    }
    match &v["conformance"] {
        Value::Null => missing.push("conformance"),
        c => parts.push(format!(
            "conformance on fake nodes: endpoints-guard {} of {} ({} in opt-in scope), kube-controller-manager {}",
            c["endpoints_guard_pass"], c["specs"], c["opt_in_pass"], c["upstream_pass"]
        )),
    }
    match &v["chaos"] {
        Value::Null => missing.push("chaos"),
        c => parts.push(format!(
            "restores and watch-cache ghost: {} of {} rows converged, {} spurious deletions",
            c["converged"], c["rows"], c["spurious"]
        )),
    }
    match &v["real_node"] {
        Value::Null => missing.push("real node"),
        r => parts.push(format!(
            "real node: {} requests failed by wrong endpoints (kube-controller-manager {})",
            r["failed_wrong_endpoints"][matrix::GUARD],
            r["failed_wrong_endpoints"][matrix::UPSTREAM]
        )),
    }
    let problems = v["problems"].as_array().map(Vec::len).unwrap_or_default();
    if problems > 0 {
        parts.push(format!(
            "**{problems} problem(s)**, target/matrix/report.md"
        ));
    }
    if !missing.is_empty() {
        parts.push(format!("{}: not yet measured", missing.join(", ")));
    }
    parts.join("; ")
}

fn main() -> Result<()> {
    let root = workspace_root()?;
    let options = parse_args(&root)?;
    std::fs::create_dir_all(&options.out)?;
    let report_path = options.out.join("report.json");
    let earlier = read_json(&report_path).ok();
    if options.support_table {
        let report = earlier
            .with_context(|| format!("no {}: run `make matrix` first", report_path.display()))?;
        print!("{}", support_table(&root, &report)?);
        return Ok(());
    }
    let started = Instant::now();
    let commit = eg_workload::command_output("git", &["rev-parse", "--short", "HEAD"], &root);
    let date = eg_workload::command_output("date", &["-u", "+%Y-%m-%d"], &root);
    prepare(&root, &options.steps, &options.out)?;

    let mut runs = Vec::new();
    for minor in &options.versions {
        let version = binaries::pinned_version(&root, *minor)?;
        let dir = options.out.join(&version);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)?;
        let mut run = VersionRun {
            minor: *minor,
            version,
            dir,
            figures: serde_json::Map::new(),
            steps: Vec::new(),
            problems: Vec::new(),
        };
        let mut build = Command::new("make");
        build.args(["controlplane", "conformance-build"]);
        if run.command(&root, "build", build)? {
            for step in &options.steps {
                match step {
                    Step::Parity => run.parity(&root)?,
                    Step::Conformance => run.conformance(&root)?,
                    Step::Chaos => run.chaos(&root)?,
                    Step::RealNode => run.real_node(&root)?,
                }
            }
        }
        runs.push(run.into_json(&date, &commit));
    }

    // The releases of an earlier run that this one did not run stay.
    let mut versions: Vec<Value> = earlier
        .as_ref()
        .and_then(|r| r["versions"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !runs.iter().any(|r| version_key(r) == version_key(v)))
        .collect();
    let problems: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            let version = r["version"].as_str().unwrap_or("?").to_string();
            r["problems"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |p| format!("{version}: {}", p.as_str().unwrap_or_default()))
        })
        .collect();
    versions.extend(runs);
    versions.sort_by_key(version_key);
    let report = json!({
        "date": date,
        "commit": commit,
        "seconds": started.elapsed().as_secs_f64().round(),
        "steps": options.steps.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "versions": versions,
    });
    std::fs::write(&report_path, serde_json::to_string_pretty(&report)?)?;
    let md = matrix::markdown(&report);
    std::fs::write(options.out.join("report.md"), &md)?;
    println!("{md}");
    println!("report: {}", options.out.join("report.md").display());
    if !problems.is_empty() {
        eprintln!(
            "matrix: {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        );
        std::process::exit(1);
    }
    Ok(())
}
