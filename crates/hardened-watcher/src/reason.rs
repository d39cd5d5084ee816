//! [`RestartReason`]: why a watcher listed or watched again, a bounded set
//! for metric labels.

/// Why a list or watch was restarted. Bounded, for metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RestartReason {
    /// 410 Gone / Expired at watch start or mid-stream: RV compacted.
    Expired,
    /// ERROR event 500 (e.g. "etcd event received with PrevKv=nil").
    WatchError500,
    /// Any other ERROR event in the stream.
    OtherWatchError,
    /// The server closed the watch (its timeout): resume.
    StreamEnded,
    /// Connection failed or broke: backoff, then resume.
    ConnectError,
    /// A non-410 HTTP error when starting the watch.
    WatchRejected,
    /// A LIST page failed (not 410).
    ListError,
    /// A continue token expired mid-list: start the list over.
    ContinueExpired,
    /// The periodic resync asked for a consistent relist.
    Resync,
    /// A consistent list showed the store rewound: relist from it.
    StoreRewound,
    /// A live read was older than what the cache knew: relist to find out
    /// whether the store was rewound.
    RewindSuspected,
}

impl RestartReason {
    /// Every variant (add new ones here too): the metrics export each at 0 from start-up.
    pub const ALL: &[Self] = &[
        Self::Expired,
        Self::WatchError500,
        Self::OtherWatchError,
        Self::StreamEnded,
        Self::ConnectError,
        Self::WatchRejected,
        Self::ListError,
        Self::ContinueExpired,
        Self::Resync,
        Self::StoreRewound,
        Self::RewindSuspected,
    ];

    /// The bounded label value of `watch_restarts_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::WatchError500 => "watch_error_500",
            Self::OtherWatchError => "watch_error_other",
            Self::StreamEnded => "stream_ended",
            Self::ConnectError => "connect_error",
            Self::WatchRejected => "watch_rejected",
            Self::ListError => "list_error",
            Self::ContinueExpired => "continue_expired",
            Self::Resync => "resync",
            Self::StoreRewound => "store_rewound",
            Self::RewindSuspected => "rewind_suspected",
        }
    }

    /// Whether this restart needs a fresh consistent list.
    pub fn relists(&self) -> bool {
        !matches!(self, Self::StreamEnded | Self::ConnectError)
    }
}
