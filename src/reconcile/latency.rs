//! How long a watch event waits inside the process before the write it
//! causes goes out: from the arrival of the event (the instant the watcher
//! hands to its sink, carried through the work queue with the key) to the
//! first write of the reconcile that serves it, and to that write's answer.
//! Exported as `endpoints_guard_event_to_write_seconds` and
//! `endpoints_guard_event_to_write_answered_seconds`, by controller.
//!
//! The difference between the two is the API server's time for one write;
//! the first alone is the controller's own (decoding, caching, queue wait,
//! the reconcile up to its first write), free of the API server's jitter
//! that end-to-end figures include.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use prometheus::Histogram;

use crate::metrics::Metrics;
use crate::settings::Controller;

/// The two histograms of one controller, resolved once per worker rather
/// than looked up by label on every reconcile.
#[derive(Clone)]
pub struct WriteClock {
    sent: Histogram,
    answered: Histogram,
}

impl WriteClock {
    pub fn new(metrics: &Metrics, controller: Controller) -> Self {
        let label = [controller.metric_label()];
        Self {
            sent: metrics.event_to_write.with_label_values(&label),
            answered: metrics.event_to_write_answered.with_label_values(&label),
        }
    }

    /// The timer of a reconcile serving events the first of which arrived
    /// at `received`.
    pub fn timer(&self, received: Option<Instant>) -> WriteTimer {
        WriteTimer {
            received,
            clock: self.clone(),
            timed: AtomicBool::new(false),
        }
    }
}

/// The clock of one reconcile: when the earliest event it serves arrived.
/// Only the reconcile's first write is timed (the one that starts to carry
/// the change out); a reconcile that writes nothing records nothing, and so
/// does one that no event caused (a resync, a sweep).
pub struct WriteTimer {
    received: Option<Instant>,
    clock: WriteClock,
    /// Set once the first write has been timed; atomic because the
    /// reconcile's future, which borrows this, must be `Send`.
    timed: AtomicBool,
}

impl WriteTimer {
    /// Sends a write: awaits `write`, recording, when it is the reconcile's
    /// first, the time from the event to now and to its answer.
    pub async fn write<F: Future>(&self, write: F) -> F::Output {
        let first = self
            .received
            .filter(|_| !self.timed.swap(true, Ordering::Relaxed));
        if let Some(received) = first {
            self.clock.sent.observe(received.elapsed().as_secs_f64());
        }
        let answer = write.await;
        if let Some(received) = first {
            self.clock
                .answered
                .observe(received.elapsed().as_secs_f64());
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(metrics: &Metrics, controller: Controller) -> (u64, u64) {
        let label = [controller.metric_label()];
        (
            metrics
                .event_to_write
                .with_label_values(&label)
                .get_sample_count(),
            metrics
                .event_to_write_answered
                .with_label_values(&label)
                .get_sample_count(),
        )
    }

    #[tokio::test]
    async fn only_the_first_write_of_a_reconcile_is_timed() {
        let metrics = Metrics::new().expect("metrics");
        let timer =
            WriteClock::new(&metrics, Controller::Endpointslices).timer(Some(Instant::now()));
        assert_eq!(timer.write(async { 1 }).await, 1);
        assert_eq!(timer.write(async { 2 }).await, 2);
        assert_eq!(counts(&metrics, Controller::Endpointslices), (1, 1));
        assert_eq!(counts(&metrics, Controller::Endpoints), (0, 0));
    }

    #[tokio::test]
    async fn a_reconcile_no_event_caused_records_nothing() {
        let metrics = Metrics::new().expect("metrics");
        let timer = WriteClock::new(&metrics, Controller::Endpoints).timer(None);
        timer.write(async {}).await;
        assert_eq!(counts(&metrics, Controller::Endpoints), (0, 0));
    }
}
