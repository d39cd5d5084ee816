//! Paced listing: pauses between a list's pages so that the API server
//! spends only a share of the time serving them.
//!
//! kube-apiserver answers every client slower while it serves list pages
//! back to back (on a small control plane, by tens of milliseconds); with
//! pauses between pages, the same pages cost it the same, spread so that
//! few requests of others meet one.

use std::time::Duration;

/// The longest pause after one page: a page that took very long says the
/// server is slow, not that the list should stall for minutes.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// The longest a paced list is drawn out to by its pauses. Once a list's
/// revision is older than the watch cache's snapshots, its pages are served
/// from etcd at that revision, and kube-apiserver compacts a revision away
/// from one compaction interval after it was current (5 minutes by default,
/// `--etcd-compaction-interval`): a list still running then is answered
/// 410 Gone and starts over, unpaced. The pauses shrink so that the pages
/// left end within this span.
pub const PACED_LIST_SPAN: Duration = Duration::from_secs(240);

/// `share` if it is in (0, 1], else 1 (no pause).
pub fn valid_share(share: f64) -> f64 {
    if share > 0.0 && share <= 1.0 {
        share
    } else {
        1.0
    }
}

/// The pause after a page that took `took` (from asking to answer) so that
/// pages take `share` of the time: `took` × (1 / share − 1), at most
/// [`LONGEST_PAUSE`]; none for a share of 1 or one outside (0, 1].
pub fn pause_after(took: Duration, share: f64) -> Duration {
    let share = valid_share(share);
    if share >= 1.0 {
        return Duration::ZERO;
    }
    took.mul_f64(1.0 / share - 1.0).min(LONGEST_PAUSE)
}

/// The pause after a page that took `took`, `spent` into its list (pages
/// and pauses so far, this page included), with `pages_left` pages still
/// to come when the server counted them: [`pause_after`], shortened so that
/// the list ends within [`PACED_LIST_SPAN`] if each page left takes as long
/// as this one. Uncounted, the pauses stop once the span is spent and the
/// pages left come back to back.
pub fn pause_within_span(
    took: Duration,
    share: f64,
    spent: Duration,
    pages_left: Option<u64>,
) -> Duration {
    let left = PACED_LIST_SPAN.saturating_sub(spent);
    let budget = match pages_left {
        Some(pages) if pages > 0 => {
            (left / u32::try_from(pages).unwrap_or(u32::MAX)).saturating_sub(took)
        }
        _ => left,
    };
    pause_after(took, share).min(budget)
}

/// Pages of `limit` items that `remaining` items fill (the server's
/// `remainingItemCount`); `None` when it did not count them.
pub fn pages_for(remaining: Option<i64>, limit: u32) -> Option<u64> {
    let remaining = u64::try_from(remaining?).ok()?;
    Some(remaining.div_ceil(u64::from(limit.max(1))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_keeps_pages_at_their_share_and_is_capped() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(10), 0.1), ms(90));
        assert_eq!(pause_after(ms(10), 0.5), ms(10));
        assert_eq!(pause_after(ms(10), 1.0), Duration::ZERO);
        assert_eq!(pause_after(Duration::from_secs(10), 0.01), LONGEST_PAUSE);
        for odd in [0.0, -1.0, 2.0, f64::NAN, f64::INFINITY] {
            assert_eq!(pause_after(ms(10), odd), Duration::ZERO, "{odd}");
        }
    }

    #[test]
    fn the_pauses_fit_the_pages_left_into_the_span() {
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        // Early and few pages left: the share's pause.
        assert_eq!(pause_within_span(ms(10), 0.1, s(1), Some(10)), ms(90));
        // 1,000 pages of 100 ms at a twentieth would take 2,000 s: each
        // pause shrinks to what leaves the span's 240 s for them.
        assert_eq!(
            pause_within_span(ms(100), 0.05, ms(100), Some(1_000)),
            Duration::from_micros(139_900)
        );
        // Pages alone outlast the span: no pause.
        assert_eq!(
            pause_within_span(ms(100), 0.05, s(200), Some(1_000)),
            Duration::ZERO
        );
        // Uncounted: the share's pause until the span is spent, then none.
        assert_eq!(pause_within_span(ms(10), 0.1, s(100), None), ms(90));
        assert_eq!(
            pause_within_span(ms(10), 0.1, PACED_LIST_SPAN - ms(40), None),
            ms(40)
        );
        assert_eq!(
            pause_within_span(ms(10), 0.1, PACED_LIST_SPAN + s(1), None),
            Duration::ZERO
        );
        assert_eq!(pause_within_span(ms(10), 0.1, s(1), Some(0)), ms(90));
    }

    #[test]
    fn pages_left_round_up_and_need_a_count() {
        assert_eq!(pages_for(Some(1_001), 500), Some(3));
        assert_eq!(pages_for(Some(1_000), 500), Some(2));
        assert_eq!(pages_for(Some(0), 500), Some(0));
        assert_eq!(pages_for(None, 500), None);
        assert_eq!(pages_for(Some(-1), 500), None);
        assert_eq!(pages_for(Some(7), 0), Some(7));
    }
}
