//! The chart as the tests and `make demo` read it: its generated documents
//! (`make chart-readme`) and its monitoring objects under a real Prometheus.

pub mod chart_docs;
pub mod prometheus;
