//! CPU time and peak RSS of a process from /proc.
//!
//! `/proc/<pid>/stat` counts a process's CPU in clock ticks (10 ms), so 60 s
//! of a controller at rest is one to four of them. `/proc/<pid>/task/<tid>/
//! schedstat` counts each live thread's time on a CPU in nanoseconds, but
//! forgets a thread once it exits. A [`CpuSample`] holds both, and the time
//! between two samples is the threads' nanoseconds unless the ticks prove
//! that some of it was spent by a thread gone by then.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, anyhow};

/// The most two tick counts can understate a span: utime and stime are each
/// truncated to a whole tick at both ends.
const TICKS_SLACK_S: f64 = 0.02;

/// A process's CPU time at one moment.
#[derive(Clone, Debug, Default)]
pub struct CpuSample {
    /// utime + stime of the whole process (threads gone included), seconds,
    /// in whole clock ticks.
    pub ticks_s: f64,
    /// Nanoseconds on a CPU of each live thread, by thread id.
    pub threads_ns: BTreeMap<u32, u64>,
}

impl CpuSample {
    /// Reads both counts of `pid`.
    pub fn read(pid: u32) -> Result<Self> {
        let mut threads_ns = BTreeMap::new();
        let dir = format!("/proc/{pid}/task");
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            let entry = entry.with_context(|| format!("reading {dir}"))?;
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u32>().ok())
            else {
                continue;
            };
            // A thread that exits between the listing and the read is skipped:
            // the ticks below still hold its time.
            let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
                continue;
            };
            threads_ns.insert(tid, parse_schedstat(&text)?);
        }
        Ok(Self {
            ticks_s: cpu_seconds(pid)?,
            threads_ns,
        })
    }

    /// The CPU seconds spent from `earlier` to `self`, and whether they are
    /// the threads' nanoseconds (`true`) or the ticks' (`false`: a thread
    /// that ran in between had exited by `self`, or the ticks count more
    /// than their truncation explains).
    pub fn since(&self, earlier: &CpuSample) -> (f64, bool) {
        let ticks = self.ticks_s - earlier.ticks_s;
        let lost_thread = earlier
            .threads_ns
            .keys()
            .any(|tid| !self.threads_ns.contains_key(tid));
        // A thread born after `earlier` ran only in between: all of its time counts.
        let ns: u64 = self
            .threads_ns
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(earlier.threads_ns.get(tid).copied().unwrap_or(0)))
            .sum();
        let precise = ns as f64 / 1e9;
        if lost_thread || ticks > precise + TICKS_SLACK_S {
            (ticks, false)
        } else {
            (precise, true)
        }
    }
}

/// The first field of a schedstat line: nanoseconds on a CPU.
fn parse_schedstat(text: &str) -> Result<u64> {
    text.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .ok_or_else(|| anyhow!("schedstat without a run time: {text:?}"))
}

/// utime + stime of `pid`, in seconds (whole clock ticks).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("{path}: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state is field 3 of stat(5); utime and stime are fields 14 and 15.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("{path}: short"))?
            .parse::<u64>()
            .with_context(|| format!("{path}: field {}", i + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as f64
    } else {
        100.0
    };
    Ok(total as f64 / per_second)
}

/// VmHWM (peak resident set) of `pid`, in MiB.
pub fn peak_rss_mb(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kb: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("{path}: no VmHWM"))?;
    Ok(kb / 1024.0)
}

pub use crate::metrics::sample_sum as metric;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ticks_s: f64, threads: &[(u32, u64)]) -> CpuSample {
        CpuSample {
            ticks_s,
            threads_ns: threads.iter().copied().collect(),
        }
    }

    #[test]
    fn the_threads_nanoseconds_count_when_every_thread_lives_on() {
        let a = sample(0.10, &[(1, 100_000_000), (2, 5_000_000)]);
        // Thread 3 was born in between: its whole time counts.
        let b = sample(0.13, &[(1, 112_000_000), (2, 9_000_000), (3, 1_500_000)]);
        let (s, precise) = b.since(&a);
        assert!(precise);
        assert!((s - 0.0175).abs() < 1e-9, "{s}");
    }

    #[test]
    fn a_thread_gone_in_between_falls_back_to_the_ticks() {
        let a = sample(0.10, &[(1, 100_000_000), (2, 5_000_000)]);
        let b = sample(0.20, &[(1, 101_000_000)]);
        let (s, precise) = b.since(&a);
        assert!(!precise);
        assert!((s - 0.10).abs() < 1e-9, "{s}");
    }

    #[test]
    fn ticks_far_above_the_threads_time_win() {
        // More than the truncation can explain: time the listing missed.
        let a = sample(0.0, &[]);
        let b = sample(0.50, &[(1, 100_000_000)]);
        assert_eq!(b.since(&a), (0.5, false));
        // Within the truncation: the nanoseconds stand.
        let c = sample(0.11, &[(1, 100_000_000)]);
        assert_eq!(c.since(&a), (0.1, true));
    }

    #[test]
    fn this_process_reads() {
        let s = CpuSample::read(std::process::id()).expect("own /proc");
        assert!(!s.threads_ns.is_empty());
        assert!(parse_schedstat("").is_err());
    }
}
