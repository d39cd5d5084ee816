//! `make soak`: hours-long (or, in `make test`, three-minute) runs of
//! endpoints-guard under a workload that never stops and a rotating fault
//! schedule, judged by an oracle independent of the controller. The test
//! itself is tests/e2e/soak.rs; these are its parts: the workload, the oracle,
//! resource sampling with the flat-slope test, and the report (JSON,
//! markdown, SVG). See docs/soak.md.

pub mod guard;
pub mod oracle;
pub mod report;
pub mod stats;
pub mod workload;
