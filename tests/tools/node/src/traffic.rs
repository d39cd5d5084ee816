//! Traffic through a Service as the judge: a bounded client that sends
//! requests to a ClusterIP at a fixed rate, and a watch of the Service's
//! pods and EndpointSlices (read from kube-apiserver directly, not through
//! any proxy) that says, for each failed request, whether the endpoints
//! kube-proxy was given were wrong at that moment.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// How long one request may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// One request's outcome.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub ok: bool,
    pub detail: String,
}

/// A running client: `rate` requests a second to `target` until
/// [`Traffic::finish`], and never more than `rate × max` requests; each
/// runs on its own task so a slow one does not hold the rest back.
pub struct Traffic {
    handle: JoinHandle<Vec<Sample>>,
    stop: Arc<AtomicBool>,
}

impl Traffic {
    pub fn start(target: SocketAddr, rate: u32, max: Duration) -> Self {
        let count = (u64::from(rate) * max.as_millis() as u64 / 1000).max(1);
        let gap = Duration::from_secs(1) / rate.max(1);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = tokio::spawn(async move {
            let mut requests = Vec::with_capacity(count as usize);
            let mut tick = tokio::time::interval(gap);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for _ in 0..count {
                tick.tick().await;
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let at = Instant::now();
                requests.push(tokio::spawn(async move {
                    let (ok, detail) =
                        match tokio::time::timeout(REQUEST_TIMEOUT, get(target)).await {
                            Ok(Ok(served_by)) => (true, served_by),
                            Ok(Err(err)) => (false, err),
                            Err(_) => (false, "timed out".to_string()),
                        };
                    Sample { at, ok, detail }
                }));
            }
            let mut samples = Vec::with_capacity(requests.len());
            for request in requests {
                if let Ok(sample) = request.await {
                    samples.push(sample);
                }
            }
            samples
        });
        Self { handle, stop }
    }

    /// Stops sending, waits for the requests in flight and returns every
    /// outcome in send order.
    pub async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.await.unwrap_or_default()
    }
}

/// Waits until `target` answered `count` requests in a row (kube-proxy has
/// programmed the Service), at most `timeout`.
pub async fn wait_serving(
    target: SocketAddr,
    count: usize,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut in_a_row = 0;
    let mut last = String::new();
    while in_a_row < count {
        if Instant::now() > deadline {
            return Err(format!(
                "{target} did not answer {count} requests in a row within {timeout:?} (last: {last})"
            ));
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, get(target)).await {
            Ok(Ok(_)) => in_a_row += 1,
            Ok(Err(err)) => {
                in_a_row = 0;
                last = err;
            }
            Err(_) => {
                in_a_row = 0;
                last = "timed out".to_string();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One `GET /` over a new connection; the body names the pod that served it.
async fn get(target: SocketAddr) -> Result<String, String> {
    let mut stream = TcpStream::connect(target)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: e2e\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    if !(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200")) {
        return Err(format!(
            "answer: {}",
            text.lines().next().unwrap_or("(empty)")
        ));
    }
    Ok(text.lines().last().unwrap_or_default().trim().to_string())
}

/// What kube-proxy was given and what was true, at one moment.
#[derive(Debug, Clone)]
pub struct Moment {
    pub at: Instant,
    /// Ready addresses in the Service's EndpointSlices.
    pub published: BTreeSet<String>,
    /// Addresses of the selected pods that are Ready and not being deleted.
    pub live: BTreeSet<String>,
}

/// Watches one Service's pods (by label selector) and EndpointSlices and
/// records a [`Moment`] every 100 ms.
pub struct ServiceWatch {
    moments: Arc<Mutex<Vec<Moment>>>,
    /// Every `endpointslice.kubernetes.io/managed-by` value a slice of the
    /// Service has carried since the watch started.
    managers: Arc<Mutex<BTreeSet<String>>>,
    tasks: Vec<JoinHandle<()>>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
}

impl ServiceWatch {
    pub async fn start(client: &Client, namespace: &str, service: &str, selector: &str) -> Self {
        let (pods, pod_writer) = reflector::store();
        let (slices, slice_writer) = reflector::store();
        let pod_stream = reflector::reflector(
            pod_writer,
            watcher(
                Api::<Pod>::namespaced(client.clone(), namespace),
                watcher::Config::default().labels(selector),
            ),
        )
        .default_backoff()
        .applied_objects();
        let slice_stream = reflector::reflector(
            slice_writer,
            watcher(
                Api::<EndpointSlice>::namespaced(client.clone(), namespace),
                watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}")),
            ),
        )
        .default_backoff()
        .applied_objects();
        let moments = Arc::new(Mutex::new(Vec::new()));
        let managers = Arc::new(Mutex::new(BTreeSet::new()));
        // A moment after every event (a transient state kube-proxy may act
        // on is caught however short), and every 100 ms besides.
        // Nothing is recorded until both stores hold their first list: a
        // half-filled store is not a state anybody published.
        let listed = Arc::new(AtomicBool::new(false));
        let record = {
            let (pods, slices, moments) = (pods.clone(), slices.clone(), moments.clone());
            let (listed, managers) = (listed.clone(), managers.clone());
            move || {
                if !listed.load(Ordering::Relaxed) {
                    return;
                }
                let slices = slices.state();
                if let Ok(mut seen) = managers.lock() {
                    seen.extend(slices.iter().filter_map(|s| {
                        s.metadata
                            .labels
                            .as_ref()?
                            .get("endpointslice.kubernetes.io/managed-by")
                            .cloned()
                    }));
                }
                let moment = Moment {
                    at: Instant::now(),
                    published: published(&slices),
                    live: live(&pods.state()),
                };
                if let Ok(mut all) = moments.lock() {
                    all.push(moment);
                }
            }
        };
        let on_tick = record.clone();
        let mut tasks = vec![
            on_each_event(pod_stream, record.clone()),
            on_each_event(slice_stream, record),
        ];
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            let _ = pods.wait_until_ready().await;
            let _ = slices.wait_until_ready().await;
        })
        .await;
        listed.store(true, Ordering::Relaxed);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                on_tick();
            }
        }));
        Self {
            moments,
            managers,
            tasks,
            pods,
            slices,
        }
    }

    /// Every managed-by value a slice of the Service carried since the
    /// watch started.
    pub fn managers_seen(&self) -> BTreeSet<String> {
        self.managers.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// The Service's slices now.
    pub fn slices(&self) -> Vec<Arc<EndpointSlice>> {
        self.slices.state()
    }

    /// The moments recorded so far.
    pub fn moments(&self) -> Vec<Moment> {
        self.moments.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Now: ready addresses published, and live ready pod addresses.
    pub fn now(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        (published(&self.slices.state()), live(&self.pods.state()))
    }

    /// The pods seen now.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }
}

impl Drop for ServiceWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Drives a watch `stream` on a task of its own, calling `record` after
/// each event.
fn on_each_event<S>(stream: S, record: impl Fn() + Send + 'static) -> JoinHandle<()>
where
    S: futures::Stream + Send + 'static,
{
    tokio::spawn(stream.for_each(move |_| {
        record();
        async {}
    }))
}

fn published(slices: &[Arc<EndpointSlice>]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}

fn live(pods: &[Arc<Pod>]) -> BTreeSet<String> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref())
        .filter(|s| {
            s.conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|s| s.pod_ip.clone())
        .collect()
}

/// The judgement of one scenario's traffic.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Verdict {
    pub sent: usize,
    /// Failed while the published endpoints were wrong (see [`judge`]).
    pub failed_wrong_endpoints: usize,
    /// Failed while the published endpoints matched the pods (a pod that
    /// died before its probe noticed, kube-proxy catching up).
    pub failed_other: usize,
    /// The longest run of consecutive failed requests, first to last, in
    /// seconds (one request's gap for a single failure).
    pub longest_streak_s: f64,
    /// A few failures with what was wrong, for the report.
    pub examples: Vec<String>,
    /// A few of the other failures, with what the client saw.
    pub other_examples: Vec<String>,
}

/// Judges `samples` against `moments`: a failed request was caused by wrong
/// endpoints when the published set was wrong at some moment in the `grace`
/// before it (kube-proxy may still be applying a state that has since been
/// corrected). The published set is wrong at a moment when it holds an
/// address that was not a live ready pod at any time in the `grace` before
/// that moment, or is empty while live ready pods existed throughout it.
/// The grace covers what no controller can avoid: the time from a pod's
/// change to its slice, and from the slice to kube-proxy's rules.
pub fn judge(samples: &[Sample], moments: &[Moment], grace: Duration, gap: Duration) -> Verdict {
    let mut verdict = Verdict {
        sent: samples.len(),
        ..Verdict::default()
    };
    let (mut streak_start, mut streak_last): (Option<Instant>, Option<Instant>) = (None, None);
    let mut longest = Duration::ZERO;
    for sample in samples {
        if sample.ok {
            if let (Some(start), Some(last)) = (streak_start.take(), streak_last.take()) {
                longest = longest.max(last - start + gap);
            }
            continue;
        }
        streak_start.get_or_insert(sample.at);
        streak_last = Some(sample.at);
        match wrong_at(moments, sample.at, grace) {
            Some(why) => {
                verdict.failed_wrong_endpoints += 1;
                if verdict.examples.len() < 3 {
                    verdict.examples.push(format!("{} ({why})", sample.detail));
                }
            }
            None => {
                verdict.failed_other += 1;
                if verdict.other_examples.len() < 3 {
                    verdict.other_examples.push(sample.detail.clone());
                }
            }
        }
    }
    if let (Some(start), Some(last)) = (streak_start, streak_last) {
        longest = longest.max(last - start + gap);
    }
    verdict.longest_streak_s = (longest.as_secs_f64() * 100.0).round() / 100.0;
    verdict
}

/// Every moment from `from` on whose published set was wrong by
/// [`judge`]'s rule, with why: the judge where no traffic flows (a control
/// plane without a node), as if a request had been sent at each moment.
pub fn wrong_moments(moments: &[Moment], grace: Duration, from: Instant) -> Vec<String> {
    let first = moments.partition_point(|m| m.at < from);
    (first..moments.len())
        .filter_map(|index| wrong_state(moments, index, grace))
        .collect()
}

fn wrong_at(moments: &[Moment], at: Instant, grace: Duration) -> Option<String> {
    let first = moments.partition_point(|m| m.at + grace < at);
    let last = moments.partition_point(|m| m.at <= at);
    moments[first..last]
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, m)| {
            wrong_state(moments, first + i, grace).map(|why| {
                let ago = at.saturating_duration_since(m.at).as_secs_f64();
                format!("{why}, {ago:.2} s before")
            })
        })
}

/// Whether `moments[index]` published something wrong (see [`judge`]).
fn wrong_state(moments: &[Moment], index: usize, grace: Duration) -> Option<String> {
    let now = &moments[index];
    let first = moments.partition_point(|m| m.at + grace < now.at);
    let window = &moments[first..=index];
    let stale: Vec<&String> = now
        .published
        .iter()
        .filter(|ip| window.iter().all(|m| !m.live.contains(*ip)))
        .collect();
    if !stale.is_empty() {
        return Some(format!(
            "published {stale:?}, not a live ready pod for {grace:?}"
        ));
    }
    if now.published.is_empty() && window.iter().all(|m| !m.live.is_empty()) {
        return Some(format!(
            "nothing published while {} pods were ready",
            now.live.len()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ips: &[&str]) -> BTreeSet<String> {
        ips.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn moments_are_wrong_past_the_grace_only() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // b dies at 1 s and stays published; at 3 s nothing is published.
        let moments: Vec<Moment> = (0..50)
            .map(|i| Moment {
                at: ms(i * 100),
                published: match i {
                    30 => set(&[]),
                    _ => set(&["a", "b"]),
                },
                live: if i < 10 {
                    set(&["a", "b"])
                } else {
                    set(&["a"])
                },
            })
            .collect();
        let wrong = wrong_moments(&moments, Duration::from_secs(2), t0);
        // b is stale from 3 s (1 s + the grace) on, but for the one empty
        // moment, itself wrong: live pods throughout.
        assert_eq!(wrong.len(), 20, "{wrong:?}");
        assert!(wrong.iter().any(|w| w.contains("nothing published")));
        assert!(wrong_moments(&moments[..30], Duration::from_secs(3), t0).is_empty());
        assert!(wrong_moments(&moments, Duration::from_secs(2), ms(5000)).is_empty());
    }

    #[test]
    fn failures_are_blamed_on_endpoints_only_past_the_grace() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // a and b ready; b dies at 1 s (gone from live), stays published.
        let moments: Vec<Moment> = (0..50)
            .map(|i| Moment {
                at: ms(i * 100),
                published: set(&["a", "b"]),
                live: if i < 10 {
                    set(&["a", "b"])
                } else {
                    set(&["a"])
                },
            })
            .collect();
        let fail = |n| Sample {
            at: ms(n),
            ok: false,
            detail: "connect: refused".to_string(),
        };
        let ok = |n| Sample {
            at: ms(n),
            ok: true,
            detail: "a".to_string(),
        };
        let samples = [
            ok(0),
            fail(1500),
            ok(2000),
            fail(4500),
            fail(4550),
            ok(4600),
        ];
        let verdict = judge(
            &samples,
            &moments,
            Duration::from_secs(3),
            Duration::from_millis(50),
        );
        assert_eq!(verdict.sent, 6);
        // 1.5 s: b left 0.5 s ago, within the grace: not the controller's fault.
        assert_eq!(verdict.failed_other, 1);
        // 4.5 s: b has been dead for 3.5 s and is still published.
        assert_eq!(verdict.failed_wrong_endpoints, 2);
        assert_eq!(verdict.longest_streak_s, 0.1);
    }

    #[test]
    fn a_short_wrong_state_is_blamed_for_failures_while_kube_proxy_catches_up() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let moment = |n, published: &[&str]| Moment {
            at: ms(n),
            published: set(published),
            live: set(&["a", "b"]),
        };
        // Published empty for 20 ms at 4 s, then right again.
        let moments = vec![
            moment(0, &["a", "b"]),
            moment(3900, &["a", "b"]),
            moment(4000, &[]),
            moment(4020, &["a", "b"]),
            moment(9000, &["a", "b"]),
        ];
        let fail = |n| Sample {
            at: ms(n),
            ok: false,
            detail: "connect: refused".to_string(),
        };
        let verdict = judge(
            &[fail(4400), fail(8000)],
            &moments,
            Duration::from_secs(3),
            Duration::from_millis(50),
        );
        // 0.4 s after the empty moment: its fault; 4 s after: not.
        assert_eq!(verdict.failed_wrong_endpoints, 1);
        assert_eq!(verdict.failed_other, 1);
    }

    #[test]
    fn an_empty_endpoint_list_with_ready_pods_is_wrong() {
        let t0 = Instant::now();
        let moments: Vec<Moment> = (0..40)
            .map(|i| Moment {
                at: t0 + Duration::from_millis(i * 100),
                published: if i < 5 { set(&["a"]) } else { set(&[]) },
                live: set(&["a"]),
            })
            .collect();
        let samples = [Sample {
            at: t0 + Duration::from_millis(3900),
            ok: false,
            detail: "connect: refused".to_string(),
        }];
        let verdict = judge(
            &samples,
            &moments,
            Duration::from_secs(3),
            Duration::from_millis(50),
        );
        assert_eq!(verdict.failed_wrong_endpoints, 1);
    }
}
