//! The binary as its users meet it: its flags, and a clear error for a fault
//! it does not know or an upstream kubeconfig it cannot use.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_watch-chaos");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|err| panic!("watch-chaos runs: {err}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_lists_the_flags() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--upstream-kubeconfig", "--listen", "--control", "--fault"] {
        assert!(text.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn an_unknown_fault_names_the_known_ones() {
    let out = run(&["--fault", "services:drop-everything"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("unknown fault") && err.contains("drop-deletes") && err.contains("bare-404"),
        "{err}"
    );
}

#[test]
fn a_missing_upstream_kubeconfig_is_one_clear_error() {
    let out = run(&["--upstream-kubeconfig", "/nonexistent/kubeconfig"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}
