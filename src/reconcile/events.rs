//! Kubernetes Events, published off the reconcile path: a reconcile hands its
//! Event to a bounded channel and goes on; one publisher posts them in order,
//! one request at a time, so Events never hold a worker nor crowd the writes
//! in the client's budget. kube's `Recorder` folds a repeated Event into a
//! series of the first. When the channel is full (the API server slow or
//! refusing, a burst of reports) an Event is dropped and counted
//! (`endpoints_guard_events_dropped_total`).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use prometheus::IntCounter;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::{debug, warn};

/// Events waiting to be published.
const CAPACITY: usize = 256;

struct Pending {
    event: Event,
    regarding: ObjectReference,
}

/// The reconcile's side: hands Events to the publisher.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Pending>,
    dropped: IntCounter,
}

/// The publisher's side: run it as a task of its own.
pub struct EventPublisher {
    rx: mpsc::Receiver<Pending>,
    recorder: Recorder,
}

/// A sink and the publisher that posts what it is handed through `recorder`.
pub fn channel(recorder: Recorder, dropped: IntCounter) -> (EventSink, EventPublisher) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    (EventSink { tx, dropped }, EventPublisher { rx, recorder })
}

impl EventSink {
    /// Queues `event` about `regarding`; never waits.
    pub fn send(&self, event: Event, regarding: ObjectReference) {
        if let Err(err) = self.tx.try_send(Pending { event, regarding }) {
            self.dropped.inc();
            let (why, pending) = match err {
                TrySendError::Full(pending) => ("the publisher is behind", pending),
                TrySendError::Closed(pending) => ("the publisher has stopped", pending),
            };
            debug!(reason = %pending.event.reason, "a Kubernetes Event was dropped: {why}");
        }
    }
}

impl EventPublisher {
    /// Posts every Event handed to the sink, in order, until every sink is
    /// gone.
    pub async fn run(mut self) {
        while let Some(Pending { event, regarding }) = self.rx.recv().await {
            if let Err(err) = self.recorder.publish(&event, &regarding).await {
                let namespace = regarding.namespace.as_deref().unwrap_or_default();
                let name = regarding.name.as_deref().unwrap_or_default();
                warn!(error = %err, reason = %event.reason, %namespace, %name, "could not publish a Kubernetes Event");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::events::{EventType, Reporter};

    fn event() -> Event {
        Event {
            type_: EventType::Warning,
            reason: "Test".into(),
            note: None,
            action: "Sync".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn a_full_channel_drops_and_counts_without_waiting() {
        // A client to nowhere: the publisher never runs here.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let dropped = IntCounter::new("dropped", "test").expect("a counter");
        let (sink, _publisher) = channel(recorder, dropped.clone());
        for _ in 0..CAPACITY + 3 {
            sink.send(event(), ObjectReference::default());
        }
        assert_eq!(dropped.get(), 3);
    }
}
