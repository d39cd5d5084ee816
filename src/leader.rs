//! Leader election on a `coordination.k8s.io` Lease, so that of several replicas
//! only one writes Endpoints.
//!
//! [`kube_lease_manager`] acquires and renews the Lease. On its own it learns that
//! the Lease is lost only when its next renewal fails or finds another holder, and
//! while the API cannot be reached it keeps reporting the last state it saw. So a
//! watchdog here follows the Lease while the manager says this instance leads, and
//! grants writes only while both hold:
//!
//! - the manager says this instance leads, and
//! - the newest Lease seen names this instance as holder and its `renewTime +
//!   leaseDurationSeconds - grace/2` has not passed on the local clock.
//!
//! The second condition ends leadership at a deadline computed from our own last
//! successful renewal, without waiting for any API answer: an instance cut off
//! from the API stops writing `grace/2` before any other replica may take the
//! Lease (others wait for `renewTime + leaseDurationSeconds` by their own clock,
//! so up to `grace/2` of clock skew is tolerated).
//!
//! The watchdog learns of renewals and of a Lease taken by someone else from a
//! watch on the one Lease, which costs the API server an event per renewal. A
//! watch can lag or stall, so when a renewal is due and the watch has not shown
//! it, the watchdog reads the Lease itself (a quorum read) every
//! [`Settings::poll_interval`] until it sees one or the validity runs out.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::error::Result;
use crate::metrics::Metrics;
use crate::shutdown::stopped;

/// Where the Lease lives and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// Whole seconds, at least 2.
    pub lease_duration: Duration,
    /// Whole seconds, at least 1 and shorter than `lease_duration`.
    pub renew_grace: Duration,
}

impl Settings {
    /// Where and how to hold the Lease: in `namespace` (`None` or empty:
    /// $POD_NAMESPACE, else the service account's, else "default"), as this
    /// process's identity.
    pub fn new(
        namespace: Option<&str>,
        lease_name: &str,
        lease_duration: Duration,
        renew_grace: Duration,
    ) -> Self {
        Self {
            namespace: namespace
                .filter(|ns| !ns.is_empty())
                .map_or_else(default_namespace, str::to_owned),
            lease_name: lease_name.to_owned(),
            identity: identity(),
            lease_duration,
            renew_grace,
        }
    }

    /// How often the watchdog reads the Lease while a renewal it expects has
    /// not shown: a quarter of the grace, between 100 ms and 1 s, so a renewal
    /// is seen well before the validity it extends runs out.
    pub fn poll_interval(&self) -> Duration {
        (self.renew_grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

/// `$POD_NAMESPACE`, else the in-cluster service account's namespace, else "default".
fn default_namespace() -> String {
    if let Some(ns) = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
    {
        return ns;
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// `$POD_NAME` (unique among a Deployment's pods), else the host name with a
/// random suffix, so two processes on one host never share an identity.
pub fn identity() -> String {
    if let Some(name) = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()) {
        return name;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "endpoints-guard".to_string());
    // RandomState is seeded randomly per process: enough for a suffix.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{host}-{:08x}", hasher.finish() as u32)
}

/// What one read of the Lease showed, seen from this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Held by this instance; writes are safe until `valid_until` (local clock).
    Ours { valid_until: SystemTime },
    /// Held by another instance, or by nobody.
    NotOurs,
}

/// Reads a Lease object as [`Observed`] for `identity`.
pub fn observe(lease: &Lease, identity: &str, grace: Duration) -> Observed {
    let Some(spec) = &lease.spec else {
        return Observed::NotOurs;
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return Observed::NotOurs;
    }
    let (Some(renew), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return Observed::NotOurs;
    };
    let Ok(seconds) = u64::try_from(seconds) else {
        return Observed::NotOurs;
    };
    let renewed: SystemTime = renew.0.into();
    match renewed
        .checked_add(Duration::from_secs(seconds))
        .and_then(|t| t.checked_sub(grace / 2))
    {
        Some(valid_until) => Observed::Ours { valid_until },
        None => Observed::NotOurs,
    }
}

/// The newest of the watchdog's observations, by the Lease's resourceVersion:
/// a watch that lags behind a read must not bring back an older Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    pub observed: Observed,
    version: Option<u64>,
}

impl Latest {
    pub const NOTHING: Self = Self {
        observed: Observed::NotOurs,
        version: None,
    };

    /// Takes `observed`, seen at `version`, unless an older Lease than the one
    /// known. A version that is not a number is taken as new (and forgets the
    /// known one).
    pub fn update(&mut self, observed: Observed, version: Option<&str>) {
        let version = version.and_then(|v| v.parse::<u64>().ok());
        if let (Some(known), Some(seen)) = (self.version, version)
            && seen < known
        {
            return;
        }
        *self = Self { observed, version };
    }
}

/// How long from `now` until the watchdog reads the Lease itself: a poll
/// interval after the renewal the manager should have made by now (it renews
/// `grace` before expiry, which is `grace/2` before the validity ends), and a
/// poll interval apart while it has not shown. Not ours yet (the manager has
/// just acquired it): every poll interval.
pub fn read_due(observed: Observed, now: SystemTime, s: &Settings) -> Duration {
    let poll = s.poll_interval();
    let Observed::Ours { valid_until } = observed else {
        return poll;
    };
    valid_until
        .checked_sub(s.renew_grace / 2)
        .and_then(|renewal| renewal.checked_add(poll))
        .and_then(|due| due.duration_since(now).ok())
        .map_or(poll, |wait| wait.max(poll))
}

/// Whether this instance may write now.
pub fn leading(manager_says: bool, observed: Observed, now: SystemTime) -> bool {
    manager_says && matches!(observed, Observed::Ours { valid_until } if now < valid_until)
}

/// Leadership of this instance: a receiver that is `true` while it may write.
pub struct Leadership {
    rx: watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
}

impl Leadership {
    /// Without leader election: always leading.
    pub fn always() -> Self {
        let (_tx, rx) = watch::channel(true);
        Self { rx, task: None }
    }

    /// Starts electing (in the background; the receiver is `false` until the
    /// Lease is held) with `settings`, else (`None`) [`Leadership::always`].
    pub fn start(
        settings: Option<Settings>,
        client: &Client,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self> {
        let Some(settings) = settings else {
            metrics.leader.set(1);
            return Ok(Self::always());
        };
        info!(
            identity = %settings.identity,
            namespace = %settings.namespace,
            lease = %settings.lease_name,
            duration = ?settings.lease_duration,
            "leader election on; writing nothing until the Lease is held"
        );
        metrics.leader.set(0);
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(elect(client.clone(), settings, metrics, tx, shutdown));
        Ok(Self {
            rx,
            task: Some(task),
        })
    }

    /// Whether leadership is elected (`--leader-elect`) rather than constant.
    pub fn elected(&self) -> bool {
        self.task.is_some()
    }

    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits (up to 10 s) for the elector to release the Lease after shutdown.
    pub async fn stopped(self) {
        if let Some(task) = self.task
            && tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
        {
            warn!("leader election did not stop within 10s");
        }
    }
}

fn publish(tx: &watch::Sender<bool>, metrics: &Metrics, identity: &str, now_leading: bool) {
    let changed = tx.send_if_modified(|leading| {
        let changed = *leading != now_leading;
        *leading = now_leading;
        changed
    });
    metrics.leader.set(i64::from(now_leading));
    if changed && now_leading {
        info!(%identity, "acquired the leader Lease; writing");
    } else if changed {
        warn!(%identity, "not the leader any more; writes stopped");
    }
}

async fn build(client: &Client, s: &Settings) -> kube_lease_manager::Result<LeaseManager> {
    LeaseManagerBuilder::new(client.clone(), &s.lease_name)
        .with_namespace(&s.namespace)
        .with_identity(&s.identity)
        .with_duration(s.lease_duration.as_secs())
        .with_grace(s.renew_grace.as_secs())
        .build()
        .await
}

async fn elect(
    client: Client,
    s: Settings,
    metrics: Arc<Metrics>,
    tx: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    let mut backoff = Duration::from_millis(500);
    'manager: loop {
        let manager = tokio::select! {
            _ = stopped(&mut shutdown) => break 'manager,
            built = build(&client, &s) => built,
        };
        let manager = match manager {
            Ok(m) => m,
            Err(err) => {
                warn!(error = %err, lease = %s.lease_name, namespace = %s.namespace, "cannot set up the leader Lease; retrying");
                tokio::select! {
                    _ = stopped(&mut shutdown) => break 'manager,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(15));
                continue;
            }
        };
        backoff = Duration::from_millis(500);
        let (mut says, task) = manager.watch().await;
        let mut latest = Latest::NOTHING;
        let mut lease_watch: Option<LeaseWatch> = None;
        loop {
            let now = SystemTime::now();
            let manager_says = *says.borrow_and_update();
            let lead = leading(manager_says, latest.observed, now);
            publish(&tx, &metrics, &s.identity, lead);
            // A follower follows nothing: what it saw could grant nothing (the
            // manager must say it leads too), and it reads once whenever the
            // manager's word changes.
            if !manager_says {
                lease_watch = None;
            } else if lease_watch.is_none() {
                lease_watch = Some(watch_lease(&leases, &s.lease_name));
            }
            // While leading, wake exactly when validity runs out.
            let expires_in = match latest.observed {
                Observed::Ours { valid_until } if lead => {
                    valid_until.duration_since(now).unwrap_or(Duration::ZERO)
                }
                _ => Duration::from_secs(3600),
            };
            let read_in = read_due(latest.observed, now, &s);
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => {
                    publish(&tx, &metrics, &s.identity, false);
                    // Dropping the receiver makes the manager release the Lease.
                    drop(says);
                    match tokio::time::timeout(Duration::from_secs(5), task).await {
                        Ok(Ok(Ok(_))) => info!("released the leader Lease"),
                        Ok(Ok(Err(err))) => warn!(error = %err, "releasing the leader Lease failed"),
                        Ok(Err(err)) => warn!(error = %err, "lease manager task failed"),
                        Err(_) => warn!("releasing the leader Lease timed out"),
                    }
                    break 'manager;
                }
                _ = tokio::time::sleep(expires_in) => {}
                changed = says.changed() => {
                    if changed.is_err() {
                        publish(&tx, &metrics, &s.identity, false);
                        match task.await {
                            Ok(Err(err)) => error!(error = %err, "lease manager stopped; starting it again"),
                            _ => error!("lease manager stopped; starting it again"),
                        }
                        continue 'manager;
                    }
                    refresh(&leases, &s, &mut latest).await;
                }
                event = next_event(&mut lease_watch) => match event {
                    Some(event) => seen(event, &s, &mut latest),
                    // kube-runtime's watcher does not end; if it did, the
                    // reads go on alone until this instance leads again.
                    None => {
                        warn!("the leader Lease watch ended; reading the Lease instead");
                        lease_watch = Some(futures::stream::pending().boxed());
                    }
                },
                _ = tokio::time::sleep(read_in), if manager_says => {
                    refresh(&leases, &s, &mut latest).await;
                }
            }
        }
    }
    publish(&tx, &metrics, &s.identity, false);
}

/// The watch on the one Lease: kube-runtime's watcher (a list, then a watch,
/// listed again after a 410), backing off after errors. It needs no store and no
/// resync: what it misses, the watchdog's own reads make up.
type LeaseWatch = BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>;

fn watch_lease(leases: &Api<Lease>, name: &str) -> LeaseWatch {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher::watcher(leases.clone(), config)
        .default_backoff()
        .boxed()
}

/// The next event of the Lease watch; never, without one.
async fn next_event(
    lease_watch: &mut Option<LeaseWatch>,
) -> Option<Result<watcher::Event<Lease>, watcher::Error>> {
    match lease_watch {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

/// Takes what the Lease watch showed.
fn seen(event: Result<watcher::Event<Lease>, watcher::Error>, s: &Settings, latest: &mut Latest) {
    match event {
        Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
            take(latest, &lease, s)
        }
        Ok(watcher::Event::Delete(lease)) => {
            latest.update(
                Observed::NotOurs,
                lease.metadata.resource_version.as_deref(),
            );
        }
        Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
        // Backed off (up to 30 s apart); meanwhile the reads
        // cover the renewals, one a renewal instead of none.
        Err(err) => {
            warn!(error = %err, "watching the leader Lease failed; reading it instead")
        }
    }
}

/// Takes a Lease that was watched or read, at its resourceVersion.
fn take(latest: &mut Latest, lease: &Lease, s: &Settings) {
    let observed = observe(lease, &s.identity, s.renew_grace);
    latest.update(observed, lease.metadata.resource_version.as_deref());
}

/// Reads the Lease; on failure keeps what was known, whose validity then runs
/// out by itself. A read may wait up to half the grace (at least 1 s): one
/// queued by the API server's priority and fairness is slow, not lost.
async fn refresh(leases: &Api<Lease>, s: &Settings, latest: &mut Latest) {
    match tokio::time::timeout(
        (s.renew_grace / 2).max(Duration::from_secs(1)),
        leases.get_opt(&s.lease_name),
    )
    .await
    {
        Ok(Ok(Some(lease))) => take(latest, &lease, s),
        // Gone: whatever version it had, nothing newer names us.
        Ok(Ok(None)) => *latest = Latest::NOTHING,
        Ok(Err(err)) => debug!(error = %err, "reading the leader Lease failed"),
        Err(_) => debug!("reading the leader Lease timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed: SystemTime, seconds: i32) -> Lease {
        let renew = k8s_openapi::jiff::Timestamp::try_from(renewed)
            .ok()
            .map(MicroTime);
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renew,
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn validity_ends_half_a_grace_before_expiry() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let grace = Duration::from_secs(4);
        let obs = observe(&lease(Some("me"), t0, 10), "me", grace);
        assert_eq!(
            obs,
            Observed::Ours {
                valid_until: t0 + Duration::from_secs(8)
            }
        );
        assert!(leading(true, obs, t0 + Duration::from_secs(7)));
        assert!(!leading(true, obs, t0 + Duration::from_secs(8)));
        assert!(!leading(false, obs, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn another_holder_or_none_is_not_ours() {
        let now = SystemTime::now();
        let grace = Duration::from_secs(2);
        assert_eq!(
            observe(&lease(Some("other"), now, 15), "me", grace),
            Observed::NotOurs
        );
        assert_eq!(
            observe(&lease(None, now, 15), "me", grace),
            Observed::NotOurs
        );
        assert_eq!(observe(&Lease::default(), "me", grace), Observed::NotOurs);
        assert!(!leading(true, Observed::NotOurs, now));
    }

    fn settings(duration: u64, grace: u64) -> Settings {
        Settings {
            namespace: "ns".into(),
            lease_name: "lease".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(duration),
            renew_grace: Duration::from_secs(grace),
        }
    }

    #[test]
    fn a_read_is_due_a_poll_after_the_expected_renewal_and_a_poll_apart_after() {
        // The chart's defaults: renewals every 5 s, valid 10 s after each.
        let s = settings(15, 10);
        let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let obs = observe(&lease(Some("me"), renewed, 15), "me", s.renew_grace);
        let second = Duration::from_secs(1);
        // Seen right after the renewal: nothing to read until the next one, at
        // +5 s, has had a poll interval to show.
        assert_eq!(read_due(obs, renewed, &s), Duration::from_secs(6));
        assert_eq!(read_due(obs, renewed + 4 * second, &s), 2 * second);
        // Overdue: a poll interval apart, until the validity ends at +10 s.
        assert_eq!(read_due(obs, renewed + 7 * second, &s), s.poll_interval());
        assert_eq!(read_due(Observed::NotOurs, renewed, &s), s.poll_interval());
        // When the watch has missed a renewal, the read that finds it comes
        // with a poll interval to spare before the validity ends.
        let validity = Duration::from_secs(10);
        let due = renewed + read_due(obs, renewed, &s);
        assert!(due < renewed + validity - s.poll_interval());
    }

    #[test]
    fn an_older_lease_does_not_replace_a_newer_one() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let grace = Duration::from_secs(10);
        let old = observe(&lease(Some("me"), t0, 15), "me", grace);
        let new = observe(
            &lease(Some("me"), t0 + Duration::from_secs(5), 15),
            "me",
            grace,
        );
        let mut latest = Latest::NOTHING;
        latest.update(new, Some("120"));
        // A lagging watch delivers the renewal before.
        latest.update(old, Some("99"));
        assert_eq!(latest.observed, new);
        // Someone else's, newer: taken at once.
        latest.update(Observed::NotOurs, Some("121"));
        assert_eq!(latest.observed, Observed::NotOurs);
        latest.update(new, Some("120"));
        assert_eq!(latest.observed, Observed::NotOurs);
        // A version that is no number cannot be ordered: taken.
        latest.update(new, Some("opaque"));
        assert_eq!(latest.observed, new);
        latest.update(old, Some("5"));
        assert_eq!(latest.observed, old);
    }

    #[test]
    fn identities_differ_between_calls_without_pod_name() {
        if std::env::var("POD_NAME").is_ok() {
            return;
        }
        assert_ne!(identity(), identity());
    }
}
