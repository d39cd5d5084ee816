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
