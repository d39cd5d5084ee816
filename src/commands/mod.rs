//! What the binary does instead of running the controller: the chart's
//! `helm test` and its pre-delete check, and the opt-in tools people run.

pub mod check_uninstall;
pub mod opt_in;
pub mod service_view;
pub mod status;
pub mod verify_endpoints;

use kube::Client;

use crate::config::Command;
use crate::error::Result;

/// Runs `command` with `client`; `namespace` (`--namespace`) narrows the
/// commands that look at every Service.
pub async fn run(client: &Client, command: &Command, namespace: Option<&str>) -> Result<()> {
    match command {
        Command::VerifyEndpoints(args) => verify_endpoints::run(client, args).await,
        Command::CheckUninstall => check_uninstall::run(client, namespace).await,
        Command::OptIn(args) => opt_in::opt_in(client, &args.service, args.steps).await,
        Command::OptOut(args) => opt_in::opt_out(client, &args.service, args.steps).await,
        Command::HandBack(args) => opt_in::hand_back_all(client, namespace, args.steps).await,
        Command::Status => status::run(client, namespace).await,
    }
}
