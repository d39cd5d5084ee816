//! What endpoints-guard's tests, `make bench`, `make soak`, `make chaos`,
//! `make demo` and `make conformance` run on the local control plane of
//! [`eg_harness`]: generated workloads, the watch-chaos proxy and the
//! independent watches that judge a run, resource sampling, reports, a
//! Prometheus scraping the chart's rules, and a real one-node cluster; and
//! the chart's generated documents (`make chart-readme`); the verdict of
//! `make matrix` over the reports of every Kubernetes release.

pub mod bench;
pub mod chaos;
pub mod chart_docs;
pub mod conformance;
pub mod matrix;
pub mod metrics;
pub mod node;
pub mod prometheus;
pub mod slice_workload;
pub mod soak;
pub mod workload;

/// What `program args` prints in `dir`, trimmed, or "unknown" when it
/// cannot run or fails: the commit and date a report is stamped with.
pub fn command_output(program: &str, args: &[&str], dir: &std::path::Path) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
