//! Who may read `/metrics` over HTTPS: the bearer token is authenticated by a
//! TokenReview and the user it names authorized by a SubjectAccessReview
//! (`get` on the non-resource URL `/metrics`), both through the controller's
//! own client, as kube-controller-manager's delegated authentication and
//! authorization do. Answers are cached for [`CACHE_TTL`], so a scrape every
//! few seconds costs the API server two requests per token per TTL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::locks::lock;

/// How long an answer (allowed, forbidden or unauthenticated) is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// The most tokens remembered; beyond it, expired answers are dropped, and if
/// none has expired, all are.
const CACHE_MAX: usize = 1024;
/// The path and verb the SubjectAccessReview asks about.
pub const PATH: &str = "/metrics";
pub const VERB: &str = "get";

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No token, or the TokenReview did not authenticate it: 401.
    Unauthenticated,
    /// Authenticated as this user, who may not get /metrics: 403.
    Forbidden(String),
    /// Authenticated as this user, who may: 200.
    Allowed(String),
}

/// Answers "may this bearer token read /metrics?", with a cache.
pub struct Authorizer {
    client: Client,
    ttl: Duration,
    cache: Mutex<HashMap<String, (Decision, Instant)>>,
}

impl Authorizer {
    /// Answers cached for [`CACHE_TTL`].
    pub fn new(client: Client) -> Self {
        Self::with_ttl(client, CACHE_TTL)
    }

    /// Answers cached for `ttl`.
    pub fn with_ttl(client: Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The decision for the `Authorization` header's value, if any.
    pub async fn decide(&self, authorization: Option<&str>) -> Result<Decision> {
        let Some(token) = authorization.and_then(bearer_token) else {
            return Ok(Decision::Unauthenticated);
        };
        if let Some(cached) = self.cached(token) {
            return Ok(cached);
        }
        let decision = self.review(token).await?;
        self.remember(token, decision.clone());
        Ok(decision)
    }

    fn cached(&self, token: &str) -> Option<Decision> {
        let cache = lock(&self.cache);
        let (decision, at) = cache.get(token)?;
        (at.elapsed() < self.ttl).then(|| decision.clone())
    }

    fn remember(&self, token: &str, decision: Decision) {
        let mut cache = lock(&self.cache);
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, (_, at)| at.elapsed() < self.ttl);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (decision, Instant::now()));
    }

    async fn review(&self, token: &str) -> Result<Decision> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Error::Kube {
                action: "creating a TokenReview for a /metrics request",
                source,
            })?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(Decision::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access_review(user))
            .await
            .map_err(|source| Error::Kube {
                action: "creating a SubjectAccessReview for a /metrics request",
                source,
            })?;
        let allowed = access.status.is_some_and(|s| s.allowed);
        Ok(if allowed {
            Decision::Allowed(name)
        } else {
            Decision::Forbidden(name)
        })
    }
}

/// "May `user` get /metrics?"
pub fn access_review(user: UserInfo) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(PATH.to_string()),
                verb: Some(VERB.to_string()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// The token of `Bearer <token>` (the scheme case-insensitive), if non-empty.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A client whose API server authenticates token `good` and `other` (as
    /// users of the same names) and allows user `good` only; counts requests.
    fn fake_api() -> (Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let calls = counted.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let sent: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let answer = match sent["kind"].as_str() {
                    Some("TokenReview") => {
                        let token = sent["spec"]["token"].as_str().unwrap_or_default();
                        let known = ["good", "other"].contains(&token);
                        serde_json::json!({
                            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": {}, "status": {"authenticated": known, "user": {"username": token}},
                        })
                    }
                    _ => serde_json::json!({
                        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                        "spec": {}, "status": {"allowed": sent["spec"]["user"] == "good"},
                    }),
                };
                let bytes = serde_json::to_vec(&answer).unwrap_or_default();
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    bytes,
                )))
            }
        });
        (Client::new(service, "default"), calls)
    }

    #[tokio::test]
    async fn decisions_and_their_cache() {
        let (client, calls) = fake_api();
        let ttl = Duration::from_millis(300);
        let auth = Authorizer::with_ttl(client, ttl);
        let decide = |header: Option<&'static str>| {
            let auth = &auth;
            async move { auth.decide(header).await.expect("decide") }
        };
        assert_eq!(decide(None).await, Decision::Unauthenticated);
        assert_eq!(decide(Some("Basic x")).await, Decision::Unauthenticated);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no token, no review");
        assert_eq!(
            decide(Some("Bearer good")).await,
            Decision::Allowed("good".into())
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "a TokenReview and a SubjectAccessReview"
        );
        assert_eq!(
            decide(Some("Bearer good")).await,
            Decision::Allowed("good".into())
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2, "answered from the cache");
        assert_eq!(
            decide(Some("Bearer other")).await,
            Decision::Forbidden("other".into())
        );
        assert_eq!(
            decide(Some("Bearer nobody")).await,
            Decision::Unauthenticated
        );
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            decide(Some("Bearer nobody")).await,
            Decision::Unauthenticated
        );
        assert_eq!(calls.load(Ordering::SeqCst), 5, "a refusal is cached too");
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert_eq!(
            decide(Some("Bearer good")).await,
            Decision::Allowed("good".into())
        );
        assert_eq!(calls.load(Ordering::SeqCst), 7, "asked again after the TTL");
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn the_review_asks_for_get_on_metrics_as_the_user() {
        let review = access_review(UserInfo {
            username: Some("system:serviceaccount:monitoring:prometheus".into()),
            uid: Some("u-1".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            extra: None,
        });
        let attrs = review.spec.non_resource_attributes.expect("non-resource");
        assert_eq!(attrs.path.as_deref(), Some("/metrics"));
        assert_eq!(attrs.verb.as_deref(), Some("get"));
        assert_eq!(
            review.spec.user.as_deref(),
            Some("system:serviceaccount:monitoring:prometheus")
        );
        assert!(review.spec.resource_attributes.is_none());
    }
}
