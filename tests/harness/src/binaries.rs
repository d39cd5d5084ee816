//! Where the upstream control-plane programs live.
//!
//! `EG_CONTROLPLANE_BIN` names the folder if set; otherwise it is
//! `<workspace root>/target/controlplane/<k8s version>/bin`, the folder that
//! `tests/controlplane/build.sh` (`make controlplane`) fills, with the version
//! read from `tests/controlplane/kubernetes/go.mod`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Environment variable naming the folder that holds the programs.
pub const BIN_DIR_ENV: &str = "EG_CONTROLPLANE_BIN";

/// The programs of the local control plane.
#[derive(Debug, Clone)]
pub struct Binaries {
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
             (or `bash tests/controlplane/build.sh`), or point {BIN_DIR_ENV} at a folder holding \
             kube-apiserver, kube-controller-manager, etcd, helm, prometheus and promtool",
            path.display()
        );
    }
    Ok(path)
}

/// Environment variable naming the watch-chaos binary to use.
pub const WATCH_CHAOS_ENV: &str = "EG_WATCH_CHAOS";

/// The watch-chaos binary (crate `crates/watch-chaos`): `$EG_WATCH_CHAOS`,
/// else the one built beside the running test, in `target/<profile>/`
/// (`make test` builds it; so does `cargo build -p watch-chaos`).
pub fn watch_chaos() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(WATCH_CHAOS_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("finding the running test")?;
    // target/<profile>/deps/<test>-<hash>
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("the running test has no target/<profile> folder above it")?;
    let path = profile.join("watch-chaos");
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build -p watch-chaos` (make test does), or name it with {WATCH_CHAOS_ENV}",
            path.display()
        );
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

/// The Kubernetes version pinned in `tests/controlplane/kubernetes/go.mod`
/// (e.g. `v1.36.3`).
pub fn kubernetes_version(workspace_root: &Path) -> Result<String> {
    let go_mod = workspace_root.join("tests/controlplane/kubernetes/go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .with_context(|| format!("reading {}", go_mod.display()))?;
    parse_kubernetes_version(&text)
        .with_context(|| format!("no `k8s.io/kubernetes vX.Y.Z` line in {}", go_mod.display()))
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
    use super::{parse_kubernetes_version, program_in};

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
