//! The watcher as a stream of kube-runtime's `watcher::Event`s, so that a
//! kube-rs program built on `kube::runtime::watcher` (a reflector, a
//! `Controller`) can run on this watcher instead.
//!
//! The translation keeps the watcher's rules:
//! - The stream begins when the cache first holds a complete consistent
//!   list: `Init`, one `InitApply` per cached object, `InitDone`. A cache
//!   that starts over (its store was rewound) begins again the same way, so
//!   a reflector fed by the stream drops what the lost history left in it.
//! - Additions and updates are `Apply`.
//! - A deletion candidate becomes `Delete` only once a read that reaches
//!   etcd found that incarnation gone (the store then remembers the deletion
//!   as confirmed); a read that finds the object puts it back in the cache
//!   and yields `Apply`. A read that fails is tried again, with a growing
//!   pause, until it answers.
//! - Objects awaiting that read when a sequence begins are still listed
//!   (`InitApply`): `InitDone` would otherwise delete them from a reflector
//!   unread.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::watcher::{Error as WatcherError, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tracing::{error, warn};

use super::driver::Watcher;
use super::live;
use super::object::{Cached, Change, Confirmation, LiveRead, Outcome, Whole};
use super::store::Store;

/// The first pause after a failed read of a deletion candidate; it doubles
/// up to [`MAX_READ_RETRY`].
const FIRST_READ_RETRY: Duration = Duration::from_millis(200);
const MAX_READ_RETRY: Duration = Duration::from_secs(30);

impl<K, P> Watcher<K, Whole<K>, P>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    P: Fn(K) -> Option<Whole<K>> + Send + Sync + 'static,
{
    /// Runs the watcher as a stream of kube-runtime's
    /// [`watcher::Event`](kube::runtime::watcher::Event)s, typed as
    /// `kube::runtime::watcher()`'s stream is, so it feeds
    /// `kube::runtime::reflector` and, through it, a `Controller`:
    ///
    /// ```no_run
    /// # async fn demo(client: kube::Client) {
    /// use futures::StreamExt;
    /// use hardened_watcher::Watcher;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::{WatchStreamExt, reflector};
    ///
    /// let (reader, writer) = reflector::store::<ConfigMap>();
    /// let events = Watcher::builder(kube::Api::<ConfigMap>::all(client))
    ///     .resource("configmaps")
    ///     .build()
    ///     .into_event_stream();
    /// let mut applied = std::pin::pin!(reflector(writer, events).applied_objects());
    /// while let Some(Ok(cm)) = applied.next().await {
    ///     println!("{} cached, {} in all", cm.metadata.name.unwrap_or_default(), reader.len());
    /// }
    /// # }
    /// ```
    ///
    /// What each event means is in the module's rules: `Delete` only after
    /// a read from etcd agreed, `Init`..`InitDone` again after a rewound
    /// store. The stream yields no error: API failures relist, resume or
    /// back off inside. It ends only if the watcher cannot start (its store
    /// already has a watcher; logged). Dropping it stops the watcher. The
    /// change handler given to the builder, if any, is still called.
    pub fn into_event_stream(
        mut self,
    ) -> impl Stream<Item = Result<Event<K>, WatcherError>> + Send + 'static {
        let (sender, changes) = mpsc::unbounded_channel();
        self.chain_sink(Arc::new(move |change: &Change<Whole<K>>, _arrived| {
            // The stream was dropped: nobody listens any more.
            let _ = sender.send(change.clone());
        }));
        let store = self.store();
        let feed = EventFeed {
            synced: store.synced(),
            store,
            changes,
            client: self.api.clone().into_client(),
            dyntype: self.dyntype.clone(),
            pending: VecDeque::new(),
            announced: false,
        };
        let run = async move {
            // Kept here, so the watcher stops only when the stream is dropped.
            let (_keep_running, shutdown) = watch::channel(false);
            if let Err(err) = self.run(shutdown).await {
                error!(error = %err, "the watcher behind the event stream did not start");
            }
        };
        // The watcher's task yields nothing; when it ends, its change handler
        // (and with it the channel's sender) goes, and the feed ends too.
        let run = run.into_stream().filter_map(|()| std::future::ready(None));
        let events = futures::stream::unfold(feed, |mut feed| async move {
            let event = feed.next_event().await?;
            Some((Ok(event), feed))
        });
        futures::stream::select(run, events)
    }
}

/// An event to yield, or a deletion candidate to read first.
enum Pending<K> {
    Ready(Event<K>),
    Confirm(Arc<Whole<K>>),
}

/// Turns the watcher's changes into kube-runtime events.
struct EventFeed<K: kube::Resource + Clone + Send + Sync + 'static> {
    store: Store<Whole<K>>,
    synced: watch::Receiver<bool>,
    changes: mpsc::UnboundedReceiver<Change<Whole<K>>>,
    client: kube::Client,
    dyntype: K::DynamicType,
    pending: VecDeque<Pending<K>>,
    /// Whether the `Init` sequence of the current synced period was queued.
    announced: bool,
}

impl<K> EventFeed<K>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
{
    /// The next event; `None` once the watcher is gone.
    async fn next_event(&mut self) -> Option<Event<K>> {
        loop {
            if !self.announced {
                self.wait_synced().await?;
                self.announce();
            }
            if let Some(pending) = self.pending.pop_front() {
                match pending {
                    Pending::Ready(event) => return Some(event),
                    Pending::Confirm(last) => match self.confirm(last).await {
                        Some(event) => return Some(event),
                        None => continue,
                    },
                }
            }
            tokio::select! {
                changed = self.synced.changed() => {
                    changed.ok()?;
                    if !*self.synced.borrow_and_update() {
                        // Starting over: the next sequence replaces everything.
                        self.announced = false;
                    }
                }
                change = self.changes.recv() => self.pending.push_back(translate(change?)),
            }
        }
    }

    /// Waits until the cache holds a complete consistent list. Changes that
    /// come meanwhile are dropped: the `Init` sequence lists their result.
    async fn wait_synced(&mut self) -> Option<()> {
        while !*self.synced.borrow_and_update() {
            tokio::select! {
                changed = self.synced.changed() => changed.ok()?,
                change = self.changes.recv() => {
                    change?;
                }
            }
        }
        Some(())
    }

    /// Queues `Init`, the cache's objects, `InitDone`, then the reads of the
    /// deletion candidates among them. The channel is emptied while the
    /// cache is locked for reading: every change waiting in it is already in
    /// the cache, and whatever comes later is at least as new as the copy
    /// listed here.
    fn announce(&mut self) {
        let mut pending = VecDeque::from([Pending::Ready(Event::Init)]);
        let candidates: Vec<Arc<Whole<K>>> = {
            let cache = self.store.read();
            while self.changes.try_recv().is_ok() {}
            pending.extend(
                cache
                    .iter()
                    .map(|obj| Pending::Ready(Event::InitApply(obj.0.clone()))),
            );
            cache
                .tombstones()
                .map(|(_, tomb)| Arc::clone(&tomb.last_known))
                .collect()
        };
        pending.extend(
            candidates
                .iter()
                .map(|obj| Pending::Ready(Event::InitApply(obj.0.clone()))),
        );
        pending.push_back(Pending::Ready(Event::InitDone));
        pending.extend(candidates.into_iter().map(Pending::Confirm));
        self.pending = pending;
        self.announced = true;
    }

    /// Reads deletion candidate `last` from etcd: `Delete` if that
    /// incarnation is gone, `Apply` if the read brought it back, `None` if
    /// the cache has moved on (a change in the channel says how).
    async fn confirm(&mut self, last: Arc<Whole<K>>) -> Option<Event<K>> {
        let key = last.key();
        let mut pause = FIRST_READ_RETRY;
        loop {
            {
                let cache = self.store.read();
                if cache.get(&key).is_some() {
                    return None;
                }
                let still_candidate = cache
                    .tombstone(&key)
                    .is_some_and(|tomb| tomb.last_known.uid() == last.uid());
                if !still_candidate {
                    // Confirmed by someone else meanwhile.
                    return Some(Event::Delete(last.0.clone()));
                }
            }
            let stamp = self.store.read_stamp();
            match live::get::<K>(&self.client, &self.dyntype, &key).await {
                Ok(LiveRead::Gone) => {
                    self.store
                        .confirm_deleted(&key, last.uid(), Confirmation::LiveRead);
                    return Some(Event::Delete(last.0.clone()));
                }
                Ok(LiveRead::Found(obj)) => {
                    return match self.store.restore(Whole(obj), &stamp).outcome {
                        Outcome::Applied(Change::Added(obj) | Change::Updated { new: obj, .. }) => {
                            Some(Event::Apply(obj.0.clone()))
                        }
                        Outcome::Applied(Change::DeletionCandidate(_))
                        | Outcome::Stale(_)
                        | Outcome::Unchanged => None,
                    };
                }
                Err(err) => {
                    warn!(object = %key, error = %err, ?pause, "could not read a deletion candidate; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_READ_RETRY);
                }
            }
        }
    }
}

fn translate<K: Clone>(change: Change<Whole<K>>) -> Pending<K> {
    match change {
        Change::Added(obj) | Change::Updated { new: obj, .. } => {
            Pending::Ready(Event::Apply(obj.0.clone()))
        }
        Change::DeletionCandidate(last) => Pending::Confirm(last),
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
