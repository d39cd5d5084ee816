//! Leader election on a `coordination.k8s.io` Lease, so that of several replicas
//! only one writes Endpoints.
//!
//! [`kube_lease_manager`] acquires and renews the Lease. On its own it learns that
//! the Lease is lost only when its next renewal fails or finds another holder, and
//! while the API cannot be reached it keeps reporting the last state it saw. So a
//! watchdog here reads the Lease every [`Settings::poll_interval`] while the
//! manager says this instance leads (and once whenever that changes), and
//! grants writes only while both hold:
//!
//! - the manager says this instance leads, and
//! - the last Lease read names this instance as holder and its `renewTime +
//!   leaseDurationSeconds - grace/2` has not passed on the local clock.
//!
//! The second condition ends leadership at a deadline computed from our own last
//! successful renewal, without waiting for any API answer: an instance cut off
//! from the API stops writing `grace/2` before any other replica may take the
//! Lease (others wait for `renewTime + leaseDurationSeconds` by their own clock,
//! so up to `grace/2` of clock skew is tolerated).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
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

    /// How often the watchdog reads the Lease: a quarter of the grace, between
    /// 100 ms and 1 s, so a renewal is seen well before the validity it extends
    /// runs out.
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
        let mut observed = Observed::NotOurs;
        let mut poll = tokio::time::interval(s.poll_interval());
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now = SystemTime::now();
            let manager_says = *says.borrow_and_update();
            let lead = leading(manager_says, observed, now);
            publish(&tx, &metrics, &s.identity, lead);
            // While leading, wake exactly when validity runs out.
            let expires_in = match observed {
                Observed::Ours { valid_until } if lead => {
                    valid_until.duration_since(now).unwrap_or(Duration::ZERO)
                }
                _ => Duration::from_secs(3600),
            };
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
                    observed = refresh(&leases, &s, observed).await;
                }
                // A follower's reads could grant nothing (the manager must say
                // it leads too) and would cost the API server a read a second
                // per replica: it reads when the manager's word changes.
                _ = poll.tick(), if manager_says => {
                    observed = refresh(&leases, &s, observed).await;
                }
            }
        }
    }
    publish(&tx, &metrics, &s.identity, false);
}

/// Reads the Lease; on failure keeps what was known, whose validity then runs
/// out by itself. A read may wait up to half the grace (at least 1 s): one
/// queued by the API server's priority and fairness is slow, not lost.
async fn refresh(leases: &Api<Lease>, s: &Settings, previous: Observed) -> Observed {
    match tokio::time::timeout(
        (s.renew_grace / 2).max(Duration::from_secs(1)),
        leases.get_opt(&s.lease_name),
    )
    .await
    {
        Ok(Ok(Some(lease))) => observe(&lease, &s.identity, s.renew_grace),
        Ok(Ok(None)) => Observed::NotOurs,
        Ok(Err(err)) => {
            debug!(error = %err, "reading the leader Lease failed");
            previous
        }
        Err(_) => {
            debug!("reading the leader Lease timed out");
            previous
        }
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

    #[test]
    fn identities_differ_between_calls_without_pod_name() {
        if std::env::var("POD_NAME").is_ok() {
            return;
        }
        assert_ne!(identity(), identity());
    }
}
