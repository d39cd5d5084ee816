//! Where the upstream control-plane programs live, for the Kubernetes release
//! `KUBE_VERSION` picks.
//!
//! `KUBE_VERSION` is a minor (`1.34`, `v1.34`) pinned in
//! `tests/controlplane/kubernetes/v<minor>/go.mod`, or that minor's exact
//! pinned version (`1.34.4`); unset, the newest minor pinned there (the same
//! rule as `tests/controlplane/release.sh`). `EG_CONTROLPLANE_BIN` names the
//! folder if set; otherwise it is
//! `<workspace root>/target/controlplane/<k8s version>/bin`, the folder that
//! `tests/controlplane/build.sh` (`make controlplane`) fills.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Environment variable naming the folder that holds the programs.
pub const BIN_DIR_ENV: &str = "EG_CONTROLPLANE_BIN";

/// Environment variable picking the Kubernetes release (`1.34`, ...).
pub const KUBE_VERSION_ENV: &str = "KUBE_VERSION";

/// Where each release's pins are, under the workspace root.
const RELEASE_PINS: &str = "tests/controlplane/kubernetes";

/// The programs of the local control plane.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The Kubernetes release they are (e.g. `v1.34.4`): the one
    /// `KUBE_VERSION` picks.
    pub version: String,
    /// The folder they were found in.
    pub dir: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
}

impl Binaries {
    /// Finds kube-apiserver, kube-controller-manager and etcd, failing with a
    /// message that says how to build them when one is missing.
    pub fn locate() -> Result<Self> {
        let dir = bin_dir()?;
        Ok(Self {
            version: kubernetes_version(&workspace_root()?)?,
            kube_apiserver: program_in(&dir, "kube-apiserver")?,
            kube_controller_manager: program_in(&dir, "kube-controller-manager")?,
            etcd: program_in(&dir, "etcd")?,
            dir,
        })
    }
}

/// The path of one program (e.g. `helm`) in the control-plane folder, checked
/// to exist.
pub fn program(name: &str) -> Result<PathBuf> {
    program_in(&bin_dir()?, name)
}

fn program_in(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{name} not found at {}: build the control-plane programs with `make controlplane` \
             (or `bash tests/controlplane/build.sh`{}), or point {BIN_DIR_ENV} at a folder holding \
             kube-apiserver, kube-controller-manager, etcd, helm, prometheus and promtool",
            path.display(),
            std::env::var(KUBE_VERSION_ENV)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| format!(", with {KUBE_VERSION_ENV}={v}"))
                .unwrap_or_default()
        );
    }
    Ok(path)
}

/// Environment variable naming the watch-chaos binary to use.
pub const WATCH_CHAOS_ENV: &str = "EG_WATCH_CHAOS";

/// The watch-chaos binary (crate `crates/watch-chaos`): `$EG_WATCH_CHAOS`,
/// else the one beside the running test, in `target/<profile>/`, built as
/// [`endpoints_guard`] is.
pub fn watch_chaos() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(WATCH_CHAOS_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    built_once(&BUILT, "watch-chaos")
}

/// The endpoints-guard binary the end-to-end tests run:
/// `target/<profile>/endpoints-guard` beside the running test. The tests are a
/// package of their own (`tests/e2e`), so cargo does not build the binary for
/// them: the first call in a test process runs `cargo build -p endpoints-guard
/// --bin endpoints-guard` in the test's profile, so the tests never run a
/// binary older than the sources (a no-op when it is up to date).
pub fn endpoints_guard() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    built_once(&BUILT, "endpoints-guard")
}

/// The binary `name` of the package `name`, built by the first call in this
/// test process (`built` remembers the outcome).
fn built_once(
    built: &OnceLock<std::result::Result<PathBuf, String>>,
    name: &str,
) -> Result<PathBuf> {
    built
        .get_or_init(|| build_in_test_profile(name).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// `target/<profile>/`, where cargo put the running test
/// (`target/<profile>/deps/<test>-<hash>`) and the binaries of its build.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the running test")?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("the running test has no target/<profile> folder above it")
}

/// Runs `cargo build -p <name> --bin <name>` in the running test's profile
/// and returns the binary's path.
fn build_in_test_profile(name: &str) -> Result<PathBuf> {
    let profile_dir = profile_dir()?;
    let profile = profile_dir
        .file_name()
        .and_then(|name| name.to_str())
        .context("the running test's profile folder has no name")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(&cargo);
    // What cargo sets for the running test's package: some build scripts
    // (ring's) ask to run again when it changes, so the build would redo them
    // each time, and the next `cargo test` after it.
    for (var, _) in std::env::vars_os() {
        let var = var.to_string_lossy();
        let per_package = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|prefix| var.starts_with(prefix))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&var.as_ref());
        if per_package {
            build.env_remove(var.as_ref());
        }
    }
    build
        .current_dir(workspace_root()?)
        .args(["build", "-p", name, "--bin", name]);
    match profile {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        other => {
            build.args(["--profile", other]);
        }
    }
    let status = build
        .status()
        .with_context(|| format!("running {} to build {name}", cargo.to_string_lossy()))?;
    if !status.success() {
        bail!("`cargo build -p {name} --bin {name}` ({profile}) failed: {status}");
    }
    let path = profile_dir.join(name);
    if !path.is_file() {
        bail!("{} is missing after the build", path.display());
    }
    Ok(path)
}

/// The folder holding the control-plane programs (not checked to exist).
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let root = workspace_root()?;
    let version = kubernetes_version(&root)?;
    Ok(root
        .join("target")
        .join("controlplane")
        .join(version)
        .join("bin"))
}

/// The workspace root: the nearest folder, from the running test's
/// `CARGO_MANIFEST_DIR` or else this crate's, that holds `tests/controlplane`.
pub fn workspace_root() -> Result<PathBuf> {
    let starts = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::iter::once(PathBuf::from(env!("CARGO_MANIFEST_DIR"))));
    for start in starts {
        if let Some(root) = start
            .ancestors()
            .find(|dir| dir.join("tests").join("controlplane").is_dir())
        {
            return Ok(root.to_path_buf());
        }
    }
    bail!(
        "no folder holding tests/controlplane above CARGO_MANIFEST_DIR or {}; set {BIN_DIR_ENV}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The Kubernetes version of the release `KUBE_VERSION` picks (e.g.
/// `v1.36.3`), read from its pins.
pub fn kubernetes_version(workspace_root: &Path) -> Result<String> {
    let wanted = std::env::var(KUBE_VERSION_ENV).ok();
    let minor = pick_release(&pinned_minors(workspace_root)?, wanted.as_deref())?;
    let version = pinned_version(workspace_root, minor)?;
    // An exact version asked for must be the one pinned: another would be
    // reported as what ran while it did not.
    if let Some(exact) = wanted.as_deref().map(|w| w.trim_start_matches('v'))
        && exact.matches('.').count() == 2
        && version.trim_start_matches('v') != exact
    {
        bail!(
            "{KUBE_VERSION_ENV}={exact}: {} is pinned at {version}",
            minor.dir_name()
        );
    }
    Ok(version)
}

/// The Kubernetes version pinned for `minor` (e.g. `v1.34.4`), read from
/// its pins.
pub fn pinned_version(workspace_root: &Path, minor: Minor) -> Result<String> {
    let go_mod = workspace_root
        .join(RELEASE_PINS)
        .join(minor.dir_name())
        .join("go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .with_context(|| format!("reading {}", go_mod.display()))?;
    parse_kubernetes_version(&text)
        .with_context(|| format!("no `k8s.io/kubernetes vX.Y.Z` line in {}", go_mod.display()))
}

/// `<workspace root>/<under>/<k8s version>`: the folder a tool keeps for the
/// release `KUBE_VERSION` picks (e.g. `target/conformance/v1.37.2`).
pub fn release_dir(workspace_root: &Path, under: &str) -> Result<PathBuf> {
    Ok(workspace_root
        .join(under)
        .join(kubernetes_version(workspace_root)?))
}

/// A Kubernetes minor release, e.g. 1.34.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Minor(pub u32, pub u32);

impl Minor {
    /// `1.34`, `v1.34`, or a patch version of it (`1.34.4`).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.strip_prefix('v').unwrap_or(text).split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        match (parts.next(), parts.next()) {
            (None, _) => Some(Self(major, minor)),
            (Some(patch), None) if patch.parse::<u32>().is_ok() => Some(Self(major, minor)),
            _ => None,
        }
    }

    /// The folder of its pins, `v1.34`.
    pub fn dir_name(self) -> String {
        format!("v{}.{}", self.0, self.1)
    }
}

impl std::fmt::Display for Minor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// The minors with pins under `tests/controlplane/kubernetes/`, oldest first.
pub fn pinned_minors(workspace_root: &Path) -> Result<Vec<Minor>> {
    let dir = workspace_root.join(RELEASE_PINS);
    let mut minors = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name();
        if let Some(minor) = name
            .to_str()
            .filter(|n| n.starts_with('v'))
            .and_then(Minor::parse)
            && entry.path().join("go.mod").is_file()
        {
            minors.push(minor);
        }
    }
    minors.sort();
    Ok(minors)
}

/// The release `wanted` (`KUBE_VERSION`) names among `pinned`; the newest
/// when it is unset or empty.
fn pick_release(pinned: &[Minor], wanted: Option<&str>) -> Result<Minor> {
    let supported = || {
        pinned
            .iter()
            .map(Minor::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match wanted.filter(|w| !w.is_empty()) {
        None => pinned
            .last()
            .copied()
            .context("no Kubernetes release pinned under tests/controlplane/kubernetes/"),
        Some(text) => Minor::parse(text)
            .filter(|minor| pinned.contains(minor))
            .with_context(|| {
                format!(
                    "{KUBE_VERSION_ENV}={text}: not a release pinned here (supported: {})",
                    supported()
                )
            }),
    }
}

fn parse_kubernetes_version(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        // Inside a require block the line is `k8s.io/kubernetes vX`; outside,
        // `require k8s.io/kubernetes vX`.
        let first = words.next()?;
        let module = if first == "require" {
            words.next()?
        } else {
            first
        };
        let version = words.next()?;
        (module == "k8s.io/kubernetes" && version.starts_with('v')).then(|| version.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::{Minor, parse_kubernetes_version, pick_release, program_in};

    #[test]
    fn reads_the_version_from_a_require_block_and_skips_replace_lines() {
        let go_mod = "module x\n\nreplace (\n\tk8s.io/api => k8s.io/api v0.36.3\n)\n\n\
                      require (\n\tk8s.io/kubernetes v1.36.3 // indirect\n)\n";
        assert_eq!(parse_kubernetes_version(go_mod).as_deref(), Some("v1.36.3"));
    }

    #[test]
    fn reads_a_single_line_require() {
        let go_mod = "module x\nrequire k8s.io/kubernetes v1.2.3\n";
        assert_eq!(parse_kubernetes_version(go_mod).as_deref(), Some("v1.2.3"));
        assert_eq!(parse_kubernetes_version("module x\n"), None);
    }

    #[test]
    fn kube_version_picks_a_pinned_minor_and_defaults_to_the_newest() {
        let pinned = [Minor(1, 34), Minor(1, 35), Minor(1, 36), Minor(1, 37)];
        let pick = |wanted: Option<&str>| pick_release(&pinned, wanted).map_err(|e| e.to_string());
        assert_eq!(pick(None), Ok(Minor(1, 37)));
        assert_eq!(pick(Some("")), Ok(Minor(1, 37)));
        assert_eq!(pick(Some("1.34")), Ok(Minor(1, 34)));
        assert_eq!(pick(Some("v1.35")), Ok(Minor(1, 35)));
        assert_eq!(pick(Some("1.36.3")), Ok(Minor(1, 36)));
        for bad in ["1.33", "1.38", "latest", "1", "1.34.x", "1.34.4.1"] {
            let err = pick(Some(bad)).unwrap_err();
            assert!(
                err.contains("supported: 1.34, 1.35, 1.36, 1.37"),
                "{bad}: {err}"
            );
        }
        assert_eq!(Minor(1, 34).dir_name(), "v1.34");
    }

    #[test]
    fn every_pinned_release_names_its_version() {
        let root = super::workspace_root().unwrap();
        let minors = super::pinned_minors(&root).unwrap();
        assert!(minors.len() >= 2, "{minors:?}");
        for minor in minors {
            let text = std::fs::read_to_string(
                root.join(super::RELEASE_PINS)
                    .join(minor.dir_name())
                    .join("go.mod"),
            )
            .unwrap();
            let version = parse_kubernetes_version(&text).unwrap();
            assert!(
                version.starts_with(&format!("{}.", minor.dir_name())),
                "{minor}: {version}"
            );
        }
    }

    #[test]
    fn a_missing_program_says_how_to_build_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = program_in(dir.path(), "etcd").unwrap_err().to_string();
        assert!(err.contains("make controlplane"), "{err}");
        std::fs::write(dir.path().join("etcd"), "").unwrap();
        assert_eq!(
            program_in(dir.path(), "etcd").unwrap(),
            dir.path().join("etcd")
        );
    }
}
