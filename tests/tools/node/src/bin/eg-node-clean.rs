//! Takes down the real node a run that was stopped or killed left behind
//! (`hack/e2e-node.sh` calls it when interrupted): its programs, pods and
//! shims, mounts, bridge, rules, sysctls and folders, as
//! [`eg_node::clean_leftovers`] reads them from the run's marker. Waits up
//! to `--wait-secs` (default 30) for the run's test process to exit first.
//! Exits non-zero when something could not be put back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let mut wait = Duration::from_secs(30);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--wait-secs" => {
                let value = args.next().context("--wait-secs needs a value")?;
                wait = Duration::from_secs(
                    value
                        .parse()
                        .with_context(|| format!("--wait-secs {value}: not a number"))?,
                );
            }
            other => bail!("unknown argument {other}; usage: eg-node-clean [--wait-secs N]"),
        }
    }
    let deadline = Instant::now() + wait;
    loop {
        if let Some(notes) = eg_node::clean_leftovers() {
            eprintln!("eg-node-clean: the node left behind is taken down; notes: {notes:?}");
            return Ok(());
        }
        if !std::path::Path::new(eg_node::MARKER).exists() {
            eprintln!("eg-node-clean: no node was left behind");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the run in {} is still going after {} s",
                eg_node::MARKER,
                wait.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
