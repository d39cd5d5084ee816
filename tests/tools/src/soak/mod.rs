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

use std::time::Duration;

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
