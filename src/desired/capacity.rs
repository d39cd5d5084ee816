//! The 1000-address cap of core/v1 Endpoints (upstream `truncateEndpoints` and
//! `capacityAnnotationSetCorrectly`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset};

/// Most addresses (ready + not ready) one Endpoints object may hold.
pub const MAX_ADDRESSES: usize = 1000;
/// Annotation set while addresses were dropped to respect [`MAX_ADDRESSES`].
pub const ANNOTATION_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// The only value upstream writes for [`ANNOTATION_OVER_CAPACITY`].
pub const OVER_CAPACITY_TRUNCATED: &str = "truncated";

fn count(list: &Option<Vec<EndpointAddress>>) -> usize {
    list.as_ref().map_or(0, Vec::len)
}

/// Total addresses in a list of subsets.
pub(crate) fn address_count(subsets: &[EndpointSubset]) -> usize {
    subsets
        .iter()
        .map(|s| count(&s.addresses) + count(&s.not_ready_addresses))
        .sum()
}

/// Cuts the subsets down to [`MAX_ADDRESSES`]; true when anything was dropped.
///
/// Ready addresses go first: if they fit, every ready address stays and the room
/// left is shared among the not-ready ones; otherwise every not-ready address
/// goes and the ready ones share the whole room. Each subset, in order, gets
/// ceil(its share of the total × room), capped by what is still free, and keeps
/// its first addresses (the lowest after sorting).
pub(crate) fn truncate_subsets(subsets: &mut [EndpointSubset]) -> bool {
    let total_ready: usize = subsets.iter().map(|s| count(&s.addresses)).sum();
    let total_not_ready: usize = subsets.iter().map(|s| count(&s.not_ready_addresses)).sum();
    if total_ready + total_not_ready <= MAX_ADDRESSES {
        return false;
    }
    let cut_ready = total_ready > MAX_ADDRESSES;
    let (room, competing) = if cut_ready {
        (MAX_ADDRESSES, total_ready)
    } else {
        (MAX_ADDRESSES - total_ready, total_not_ready)
    };
    let mut free = room;
    for subset in subsets.iter_mut() {
        let list = if cut_ready {
            // Upstream empties the not-ready list; absent and empty are the same on the wire.
            subset.not_ready_addresses = None;
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        // The same float arithmetic as upstream so the rounding agrees.
        let share = ((count(list) as f64 / competing as f64) * room as f64).ceil() as usize;
        let keep = share.min(free);
        if let Some(addresses) = list.as_mut() {
            addresses.truncate(keep);
        }
        free -= count(list);
    }
    true
}

/// Upstream's check that the over-capacity annotation needs no change: false
/// while the current subsets exceed the cap (they must be truncated), otherwise
/// true only when the annotation is absent.
pub(crate) fn capacity_annotation_correct(
    annotations: Option<&BTreeMap<String, String>>,
    current_subsets: &[EndpointSubset],
) -> bool {
    if address_count(current_subsets) > MAX_ADDRESSES {
        return false;
    }
    !annotations.is_some_and(|a| a.contains_key(ANNOTATION_OVER_CAPACITY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testkit::{address, subset};

    fn addresses(n: usize) -> Option<Vec<EndpointAddress>> {
        Some(
            (0..n)
                .map(|i| address(&format!("10.0.{}.{}", i / 256, i % 256), None, None))
                .collect(),
        )
    }

    fn build(ready: &[usize], not_ready: &[usize]) -> Vec<EndpointSubset> {
        ready
            .iter()
            .zip(not_ready)
            .map(|(r, n)| subset(addresses(*r), addresses(*n), None))
            .collect()
    }

    /// Addresses per subset: (ready, not ready).
    type PerSubset<'a> = (&'a [usize], &'a [usize]);

    /// The cases of upstream's TestTruncateEndpoints: input, expected, truncated.
    #[test]
    fn truncation_matches_upstream_cases() {
        let cases: [(&str, PerSubset, PerSubset, bool); 5] = [
            ("empty", (&[], &[]), (&[], &[]), false),
            (
                "total endpoints < max capacity",
                (&[50, 100, 100, 100, 100], &[50, 100, 100, 100, 100]),
                (&[50, 100, 100, 100, 100], &[50, 100, 100, 100, 100]),
                false,
            ),
            (
                "total endpoints = max capacity",
                (&[100, 100, 100, 100, 100], &[100, 100, 100, 100, 100]),
                (&[100, 100, 100, 100, 100], &[100, 100, 100, 100, 100]),
                false,
            ),
            (
                "ready fit, not-ready share the rest",
                (&[90, 110, 50, 10, 20], &[101, 200, 200, 201, 298]),
                (&[90, 110, 50, 10, 20], &[73, 144, 144, 145, 214]),
                true,
            ),
            (
                "ready over capacity: per-subset rounding [205,400,402,400,693] -> [98,191,192,191,328]",
                (&[205, 400, 402, 400, 693], &[100, 200, 200, 200, 300]),
                (&[98, 191, 192, 191, 328], &[0, 0, 0, 0, 0]),
                true,
            ),
        ];
        for (case, (ready, not_ready), (want_ready, want_not_ready), want_truncated) in cases {
            let mut subsets = build(ready, not_ready);
            assert_eq!(truncate_subsets(&mut subsets), want_truncated, "{case}");
            let got_ready: Vec<usize> = subsets.iter().map(|s| count(&s.addresses)).collect();
            let got_not_ready: Vec<usize> = subsets
                .iter()
                .map(|s| count(&s.not_ready_addresses))
                .collect();
            assert_eq!(got_ready, want_ready, "{case}");
            assert_eq!(got_not_ready, want_not_ready, "{case}");
        }
    }

    #[test]
    fn truncation_keeps_the_first_addresses() {
        let mut subsets = build(&[1001], &[0]);
        let first_ips: Vec<String> = subsets[0]
            .addresses
            .iter()
            .flatten()
            .take(1000)
            .map(|a| a.ip.clone())
            .collect();
        assert!(truncate_subsets(&mut subsets));
        let kept: Vec<String> = subsets[0]
            .addresses
            .iter()
            .flatten()
            .map(|a| a.ip.clone())
            .collect();
        assert_eq!(kept, first_ips);
    }

    #[test]
    fn capacity_annotation_check() {
        let marked = BTreeMap::from([(
            ANNOTATION_OVER_CAPACITY.to_string(),
            "truncated".to_string(),
        )]);
        let small = build(&[3], &[0]);
        let big = build(&[1001], &[0]);
        let cases = [
            ("under capacity, no annotation", None, &small, true),
            (
                "under capacity, stale annotation",
                Some(&marked),
                &small,
                false,
            ),
            ("over capacity is never correct", None, &big, false),
            ("over capacity even when marked", Some(&marked), &big, false),
        ];
        for (case, annotations, subsets, expected) in cases {
            assert_eq!(
                capacity_annotation_correct(annotations, subsets),
                expected,
                "{case}"
            );
        }
    }
}
