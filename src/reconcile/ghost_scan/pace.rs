//! How the scan spends its reads: a pass spread over a period, between a
//! floor and a cap of reads a second, in rounds (pure).

use std::time::Duration;

/// The slowest the scan reads while it has targets: however long the period,
/// a small cluster is read through in minutes, at a negligible cost.
pub(super) const MIN_QPS: f64 = 0.5;

/// The reads due in this long are made together, as one round. A read made
/// alone, after the process has gone idle, costs about twice the CPU of one
/// made beside others (thread wake-ups, the connection's buffers gone cold:
/// `eg-readcost`, docs/bench-runs.md); a round delays a read by at most this.
pub(super) const ROUND: Duration = Duration::from_secs(5);

/// The most reads of a round in flight at once (each holds a connection).
pub(super) const ROUND_CONCURRENCY: usize = 4;

/// How the scan spends its reads.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The most reads a second (0: the scan is off).
    pub qps: f64,
    /// One pass over all targets is spread over this long (0: as fast as
    /// `qps` allows).
    pub period: Duration,
}

/// When the scan reads: every `interval`, `reads` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rounds {
    pub(super) interval: Duration,
    pub(super) reads: usize,
}

impl Pace {
    /// The wait between two reads of a pass over `targets`: the pass spread
    /// over `period`, never slower than `MIN_QPS` reads a second and never
    /// faster than `qps`. The read rate grows with the cluster until `qps`
    /// caps it, so a small cluster is not read through every few seconds.
    pub(super) fn gap(self, targets: usize) -> Duration {
        let fastest = Duration::from_secs_f64(1.0 / self.qps);
        let slowest = Duration::from_secs_f64(1.0 / MIN_QPS).max(fastest);
        let spread = self
            .period
            .checked_div(u32::try_from(targets.max(1)).unwrap_or(u32::MAX))
            .unwrap_or(Duration::ZERO);
        spread.clamp(fastest, slowest)
    }

    /// The same reads a second as [`Pace::gap`], grouped into rounds of at
    /// most `ROUND` and never longer than one period (a short period is a
    /// request for a short detection bound): the whole reads that fit, and
    /// a round exactly that many gaps long, so the rate is the gap's.
    pub(super) fn rounds(self, targets: usize) -> Rounds {
        let gap = self.gap(targets);
        let longest = ROUND.min(self.period).max(gap);
        // A round holds at least one read; f64 → u32 saturates.
        let reads = ((longest.as_secs_f64() / gap.as_secs_f64()).floor() as u32).max(1);
        Rounds {
            interval: gap.saturating_mul(reads),
            reads: reads as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_spread_over_the_period_within_one_read_every_two_seconds_and_qps() {
        let pace = Pace {
            qps: 20.0,
            period: Duration::from_secs(900),
        };
        let ms = |targets| pace.gap(targets).as_millis();
        // A few targets: one read every two seconds, not one per 900 s / 3.
        assert_eq!(ms(3), 2000);
        assert_eq!(ms(0), 2000);
        // 1,100 targets (100 Services × 1,000 pods): 900 s / 1,100.
        assert_eq!(ms(1_100), 818);
        // 11,000: 12.2 reads a second.
        assert_eq!(ms(11_000), 81);
        // 110,000: capped at 20 reads a second, the pass takes 5,500 s.
        assert_eq!(ms(110_000), 50);
        // Period 0: as fast as qps allows, at any size.
        let flat = Pace {
            qps: 20.0,
            period: Duration::ZERO,
        };
        assert_eq!(flat.gap(3).as_millis(), 50);
        // A budget below one read a second is kept.
        let slow = Pace {
            qps: 0.5,
            period: Duration::from_secs(900),
        };
        assert_eq!(slow.gap(3).as_millis(), 2000);
        // The default period, six hours, at most 5 reads a second: the
        // floor below 10,800 targets (1,100: 100 Services × 1,000 pods),
        // about half a read a second at 11,000, the cap above 108,000.
        let default = Pace {
            qps: 5.0,
            period: Duration::from_secs(6 * 3600),
        };
        assert_eq!(default.gap(1_100).as_millis(), 2_000);
        assert_eq!(default.gap(11_000).as_millis(), 1_963);
        assert_eq!(default.gap(110_000).as_millis(), 200);
    }

    #[test]
    fn reads_are_grouped_into_rounds_at_the_same_rate() {
        let pace = Pace {
            qps: 20.0,
            period: Duration::from_secs(900),
        };
        let rounds = |targets| {
            let r = pace.rounds(targets);
            (r.interval.as_millis(), r.reads)
        };
        // One read every two seconds, two at a time.
        assert_eq!(rounds(3), (4_000, 2));
        // 1,100 targets: 1.22 reads a second, six every 4.9 s.
        assert_eq!(rounds(1_100), (4_909, 6));
        // The qps cap: 20 a second, a hundred every 5 s.
        assert_eq!(rounds(110_000), (5_000, 100));
        // A period shorter than a round: one round per period.
        let short = Pace {
            qps: 20.0,
            period: Duration::from_secs(2),
        };
        assert_eq!(short.rounds(4).interval.as_millis(), 2_000);
        assert_eq!(short.rounds(4).reads, 4);
        // Period 0: one read per gap, as fast as qps allows.
        let flat = Pace {
            qps: 20.0,
            period: Duration::ZERO,
        };
        assert_eq!(flat.rounds(3).interval.as_millis(), 50);
        assert_eq!(flat.rounds(3).reads, 1);
    }
}
