//! The client-side limit of API requests (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket in front of the kube client's HTTP
//! stack, as client-go's. The client serves every request through one buffer
//! worker, which waits in [`RateLimit::poll_ready`] until a token is there.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refilled at `qps` a second, at most `burst` held.
#[derive(Debug, Clone)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket. `qps` must be above 0 (0 means no layer at all).
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// Wraps a service in a [`RateLimit`].
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// `None` for `qps` 0 (or anything not above 0): no limit.
    pub fn new(qps: f64, burst: u32) -> Option<Self> {
        (qps > 0.0 && qps.is_finite()).then_some(Self { qps, burst })
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: Bucket::new(self.qps, self.burst, Instant::now()),
            token: false,
            sleep: None,
        }
    }
}

/// A service that is ready only while the bucket has a token for the next
/// request (held from `poll_ready` to `call`).
pub struct RateLimit<S> {
    inner: S,
    bucket: Bucket,
    token: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::{Ready, ready};

    /// Answers at once with the time of the call.
    struct Clock;

    impl Service<()> for Clock {
        type Response = Instant;
        type Error = Infallible;
        type Future = Ready<Result<Instant, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, (): ()) -> Self::Future {
            ready(Ok(Instant::now()))
        }
    }

    async fn send(svc: &mut RateLimit<Clock>) -> Duration {
        let start = Instant::now();
        std::future::poll_fn(|cx| svc.poll_ready(cx))
            .await
            .unwrap_or_else(|never| match never {});
        let at = svc.call(()).await.unwrap_or_else(|never| match never {});
        at - start
    }

    /// The bucket alone, on a clock of its own.
    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut bucket = Bucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(bucket.take(t0), Ok(()), "within the burst");
        }
        let wait = bucket.take(t0).expect_err("the burst is spent");
        assert!(
            wait.abs_diff(Duration::from_millis(100)) < Duration::from_micros(10),
            "{wait:?}"
        );
        assert_eq!(bucket.take(at(100)), Ok(()), "one token per 100 ms");
        assert!(bucket.take(at(150)).is_err());
        assert_eq!(bucket.take(at(200)), Ok(()));
        // An idle second refills the burst, no more.
        for _ in 0..3 {
            assert_eq!(bucket.take(at(1200)), Ok(()));
        }
        assert!(bucket.take(at(1200)).is_err());
    }

    /// The service waits in poll_ready for a token: 2 at once, then one per
    /// 20 ms (50 a second), on the real clock.
    #[tokio::test]
    async fn the_service_holds_requests_back() {
        let layer = RateLimitLayer::new(50.0, 2).expect("qps above 0");
        let mut svc = layer.layer(Clock);
        let start = Instant::now();
        for _ in 0..2 {
            send(&mut svc).await;
        }
        assert!(
            start.elapsed() < Duration::from_millis(15),
            "the burst waited"
        );
        for _ in 0..5 {
            send(&mut svc).await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(95),
            "5 requests past the burst at 50/s took {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn zero_qps_is_no_limit() {
        assert!(RateLimitLayer::new(0.0, 30).is_none());
        assert!(RateLimitLayer::new(0.5, 30).is_some());
    }
}
