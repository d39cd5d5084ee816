//! One watch stream, copied from the API server to the client event by
//! event on the wire it came on, transformed per the faults in force, and
//! open to commands (inject, cut).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use tokio::sync::mpsc;
use tracing::info;

use super::body::{Body, BoxError};
use super::events::{self, Out, StreamFaults, Transformer, rv_number};
use super::faults::FaultKind;
use super::state::{Command, Shared};
use super::wire::Wire;

pub(super) type Sender = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

pub(super) fn stream_body(rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>) -> Body {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    BodyExt::boxed_unsync(StreamBody::new(stream))
}

/// A watch resuming from an old RV the proxy sent: the API server's replay
/// (events up to `until`) is paced.
#[derive(Debug, Clone, Copy)]
pub(super) struct Replay {
    pub(super) until: u64,
    pub(super) pace: Duration,
}

/// Copies one watch stream from the API server to the client, transformed.
pub(super) struct Pump {
    pub(super) shared: Arc<Shared>,
    pub(super) resource: String,
    pub(super) namespace: Option<String>,
    pub(super) wire: Wire,
    pub(super) tx: Sender,
    pub(super) replay: Option<Replay>,
}

/// Counts the open stream while it lives.
struct OpenStream(Arc<Shared>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

enum Flow {
    Continue,
    Stop,
}

impl Pump {
    pub(super) async fn run(mut self, mut upstream: Incoming) {
        self.shared.stream_opened();
        let _open = OpenStream(self.shared.clone());
        let mut commands = self.shared.subscribe();
        let mut buf = Vec::new();
        let mut transformer = Transformer::new(self.wire);
        let mut hold_until = tokio::time::Instant::now();
        // Events the watch-lag fault holds, each with the time it is due.
        let mut lagging: VecDeque<(tokio::time::Instant, Vec<Out>)> = VecDeque::new();
        let mut silent = false;
        loop {
            let holding = transformer.holding();
            let due = lagging.front().map(|(due, _)| *due);
            tokio::select! {
                frame = upstream.frame() => {
                    let came = tokio::time::Instant::now();
                    let data = match frame {
                        Some(Ok(frame)) => match frame.into_data() {
                            Ok(data) => data,
                            Err(_) => continue,
                        },
                        // The API server ended the watch (or failed): end ours.
                        _ => break,
                    };
                    // The client of a half-open stream hears nothing more.
                    if silent {
                        continue;
                    }
                    buf.extend_from_slice(&data);
                    let split = match self.wire.split(&mut buf) {
                        Ok(split) => split,
                        Err(err) => {
                            info!(resource = %self.resource, error = %err, "unreadable watch stream: ending it");
                            break;
                        }
                    };
                    let lag = self.lag();
                    for event in split {
                        let was_holding = transformer.holding();
                        let out = self.on_event(&mut transformer, &event).await;
                        match lag {
                            Some(lag) => {
                                self.shared.bump(&self.resource, "events_lagged");
                                lagging.push_back((came + lag, out));
                            }
                            None => {
                                if let Flow::Stop = self.write(out).await {
                                    return;
                                }
                            }
                        }
                        if !was_holding && transformer.holding() {
                            hold_until = tokio::time::Instant::now() + self.hold();
                        }
                    }
                }
                command = commands.recv() => match command {
                    // A half-open stream takes no more commands.
                    Ok(_) if silent => {}
                    Ok(command) if !command.applies(&self.resource, self.namespace.as_deref()) => {}
                    Ok(Command::Silence { .. }) => {
                        info!(resource = %self.resource, "the watch stream goes half-open");
                        self.shared.bump(&self.resource, "streams_silenced");
                        silent = true;
                    }
                    Ok(command) => {
                        if let Flow::Stop = self.on_command(command).await {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                },
                _ = tokio::time::sleep_until(hold_until), if holding && !silent => {
                    if let Some(held) = transformer.take_held()
                        && !self.send(held).await
                    {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(due.unwrap_or(hold_until)), if due.is_some() && !silent => {
                    if let Some((_, out)) = lagging.pop_front()
                        && let Flow::Stop = self.write(out).await
                    {
                        return;
                    }
                }
                _ = self.tx.closed() => return,
            }
        }
        // A half-open stream says nothing, even at its end.
        if silent {
            self.tx.closed().await;
            return;
        }
        for (due, out) in lagging {
            tokio::time::sleep_until(due).await;
            if let Flow::Stop = self.write(out).await {
                return;
            }
        }
        if let Some(held) = transformer.take_held() {
            self.send(held).await;
        }
    }

    /// How long the watch-lag fault holds each event, when it is set.
    fn lag(&self) -> Option<Duration> {
        self.shared
            .fault(&self.resource, FaultKind::WatchLag)
            .map(|f| Duration::from_millis(f.delay_ms()))
    }

    fn hold(&self) -> Duration {
        let ms = self
            .shared
            .fault(&self.resource, FaultKind::Reorder)
            .map_or(500, |f| f.hold_ms());
        Duration::from_millis(ms)
    }

    async fn send(&self, bytes: Vec<u8>) -> bool {
        self.tx
            .send(Ok(Frame::data(Bytes::from(bytes))))
            .await
            .is_ok()
    }

    /// What to write for one event from the API server.
    async fn on_event(&mut self, transformer: &mut Transformer, raw: &[u8]) -> Vec<Out> {
        let event = self.wire.decode(raw);
        let mut previous_rv = None;
        let mut replaying = false;
        if let Some(event) = &event {
            let kind = events::event_type(event);
            let rv = events::object_rv(event).and_then(rv_number);
            if let Some(key) = events::event_key(event) {
                previous_rv = self.shared.previous_rv(&self.resource, &key);
            }
            if let (Some(replay), Some(rv)) = (self.replay, rv) {
                if rv <= replay.until && matches!(kind, "ADDED" | "MODIFIED" | "DELETED") {
                    replaying = true;
                    self.shared.bump(&self.resource, "replayed_events_paced");
                    tokio::time::sleep(replay.pace).await;
                } else if rv > replay.until {
                    self.replay = None;
                }
            }
            // Replayed history is old news: the proxy's knowledge stays current.
            if !replaying {
                self.shared.record_event(&self.resource, event);
            }
            self.shared.bump(&self.resource, "events_seen");
        }
        // The replayed history is passed on as the API server sends it.
        let mut faults = if replaying {
            StreamFaults::default()
        } else {
            self.stream_faults()
        };
        if faults.old_delete_rv
            && let Some(event) = &event
            && events::event_type(event) == "DELETED"
        {
            let key = events::event_key(event).unwrap_or_default();
            let rv = events::object_rv(event).unwrap_or_default();
            faults.old_delete_rv = self.shared.first_old_delete(&self.resource, &key, rv);
        }
        let step = transformer.on_view(&self.resource, raw, event, faults, previous_rv.as_deref());
        for note in &step.notes {
            self.shared.bump(&self.resource, note);
        }
        if let Some(old) = &step.fake_rv {
            let pace = self
                .shared
                .fault(&self.resource, FaultKind::OldDeleteRv)
                .map_or(250, |f| f.pace_ms());
            self.shared.register_replay(&self.resource, old, pace);
            info!(resource = %self.resource, rv = %old, "sent a DELETE with an old RV; ending the stream");
        }
        step.out
    }

    async fn write(&self, out: Vec<Out>) -> Flow {
        for item in out {
            match item {
                Out::Line(bytes) => {
                    if !self.send(bytes).await {
                        return Flow::Stop;
                    }
                }
                Out::Partial(bytes) => {
                    self.send(bytes).await;
                    let _ = self.tx.send(Err("stream cut by watch-chaos".into())).await;
                    return Flow::Stop;
                }
                Out::Close => return Flow::Stop,
            }
        }
        Flow::Continue
    }

    async fn on_command(&self, command: Command) -> Flow {
        match command {
            Command::Inject { events, close, .. } => {
                let mut out: Vec<Out> = events
                    .iter()
                    .map(|event| Out::Line(self.wire.encode(event)))
                    .collect();
                if close {
                    out.push(Out::Close);
                }
                self.write(out).await
            }
            Command::Cut { .. } => {
                self.shared.bump(&self.resource, "streams_cut");
                self.write(vec![Out::Partial(self.wire.cut_fragment())])
                    .await
            }
            // The run loop itself goes silent.
            Command::Silence { .. } => Flow::Continue,
        }
    }

    fn stream_faults(&self) -> StreamFaults {
        let faults = self.shared.faults();
        let r = self.resource.as_str();
        StreamFaults {
            old_delete_rv: faults.has(r, FaultKind::OldDeleteRv),
            drop_deletes: faults.has(r, FaultKind::DropDeletes),
            duplicate: faults.has(r, FaultKind::Duplicate),
            reorder: faults.has(r, FaultKind::Reorder),
            prevkv_nil: faults.has(r, FaultKind::PrevkvNil),
            cut_after: faults.get(r, FaultKind::CutMidEvent).map(|f| f.after()),
        }
    }
}
