//! Errors of the watcher, and the classification of API failures that decides
//! between relist, resume and backoff.

use thiserror::Error;

/// How a failed LIST/WATCH request failed, as far as the state machine cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 410 Gone / Expired: the RV or continue token was compacted away.
    Expired,
    /// The request never got an HTTP answer (connect, TLS, reset, I/O).
    Connect,
    /// 429 or 5xx as an HTTP status: the server is alive but busy or restarting.
    Transient(u16),
    /// Any other HTTP status (401, 403, 404, ...).
    Rejected(u16),
    /// The response body could not be decoded (a whole list, not one object).
    Decode,
}

impl ApiErrorKind {
    /// Classifies a `kube::Error`.
    pub fn classify(err: &kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => Self::from_status(status.code, &status.reason),
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => Self::Decode,
            // Everything else is a transport-level failure: hyper, tower
            // service, TLS, auth refresh, broken stream.
            _ => Self::Connect,
        }
    }

    /// Classifies an HTTP status code / reason pair.
    pub fn from_status(code: u16, reason: &str) -> Self {
        if code == 410 || reason == "Expired" || reason == "Gone" {
            Self::Expired
        } else if code == 429 || code >= 500 {
            Self::Transient(code)
        } else if code == 0 {
            // A Status without a code did not come from a real API error.
            Self::Decode
        } else {
            Self::Rejected(code)
        }
    }
}

/// Errors of the watch module's entry points. API failures are not among
/// them: the watcher relists, resumes or backs off by itself.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WatchError {
    /// Building a request failed (a programming error, not a server state).
    #[error("building a request for {resource} failed: {source}")]
    Request {
        /// The resource the request was for.
        resource: String,
        #[source]
        /// What went wrong.
        source: kube::core::request::Error,
    },
    /// A second watcher was started on a store that already has one.
    #[error("{resource} already has a watcher")]
    AlreadyWatched {
        /// The resource.
        resource: String,
    },
    /// The watcher of a store is not running (it stopped, or never started).
    #[error("the {resource} watcher is not running")]
    WatcherGone {
        /// The resource.
        resource: String,
    },
}

impl WatchError {
    /// Bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::AlreadyWatched { .. } => "already_watched",
            Self::WatcherGone { .. } => "watcher_gone",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_statuses() {
        assert_eq!(ApiErrorKind::from_status(410, ""), ApiErrorKind::Expired);
        assert_eq!(
            ApiErrorKind::from_status(500, "Expired"),
            ApiErrorKind::Expired
        );
        assert_eq!(
            ApiErrorKind::from_status(500, "InternalError"),
            ApiErrorKind::Transient(500)
        );
        assert_eq!(
            ApiErrorKind::from_status(429, ""),
            ApiErrorKind::Transient(429)
        );
        assert_eq!(
            ApiErrorKind::from_status(403, "Forbidden"),
            ApiErrorKind::Rejected(403)
        );
        assert_eq!(ApiErrorKind::from_status(0, ""), ApiErrorKind::Decode);
    }

    #[test]
    fn metric_labels_are_bounded() {
        let err = WatchError::WatcherGone {
            resource: "pods".to_owned(),
        };
        assert_eq!(err.metric_label(), "watcher_gone");
    }
}
