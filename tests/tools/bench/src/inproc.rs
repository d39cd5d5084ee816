//! Latency inside endpoints-guard during churn, from its own histograms:
//! `endpoints_guard_event_to_write_seconds` (watch event received → the
//! write it causes sent) and `endpoints_guard_event_to_write_answered_seconds`
//! (→ that write's answer read), scraped before and after churn so cold
//! sync's writes are left out. The end-to-end churn figures include
//! kube-apiserver's own time on both sides; these do not.

use serde::{Deserialize, Serialize};

use super::Kind;
use eg_workload::metrics::parse_series;

/// Name of the histogram from event to write sent.
pub const SENT: &str = "endpoints_guard_event_to_write_seconds";
/// Name of the histogram from event to the write's answer.
pub const ANSWERED: &str = "endpoints_guard_event_to_write_answered_seconds";

/// The in-process figures of one churn phase, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InProcess {
    /// Writes timed in churn (one per reconcile that wrote).
    pub samples: u64,
    pub sent_p50_ms: f64,
    pub sent_p99_ms: f64,
    pub sent_p999_ms: f64,
    pub answered_p50_ms: f64,
    pub answered_p99_ms: f64,
    pub answered_p999_ms: f64,
    /// Upper bound of the highest bucket holding a sample (event → write
    /// sent): the slowest write lies at or below it.
    pub sent_max_ms: f64,
}

impl InProcess {
    /// The figures of `kind`'s controller between the scrapes `before` and
    /// `after` of endpoints-guard's /metrics; `None` when a histogram is
    /// missing from either.
    pub fn between(kind: Kind, before: &str, after: &str) -> Option<Self> {
        Self::over(kind, &[(before, after)])
    }

    /// The figures of `kind`'s controller over several spans, each between
    /// a scrape before and one after it, taken together; `None` without
    /// spans or when a histogram is missing from a scrape.
    pub fn over(kind: Kind, spans: &[(&str, &str)]) -> Option<Self> {
        let label = kind.name();
        let added = |name: &str| -> Option<Buckets> {
            let mut total: Option<Buckets> = None;
            for (before, after) in spans {
                let span =
                    Buckets::read(after, name, label)?.minus(&Buckets::read(before, name, label)?);
                total = Some(match total {
                    Some(total) => total.plus(&span),
                    None => span,
                });
            }
            total
        };
        let sent = added(SENT)?;
        let answered = added(ANSWERED)?;
        let ms = |b: &Buckets, q: f64| b.quantile(q) * 1000.0;
        Some(Self {
            samples: sent.count(),
            sent_p50_ms: ms(&sent, 0.5),
            sent_p99_ms: ms(&sent, 0.99),
            sent_p999_ms: ms(&sent, 0.999),
            answered_p50_ms: ms(&answered, 0.5),
            answered_p99_ms: ms(&answered, 0.99),
            answered_p999_ms: ms(&answered, 0.999),
            sent_max_ms: sent.max_bound() * 1000.0,
        })
    }
}

/// One histogram series: (upper bound in seconds, cumulative count), by
/// bound, `+Inf` last.
#[derive(Clone, Debug, PartialEq)]
struct Buckets(Vec<(f64, f64)>);

impl Buckets {
    /// The `_bucket` samples of `name` with `controller="<controller>"`.
    fn read(text: &str, name: &str, controller: &str) -> Option<Self> {
        let bucket = format!("{name}_bucket");
        let mut buckets: Vec<(f64, f64)> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (sample, labels) = parse_series(series);
                if sample != bucket || !labels.contains(&("controller", controller)) {
                    return None;
                }
                let le = labels.iter().find(|(k, _)| *k == "le")?.1;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, value.parse().ok()?))
            })
            .collect();
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Self(buckets))
    }

    /// The samples added since `earlier`, bucket by bucket.
    fn minus(&self, earlier: &Self) -> Self {
        self.bucketwise(earlier, |n, before| (n - before).max(0.0))
    }

    /// Both spans' samples, bucket by bucket (the bounds are the same).
    fn plus(&self, other: &Self) -> Self {
        self.bucketwise(other, |n, more| n + more)
    }

    /// `combine` of each bucket's count with `other`'s at the same bound
    /// (0 where `other` lacks it).
    fn bucketwise(&self, other: &Self, combine: impl Fn(f64, f64) -> f64) -> Self {
        Self(
            self.0
                .iter()
                .map(|&(le, n)| {
                    let theirs = other
                        .0
                        .iter()
                        .find(|(l, _)| *l == le)
                        .map_or(0.0, |(_, n)| *n);
                    (le, combine(n, theirs))
                })
                .collect(),
        )
    }

    fn count(&self) -> u64 {
        self.0.last().map_or(0, |(_, n)| *n as u64)
    }

    /// The `q` quantile in seconds, interpolated linearly inside its bucket
    /// as Prometheus's `histogram_quantile` does (from 0 in the first); in
    /// the `+Inf` bucket, the highest finite bound. 0 without samples.
    fn quantile(&self, q: f64) -> f64 {
        let total = self.count() as f64;
        if total == 0.0 {
            return 0.0;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, n) in &self.0 {
            if n >= rank {
                if le.is_infinite() {
                    return lower.0;
                }
                let within = n - lower.1;
                let fraction = if within > 0.0 {
                    (rank - lower.1) / within
                } else {
                    1.0
                };
                return lower.0 + (le - lower.0) * fraction;
            }
            lower = (le, n);
        }
        lower.0
    }

    /// The upper bound of the highest bucket with a sample in it (the
    /// highest finite bound when that is `+Inf`); 0 without samples.
    fn max_bound(&self) -> f64 {
        let mut below = (0.0, 0.0);
        for &(le, n) in &self.0 {
            if n > below.1 {
                below = (le, n);
            }
        }
        if below.0.is_infinite() {
            self.0
                .iter()
                .rev()
                .find(|(le, _)| le.is_finite())
                .map_or(0.0, |(le, _)| *le)
        } else {
            below.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(name: &str, controller: &str, buckets: &[(&str, u64)]) -> String {
        buckets
            .iter()
            .map(|(le, n)| {
                format!("{name}_bucket{{controller=\"{controller}\",le=\"{le}\"}} {n}\n")
            })
            .collect()
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket_and_ignore_what_came_before() {
        let before = exposition(
            SENT,
            "endpoints",
            &[("0.001", 10), ("0.002", 10), ("+Inf", 10)],
        ) + &exposition(
            ANSWERED,
            "endpoints",
            &[("0.001", 0), ("0.002", 10), ("+Inf", 10)],
        );
        // Churn adds 100 samples: 50 below 1 ms, 49 in (1, 2] ms, 1 above.
        let after = exposition(
            SENT,
            "endpoints",
            &[("0.001", 60), ("0.002", 109), ("+Inf", 110)],
        ) + &exposition(
            SENT,
            "endpointslices",
            &[("0.001", 7), ("0.002", 7), ("+Inf", 7)],
        ) + &exposition(
            ANSWERED,
            "endpoints",
            &[("0.001", 0), ("0.002", 110), ("+Inf", 110)],
        );
        let figures = InProcess::between(Kind::Endpoints, &before, &after).expect("histograms");
        assert_eq!(figures.samples, 100);
        assert!((figures.sent_p50_ms - 1.0).abs() < 1e-9, "{figures:?}");
        // Rank 99: the 49th of 49 in (1, 2] ms.
        assert!((figures.sent_p99_ms - 2.0).abs() < 1e-9, "{figures:?}");
        // In +Inf: the highest finite bound.
        assert!((figures.sent_p999_ms - 2.0).abs() < 1e-9, "{figures:?}");
        assert!((figures.sent_max_ms - 2.0).abs() < 1e-9, "{figures:?}");
        assert!((figures.answered_p50_ms - 1.5).abs() < 1e-9, "{figures:?}");
    }

    #[test]
    fn a_missing_histogram_gives_nothing_and_no_samples_give_zeros() {
        let text = exposition(SENT, "endpoints", &[("0.001", 3), ("+Inf", 3)])
            + &exposition(ANSWERED, "endpoints", &[("0.001", 3), ("+Inf", 3)]);
        assert_eq!(InProcess::between(Kind::EndpointSlices, &text, &text), None);
        assert_eq!(
            InProcess::between(Kind::Endpoints, &text, &text),
            Some(InProcess::default())
        );
    }

    #[test]
    fn spans_add_up_and_what_lies_between_them_is_left_out() {
        let scrape = |fast: u64, slow: u64| {
            let all = fast + slow;
            exposition(
                SENT,
                "endpoints",
                &[("0.001", fast), ("0.008", all), ("+Inf", all)],
            ) + &exposition(
                ANSWERED,
                "endpoints",
                &[("0.001", fast), ("0.008", all), ("+Inf", all)],
            )
        };
        // Two spans of one slow write each; between them 50 fast writes.
        let (a0, a1, b0, b1) = (scrape(0, 0), scrape(0, 1), scrape(50, 1), scrape(50, 2));
        let spans = [(a0.as_str(), a1.as_str()), (b0.as_str(), b1.as_str())];
        let figures = InProcess::over(Kind::Endpoints, &spans).expect("histograms");
        assert_eq!(figures.samples, 2);
        assert!(figures.sent_p50_ms > 1.0, "{figures:?}");
        assert!((figures.sent_max_ms - 8.0).abs() < 1e-9, "{figures:?}");
        assert_eq!(InProcess::over(Kind::Endpoints, &[]), None);
    }
}
