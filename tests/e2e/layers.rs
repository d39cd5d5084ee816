//! The library's top-level modules form layers, and no module's code imports
//! from a layer above its own (docs/architecture.md, "Layers"). Shared types
//! sit below every layer that uses them; the flags (`config`) sit above the
//! parts they configure and below the wiring that reads them.
//!
//! Read from the sources: every `crate::<module>` path outside comments, in
//! every file of a module's folder or file, tests included.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use eg_harness::binaries::workspace_root;

/// Bottom first: a module may use those on its own line or above it.
const LAYERS: &[&[&str]] = &[
    &["settings", "error", "shutdown", "ratelimit", "locks"],
    &["desired"],
    &["wire", "metrics"],
    &["leader", "server"],
    &["reconcile"],
    &["config"],
    &["startup"],
    &["controller", "commands", "profiling"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|line| line.contains(&module))
}

/// The `crate::<name>` paths in `text`, comments dropped.
fn crate_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
            rest = after;
        }
    }
    found
}

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    if path.is_dir() {
        for entry in
            std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?
        {
            rust_files(&entry?.path(), out)?;
        }
    } else if path.extension().is_some_and(|ext| ext == "rs") {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// Every top-level module of src/ (but the binary and the crate root).
fn modules(src: &Path) -> Result<BTreeMap<String, Vec<std::path::PathBuf>>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if stem == "main" || stem == "lib" {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&path, &mut files)?;
        if !files.is_empty() {
            modules.insert(stem.to_string(), files);
        }
    }
    Ok(modules)
}

#[test]
fn no_module_imports_from_a_layer_above_it() -> Result<()> {
    let root = workspace_root()?;
    let src = root.join("src");
    let modules = modules(&src)?;
    let mut wrong = Vec::new();
    for (module, files) in &modules {
        let Some(own) = layer_of(module) else {
            bail!("src/{module} is in no layer: add it to LAYERS and docs/architecture.md");
        };
        for file in files {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            for used in crate_paths(&text) {
                if used == *module {
                    continue;
                }
                match layer_of(&used) {
                    Some(layer) if layer <= own => {}
                    Some(_) => wrong.push(format!(
                        "{} uses crate::{used}, a layer above {module}",
                        file.strip_prefix(&root).unwrap_or(file).display()
                    )),
                    None => bail!("{} uses crate::{used}, in no layer", file.display()),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports from a layer above:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

/// The check sees a path in code and ignores one in a comment.
#[test]
fn paths_are_read_from_code_only() {
    assert_eq!(
        crate_paths("use crate::desired::PodInfo; // crate::config"),
        vec!["desired".to_string()]
    );
    assert_eq!(
        crate_paths("/// see [`x`](crate::wire::PodWire)"),
        Vec::<String>::new()
    );
}
