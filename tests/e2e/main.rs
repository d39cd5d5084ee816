//! endpoints-guard's integration tests, one test binary (`cargo test --test
//! e2e`) with a module per area, so a change links one binary instead of one
//! per file. Most modules start their own local control plane
//! ([`eg_harness`]); run one area with its module path as the filter, e.g.
//! `cargo test --test e2e chaos::` (docs/testing.md lists them).
//!
//! All tests share the process: what one module sets process-wide (the
//! tracing subscriber of [`common::Guard`], files under `target/`) must suit
//! the others too.

mod common;

mod addresses;
mod alerts;
mod bench_smoke;
mod chaos;
mod chart;
mod cli;
mod co_tenant;
mod compacted_revision;
mod compression;
mod endpoints_parity;
mod guard;
mod harness;
mod image_smoke;
mod layers;
mod leader;
mod opt_in;
mod parity_rows;
mod pressure;
mod prometheus;
mod real_node;
mod slice_parity;
mod soak;
mod store;
mod watcher_selectors;
mod wire_agreement;
