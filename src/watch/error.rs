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

/// Errors returned by the watch module's async entry points.
#[derive(Debug, Error)]
pub enum WatchError {
    /// A LIST request failed.
    #[error("list of {resource} failed: {source}")]
    List {
        resource: &'static str,
        kind: ApiErrorKind,
        #[source]
        source: kube::Error,
    },
    /// A paginated LIST kept expiring mid-way.
    #[error("list of {resource}: continue token expired {attempts} times in a row")]
    ContinueExpired {
        resource: &'static str,
        attempts: u32,
    },
    /// A LIST response had no resourceVersion, so no watch could start from it.
    #[error("list of {resource} returned no resourceVersion")]
    MissingListResourceVersion { resource: &'static str },
    /// Building a request failed (a programming error, not a server state).
    #[error("building a request for {resource} failed: {source}")]
    Request {
        resource: &'static str,
        #[source]
        source: kube::core::request::Error,
    },
    /// A strict list contained objects that could not be decoded.
    #[error("list of {resource}: {count} objects could not be decoded")]
    Undecodable {
        resource: &'static str,
        count: usize,
    },
    /// The change receiver was dropped: nobody consumes the watcher's output.
    #[error("the change receiver for {resource} was dropped")]
    ReceiverGone { resource: &'static str },
}

impl WatchError {
    /// Bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::List { kind, .. } => match kind {
                ApiErrorKind::Expired => "list_expired",
                ApiErrorKind::Connect => "list_connect",
                ApiErrorKind::Transient(_) => "list_transient",
                ApiErrorKind::Rejected(_) => "list_rejected",
                ApiErrorKind::Decode => "list_decode",
            },
            Self::ContinueExpired { .. } => "continue_expired",
            Self::MissingListResourceVersion { .. } => "missing_list_rv",
            Self::Undecodable { .. } => "undecodable",
            Self::Request { .. } => "request",
            Self::ReceiverGone { .. } => "receiver_gone",
        }
    }

    /// The API failure class, where the error came from the API.
    pub fn api_kind(&self) -> Option<ApiErrorKind> {
        match self {
            Self::List { kind, .. } => Some(*kind),
            Self::ContinueExpired { .. } => Some(ApiErrorKind::Expired),
            Self::MissingListResourceVersion { .. } | Self::Undecodable { .. } => {
                Some(ApiErrorKind::Decode)
            }
            Self::Request { .. } | Self::ReceiverGone { .. } => None,
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
        let err = WatchError::ContinueExpired {
            resource: "pods",
            attempts: 3,
        };
        assert_eq!(err.metric_label(), "continue_expired");
        assert_eq!(err.api_kind(), Some(ApiErrorKind::Expired));
    }
}
