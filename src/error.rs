//! The library's one error type. Every variant maps to a bounded metric label.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// A call to the Kubernetes API failed (transport, decode or an API status).
    #[error("kubernetes API call failed while {action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },

    /// A write lost a race with another writer (HTTP 409); retried from fresh state.
    #[error(
        "conflict while {action} {key}: the object changed underneath; retrying from fresh state"
    )]
    Conflict { action: &'static str, key: String },

    /// A list or watch failed (the watcher retries by itself; a resync waits
    /// for its next interval).
    #[error(transparent)]
    Watch(#[from] hardened_watcher::WatchError),

    /// An object kept in a cache as JSON did not decode again.
    #[error("decoding {what} {key}: {source}")]
    Decode {
        what: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },

    /// Pods selected by a Service are on Nodes that neither the cache nor a
    /// live read knows: their endpoints are left out of the slices (as
    /// upstream does) and the Service is retried with backoff.
    #[error(
        "{pods} pod(s) of Service {service} are on unknown Nodes; left out of its EndpointSlices for now"
    )]
    UnknownNodes { service: String, pods: usize },

    /// Configuration that cannot work (bad flag value, bad kubeconfig).
    #[error("configuration: {0}")]
    Config(String),

    /// The metrics/health server could not start.
    #[error("metrics server on {addr}: {source}")]
    Server {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Every value [`Error::metric_label`] returns (add new ones here too): the
    /// metrics export each at 0 from start-up.
    pub const METRIC_LABELS: &[&str] = &[
        "forbidden",
        "not_found",
        "conflict",
        "gone",
        "invalid",
        "throttled",
        "server_error",
        "api_other",
        "decode",
        "transport",
        "watch",
        "unknown_nodes",
        "config",
        "server",
    ];

    /// A label for `endpoints_guard_reconcile_errors_total{error=...}`: one of a fixed set.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(status) => match status.code {
                    403 => "forbidden",
                    404 => "not_found",
                    409 => "conflict",
                    410 => "gone",
                    422 => "invalid",
                    429 => "throttled",
                    500..=599 => "server_error",
                    _ => "api_other",
                },
                kube::Error::SerdeError(_) => "decode",
                _ => "transport",
            },
            Error::Conflict { .. } => "conflict",
            Error::Watch(_) => "watch",
            Error::UnknownNodes { .. } => "unknown_nodes",
            Error::Decode { .. } => "decode",
            Error::Config(_) => "config",
            Error::Server { .. } => "server",
        }
    }

    /// Wraps a kube error, turning a 409 into [`Error::Conflict`].
    pub fn kube(action: &'static str, key: impl Into<String>, source: kube::Error) -> Self {
        match &source {
            kube::Error::Api(status) if status.code == 409 => Error::Conflict {
                action,
                key: key.into(),
            },
            _ => Error::Kube { action, source },
        }
    }
}

/// The HTTP status code of an API error, if the error is one.
pub fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn conflict_becomes_its_own_variant() {
        let err = Error::kube("updating endpoints", "ns/a", api_error(409));
        assert!(matches!(err, Error::Conflict { .. }));
        assert_eq!(err.metric_label(), "conflict");
    }

    #[test]
    fn labels_are_bounded_by_status_class() {
        assert_eq!(
            Error::kube("x", "k", api_error(403)).metric_label(),
            "forbidden"
        );
        assert_eq!(
            Error::kube("x", "k", api_error(503)).metric_label(),
            "server_error"
        );
        assert_eq!(
            Error::kube("x", "k", api_error(418)).metric_label(),
            "api_other"
        );
    }

    #[test]
    fn every_label_is_listed_once() {
        let json = || serde_json::from_str::<u8>("x").expect_err("not a number");
        let mut errors: Vec<Error> = [403, 404, 409, 410, 422, 429, 500, 503, 418]
            .into_iter()
            .map(|code| Error::kube("x", "k", api_error(code)))
            .collect();
        errors.extend([
            Error::Kube {
                action: "x",
                source: kube::Error::SerdeError(json()),
            },
            Error::Kube {
                action: "x",
                source: kube::Error::TlsRequired,
            },
            Error::Watch(hardened_watcher::WatchError::WatcherGone {
                resource: "pods".to_owned(),
            }),
            Error::Decode {
                what: "endpoints",
                key: "k".into(),
                source: json(),
            },
            Error::UnknownNodes {
                service: "ns/a".into(),
                pods: 1,
            },
            Error::Config("x".into()),
            Error::Server {
                addr: "a".into(),
                source: std::io::Error::other("x"),
            },
        ]);
        let produced: std::collections::BTreeSet<_> =
            errors.iter().map(Error::metric_label).collect();
        let listed: std::collections::BTreeSet<_> = Error::METRIC_LABELS.iter().copied().collect();
        assert_eq!(
            listed.len(),
            Error::METRIC_LABELS.len(),
            "a label listed twice"
        );
        assert_eq!(produced, listed);
    }
}
