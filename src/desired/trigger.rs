//! The `endpoints.kubernetes.io/last-change-trigger-time` value.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::Offset;

use super::PodInfo;

/// Annotation holding the time of the earliest change the write reflects.
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// Trigger time as upstream computes it: the earliest of the Service's
/// creationTimestamp (pass it when the Service is new or changed since the last
/// sync) and the Ready-condition lastTransitionTime of the pods whose state
/// changed since then (the caller decides which; pods without a Ready transition
/// time contribute nothing). `None` means "unknown": the annotation is removed.
///
/// Upstream's tracker returns the creationTimestamp alone, ignoring pods, the
/// first time it sees a Service; a caller reproducing that passes no pods then.
pub fn trigger_time(
    svc_is_new_or_changed: Option<Timestamp>,
    changed_pods: &[&PodInfo],
) -> Option<Timestamp> {
    changed_pods
        .iter()
        .filter_map(|pod| pod.ready_transition())
        .chain(svc_is_new_or_changed)
        .min()
}

/// Upstream's handling of the annotation on every object it writes (both
/// controllers): the trigger time when known, otherwise no annotation.
pub(crate) fn set_trigger_time_annotation(
    annotations: &mut BTreeMap<String, String>,
    trigger_time: Option<Timestamp>,
) {
    match trigger_time {
        Some(time) => {
            annotations.insert(
                ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_string(),
                format_rfc3339_nano(time),
            );
        }
        None => {
            annotations.remove(ANNOTATION_LAST_CHANGE_TRIGGER_TIME);
        }
    }
}

/// Go's `t.UTC().Format(time.RFC3339Nano)`: UTC with a `Z`, fractional seconds
/// with trailing zeros trimmed, and no fraction at all on a whole second.
pub fn format_rfc3339_nano(time: Timestamp) -> String {
    let civil = Offset::UTC.to_datetime(time);
    let mut text = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        civil.year(),
        civil.month(),
        civil.day(),
        civil.hour(),
        civil.minute(),
        civil.second()
    );
    let nanos = civil.subsec_nanosecond();
    if nanos != 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testkit::pod;

    fn at(second: i64, nanos: i32) -> Timestamp {
        Timestamp::new(second, nanos).unwrap()
    }

    /// Go prints these for 2024-03-05T07:08:09+01:00 plus the given nanoseconds.
    #[test]
    fn rfc3339_nano_matches_go() {
        let base = "2024-03-05T06:08:09Z"
            .parse::<Timestamp>()
            .unwrap()
            .as_second();
        let cases = [
            (0, "2024-03-05T06:08:09Z"),
            (1, "2024-03-05T06:08:09.000000001Z"),
            (10, "2024-03-05T06:08:09.00000001Z"),
            (123_000_000, "2024-03-05T06:08:09.123Z"),
            (100_000_000, "2024-03-05T06:08:09.1Z"),
            (999_999_999, "2024-03-05T06:08:09.999999999Z"),
            (120, "2024-03-05T06:08:09.00000012Z"),
        ];
        for (nanos, expected) in cases {
            assert_eq!(format_rfc3339_nano(at(base, nanos)), expected, "{nanos}");
        }
    }

    #[test]
    fn trigger_time_is_the_earliest_change() {
        let mut early = pod("a", "10.0.0.1");
        early.ready_transition = Some(at(100, 0));
        let mut late = pod("b", "10.0.0.2");
        late.ready_transition = Some(at(200, 0));
        let (early, late) = (early.pack(), late.pack());
        let silent = pod("c", "10.0.0.3").pack();
        let cases = [
            ("nothing known", None, vec![], None),
            (
                "new service only",
                Some(at(150, 0)),
                vec![],
                Some(at(150, 0)),
            ),
            (
                "earliest pod transition",
                None,
                vec![&late, &early],
                Some(at(100, 0)),
            ),
            (
                "service earlier than pods",
                Some(at(50, 0)),
                vec![&late, &early],
                Some(at(50, 0)),
            ),
            (
                "pods without Ready transition ignored",
                None,
                vec![&silent],
                None,
            ),
        ];
        for (case, service, pods, expected) in cases {
            assert_eq!(trigger_time(service, &pods), expected, "{case}");
        }
    }
}
