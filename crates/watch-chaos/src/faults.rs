//! The faults watch-chaos can apply to a resource, as set by flags
//! (`--fault services:drop-deletes`) or by the control API
//! (`POST /faults {"resource":"services","fault":"drop-deletes"}`).

use serde::{Deserialize, Serialize};

/// One kind of misbehaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Failure A (pre kubernetes#58547): every DELETED event carries the
    /// object's previous resourceVersion instead of the deletion revision, and
    /// the stream ends right after it (as a watch timeout would), so the client
    /// resumes from that old point and the API server replays history from it.
    OldDeleteRv,
    /// DELETED events are dropped (lost deletes, kubernetes#123072), and so
    /// are the MODIFIED events that set a deletionTimestamp.
    DropDeletes,
    /// Every event is sent twice.
    Duplicate,
    /// Each event is held back and sent after the next one (at most
    /// `hold_ms` later when no next event comes).
    Reorder,
    /// Failure B: a DELETED event is replaced by the watch ERROR that
    /// kube-apiserver sends when etcd's event lacks the previous value
    /// (500, "etcd event received with PrevKv=nil"), and the stream ends.
    PrevkvNil,
    /// Every watch that resumes from a resourceVersion is answered with
    /// ERROR 410 Expired at once, as after a compaction: clients must relist.
    #[serde(rename = "error-410")]
    Error410,
    /// Each watch stream is cut in the middle of an event after `after`
    /// whole events.
    CutMidEvent,
    /// Requests are answered 503 ServiceUnavailable.
    Refuse,
    /// Requests wait `delay_ms` before they are forwarded.
    Delay,
    /// GETs of a single object are answered 404 with a text body, as a
    /// proxy or load balancer in front of the API server answers for a path
    /// it does not know: a 404 that says nothing about the object.
    #[serde(rename = "bare-404")]
    Bare404,
    /// A stale watch cache: LISTs (and watch-list initial events) at
    /// resourceVersion=0 are answered from the snapshot taken when the fault
    /// was set, and a watch starting at or before the snapshot's RV is held
    /// `lag_ms` before it is forwarded (the cache catching up).
    StaleList,
    /// `GET /version` (set on resource `version`) is answered with the
    /// server's own version, its minor replaced by `minor`: a control plane
    /// upgraded past what the client knows.
    ServerVersion,
    /// Every watch event is passed on `delay_ms` after it came (default
    /// 1000), in order: a watch lagging behind the store, as a busy API
    /// server's watch cache or a slow client connection lags.
    WatchLag,
}

impl FaultKind {
    pub const ALL: [FaultKind; 13] = [
        FaultKind::OldDeleteRv,
        FaultKind::DropDeletes,
        FaultKind::Duplicate,
        FaultKind::Reorder,
        FaultKind::PrevkvNil,
        FaultKind::Error410,
        FaultKind::CutMidEvent,
        FaultKind::Refuse,
        FaultKind::Delay,
        FaultKind::StaleList,
        FaultKind::Bare404,
        FaultKind::ServerVersion,
        FaultKind::WatchLag,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::OldDeleteRv => "old-delete-rv",
            FaultKind::DropDeletes => "drop-deletes",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Reorder => "reorder",
            FaultKind::PrevkvNil => "prevkv-nil",
            FaultKind::Error410 => "error-410",
            FaultKind::CutMidEvent => "cut-mid-event",
            FaultKind::Refuse => "refuse",
            FaultKind::Delay => "delay",
            FaultKind::StaleList => "stale-list",
            FaultKind::Bare404 => "bare-404",
            FaultKind::ServerVersion => "server-version",
            FaultKind::WatchLag => "watch-lag",
        }
    }
}

/// A fault on one resource (`"*"`: every resource).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpec {
    pub resource: String,
    pub fault: FaultKind,
    /// `delay`: how long each request waits; `watch-lag`: how long each
    /// event is held (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// `old-delete-rv`: the pause between replayed events when the client
    /// resumes from the old RV (default 250), so that the client acts on each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_ms: Option<u64>,
    /// `stale-list`: how long a watch from the stale snapshot is held (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<u64>,
    /// `cut-mid-event`: whole events before the cut (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// `reorder`: the longest an event is held (default 500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    /// `server-version`: the minor `/version` reports (default 99).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u64>,
    /// `stale-list`: the collection path to snapshot (default
    /// `/api/v1/<resource>`; give it for resources of an API group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl FaultSpec {
    pub fn new(resource: &str, fault: FaultKind) -> Self {
        Self {
            resource: resource.to_string(),
            fault,
            delay_ms: None,
            pace_ms: None,
            lag_ms: None,
            after: None,
            hold_ms: None,
            minor: None,
            path: None,
        }
    }

    pub fn applies_to(&self, resource: &str) -> bool {
        self.resource == "*" || self.resource == resource
    }

    pub fn delay_ms(&self) -> u64 {
        self.delay_ms.unwrap_or(1000)
    }

    pub fn pace_ms(&self) -> u64 {
        self.pace_ms.unwrap_or(250)
    }

    pub fn lag_ms(&self) -> u64 {
        self.lag_ms.unwrap_or(0)
    }

    pub fn after(&self) -> u64 {
        self.after.unwrap_or(1)
    }

    pub fn hold_ms(&self) -> u64 {
        self.hold_ms.unwrap_or(500)
    }

    pub fn minor(&self) -> u64 {
        self.minor.unwrap_or(99)
    }

    pub fn collection_path(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("/api/v1/{}", self.resource))
    }

    /// Parses the `--fault` flag form `RESOURCE:FAULT[:key=value,...]`, e.g.
    /// `services:old-delete-rv:pace_ms=300`.
    pub fn parse_flag(text: &str) -> Result<Self, String> {
        let mut parts = text.splitn(3, ':');
        let resource = parts.next().unwrap_or_default();
        let fault = parts.next().unwrap_or_default();
        if resource.is_empty() || fault.is_empty() {
            return Err(format!("{text:?}: expected RESOURCE:FAULT[:key=value,...]"));
        }
        let kind = FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == fault)
            .ok_or_else(|| {
                let names: Vec<_> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "{text:?}: unknown fault {fault:?} (one of {})",
                    names.join(", ")
                )
            })?;
        let mut spec = FaultSpec::new(resource, kind);
        for option in parts.next().unwrap_or_default().split(',') {
            if option.is_empty() {
                continue;
            }
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| format!("{text:?}: option {option:?} is not key=value"))?;
            if key == "path" {
                spec.path = Some(value.to_string());
                continue;
            }
            let number: u64 = value
                .parse()
                .map_err(|_| format!("{text:?}: {key}={value:?} is not a number"))?;
            match key {
                "delay_ms" => spec.delay_ms = Some(number),
                "pace_ms" => spec.pace_ms = Some(number),
                "lag_ms" => spec.lag_ms = Some(number),
                "after" => spec.after = Some(number),
                "hold_ms" => spec.hold_ms = Some(number),
                "minor" => spec.minor = Some(number),
                _ => return Err(format!("{text:?}: unknown option {key:?}")),
            }
        }
        Ok(spec)
    }
}

/// The faults in force, looked up per resource.
#[derive(Debug, Clone, Default)]
pub struct FaultSet {
    specs: Vec<FaultSpec>,
}

impl FaultSet {
    /// Adds `spec`, replacing one of the same kind on the same resource.
    pub fn set(&mut self, spec: FaultSpec) {
        self.specs
            .retain(|s| !(s.resource == spec.resource && s.fault == spec.fault));
        self.specs.push(spec);
    }

    /// Removes every fault on `resource` (all of them for `None`).
    pub fn clear(&mut self, resource: Option<&str>) {
        match resource {
            Some(r) => self.specs.retain(|s| s.resource != r),
            None => self.specs.clear(),
        }
    }

    pub fn all(&self) -> &[FaultSpec] {
        &self.specs
    }

    /// The fault of `kind` applying to `resource`, if any.
    pub fn get(&self, resource: &str, kind: FaultKind) -> Option<&FaultSpec> {
        self.specs
            .iter()
            .find(|s| s.fault == kind && s.applies_to(resource))
    }

    pub fn has(&self, resource: &str, kind: FaultKind) -> bool {
        self.get(resource, kind).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_forms() {
        let s = FaultSpec::parse_flag("services:old-delete-rv:pace_ms=300").expect("parses");
        assert_eq!(s.fault, FaultKind::OldDeleteRv);
        assert_eq!(s.pace_ms(), 300);
        let s = FaultSpec::parse_flag("*:delay").expect("parses");
        assert!(s.applies_to("pods"));
        assert_eq!(s.delay_ms(), 1000);
        let s = FaultSpec::parse_flag(
            "endpointslices:stale-list:path=/apis/discovery.k8s.io/v1/endpointslices",
        )
        .expect("parses");
        assert_eq!(
            s.collection_path(),
            "/apis/discovery.k8s.io/v1/endpointslices"
        );
        assert!(FaultSpec::parse_flag("services").is_err());
        assert!(FaultSpec::parse_flag("services:explode").is_err());
        assert!(FaultSpec::parse_flag("services:delay:delay_ms=x").is_err());
        assert!(FaultSpec::parse_flag("services:delay:wat=1").is_err());
    }

    #[test]
    fn json_form_and_set() {
        let s: FaultSpec =
            serde_json::from_str(r#"{"resource":"pods","fault":"drop-deletes"}"#).expect("json");
        let mut set = FaultSet::default();
        set.set(s.clone());
        set.set(s);
        set.set(FaultSpec::new("services", FaultKind::Duplicate));
        assert_eq!(set.all().len(), 2);
        assert!(set.has("pods", FaultKind::DropDeletes));
        assert!(!set.has("services", FaultKind::DropDeletes));
        set.clear(Some("pods"));
        assert!(!set.has("pods", FaultKind::DropDeletes));
        set.clear(None);
        assert!(set.all().is_empty());
        for kind in FaultKind::ALL {
            let json = serde_json::to_string(&kind).expect("serializes");
            assert_eq!(json, format!("\"{}\"", kind.name()));
        }
    }
}
