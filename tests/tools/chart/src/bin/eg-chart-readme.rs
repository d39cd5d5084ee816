//! `eg-chart-readme` (`make chart-readme`): writes the chart's generated
//! documents, the values table of `charts/endpoints-guard/README.md` from
//! `values.yaml`'s comments and the chart's copy of `docs/runbook.md`
//! (`eg_chart::chart_docs`), and names the files it changed.

use anyhow::{Context, Result};
use eg_chart::chart_docs::expected;
use eg_harness::binaries::workspace_root;

fn main() -> Result<()> {
    let root = workspace_root()?;
    for (path, content) in expected(&root)? {
        if std::fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
            continue;
        }
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
