//! What every tool of endpoints-guard's tests shares: the generated
//! workloads (Services and pods; with Nodes and zones for EndpointSlices),
//! reading Prometheus text, a process's CPU and memory from /proc, durations
//! as flags write them, and the commit a report is stamped with.

pub mod metrics;
pub mod procstat;
pub mod slice_workload;
pub mod workload;

use std::time::Duration;

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

/// Parses `30m`, `3m`, `90s`, `1h`, `1h30m` (whole units).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut number = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        total += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    if !number.is_empty() {
        total += number.parse::<u64>().ok()?;
    }
    (total > 0).then(|| Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("3m"), Some(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Some(Duration::from_secs(45)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration(""), None);
    }
}
