//! What the binary does instead of running the controller: the chart's
//! `helm test` and its pre-delete check.

pub mod check_uninstall;
pub mod verify_endpoints;
