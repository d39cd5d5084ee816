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
}
