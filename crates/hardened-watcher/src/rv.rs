//! resourceVersion comparison (KEP-5504) and the resume point.
//!
//! A resourceVersion is the version of one *object*, not an event sequence
//! number: a DELETE of an old object may carry that object's old RV (the first failure
//! of the crate documentation's table). So the point to resume a watch from is the
//! highest RV ever seen, never "the RV of the last event".

use std::cmp::Ordering;

/// Whether `rv` is a comparable resourceVersion per KEP-5504: a non-empty
/// decimal integer without leading zeros. Aggregated API servers may send
/// anything else; those RVs are *opaque*.
pub fn is_comparable(rv: &str) -> bool {
    !rv.is_empty()
        && rv.bytes().all(|b| b.is_ascii_digit())
        && !(rv.len() > 1 && rv.starts_with('0'))
}

/// Compares two resourceVersions the way upstream's
/// `resourceversion.CompareResourceVersion` does: by length, then lexically.
/// That is numeric order without parsing, so RVs wider than `u64` still work.
/// `None` when either side is opaque: the caller must fall back (and count it).
pub fn compare_rv(a: &str, b: &str) -> Option<Ordering> {
    if !is_comparable(a) || !is_comparable(b) {
        return None;
    }
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// What observing one RV did to a [`ResumePoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvObservation {
    /// Higher than anything before (or the first RV seen): the resume point moved.
    Advanced,
    /// Equal to the resume point.
    Same,
    /// Lower than the resume point: ignored, the resume point stays (failure A).
    Regressed,
    /// Not comparable. Taken as the newest, because that is the only thing a
    /// non-conforming server lets us do; counted so operators can see it.
    Opaque,
}

/// The highest resourceVersion seen. Never goes backwards for comparable RVs.
#[derive(Clone, Debug, Default)]
pub struct ResumePoint {
    highest: Option<String>,
}

impl ResumePoint {
    /// A resume point starting at `rv` (e.g. a list's RV).
    pub fn at(rv: &str) -> Self {
        let mut point = Self::default();
        point.observe(rv);
        point
    }

    /// Feeds one RV. Empty RVs (e.g. a synthetic object) are ignored as opaque.
    pub fn observe(&mut self, rv: &str) -> RvObservation {
        if rv.is_empty() {
            return RvObservation::Opaque;
        }
        let Some(current) = self.highest.as_deref() else {
            self.highest = Some(rv.to_owned());
            return if is_comparable(rv) {
                RvObservation::Advanced
            } else {
                RvObservation::Opaque
            };
        };
        match compare_rv(rv, current) {
            Some(Ordering::Greater) => {
                self.highest = Some(rv.to_owned());
                RvObservation::Advanced
            }
            Some(Ordering::Equal) => RvObservation::Same,
            Some(Ordering::Less) => RvObservation::Regressed,
            None => {
                // Without an order, the server's latest word is all we have.
                self.highest = Some(rv.to_owned());
                RvObservation::Opaque
            }
        }
    }

    /// The RV to resume from, if any was seen.
    pub fn get(&self) -> Option<&str> {
        self.highest.as_deref()
    }
}

/// The larger of two RVs; `b` wins when they are not comparable, so callers
/// pass the newer-by-arrival value second.
pub fn max_rv<'a>(a: &'a str, b: &'a str) -> &'a str {
    match compare_rv(a, b) {
        Some(Ordering::Greater) => a,
        _ => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_by_length_then_lexically() {
        assert_eq!(compare_rv("9", "10"), Some(Ordering::Less));
        assert_eq!(compare_rv("100", "99"), Some(Ordering::Greater));
        assert_eq!(compare_rv("123", "123"), Some(Ordering::Equal));
        assert_eq!(compare_rv("124", "123"), Some(Ordering::Greater));
        // wider than u64: still ordered
        assert_eq!(
            compare_rv("184467440737095516160", "18446744073709551615"),
            Some(Ordering::Greater)
        );
    }

    #[test]
    fn rejects_opaque_rvs() {
        for bad in ["", "0a", "abc", "01", "-1", " 1", "1.0"] {
            assert!(!is_comparable(bad), "{bad:?} must be opaque");
            assert_eq!(compare_rv(bad, "1"), None);
            assert_eq!(compare_rv("1", bad), None);
        }
        assert!(is_comparable("0"));
    }

    #[test]
    fn resume_point_never_goes_backwards() {
        let mut point = ResumePoint::at("100");
        assert_eq!(point.observe("150"), RvObservation::Advanced);
        assert_eq!(point.observe("7"), RvObservation::Regressed);
        assert_eq!(point.observe("150"), RvObservation::Same);
        assert_eq!(point.get(), Some("150"));
    }

    #[test]
    fn opaque_rvs_fall_back_to_latest() {
        let mut point = ResumePoint::at("100");
        assert_eq!(point.observe("abc"), RvObservation::Opaque);
        assert_eq!(point.get(), Some("abc"));
        assert_eq!(point.observe(""), RvObservation::Opaque);
        assert_eq!(point.get(), Some("abc"));
        assert_eq!(max_rv("5", "abc"), "abc");
        assert_eq!(max_rv("50", "7"), "50");
    }
}
