//! What the scan concludes from a read, and what it reads next (pure).

use std::collections::VecDeque;
use std::time::Instant;

use hardened_watcher::compare_rv;
use hardened_watcher::live::LiveMeta;

use super::Target;

/// What the scan does with one answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The cache is right (or moved on since).
    Fine,
    /// Gone in etcd, still cached: read again later.
    Suspect,
    /// Confirmed: evict.
    Ghost,
    /// The same incarnation, newer in etcd than in the cache: repair unless
    /// the watch catches up first.
    Behind,
}

/// What the cache holds of a target now: its UID and resourceVersion.
pub(super) type CachedMeta<'a> = Option<(&'a str, &'a str)>;

/// The rule, pure: `found` is what the read found (`None`: gone), `cached`
/// what the cache holds now, `second` whether this was the re-read of a
/// suspect.
pub(super) fn verdict(
    found: Option<&LiveMeta>,
    cached: CachedMeta<'_>,
    target_uid: &str,
    second: bool,
) -> Verdict {
    if cached.is_none_or(|(uid, _)| uid != target_uid) {
        // The cache moved on (a DELETE arrived, or another incarnation).
        return Verdict::Fine;
    }
    match found {
        // Equal, older (the watch is ahead of the read) or opaque RVs
        // (nothing to compare: the resync covers them) are fine.
        Some(meta) if meta.uid == target_uid => {
            if still_behind(cached, target_uid, &meta.resource_version) {
                Verdict::Behind
            } else {
                Verdict::Fine
            }
        }
        // etcd holds another incarnation: the cached one is dead.
        Some(_) => Verdict::Ghost,
        None if second => Verdict::Ghost,
        None => Verdict::Suspect,
    }
}

/// Whether the cache, holding `cached` now, is still behind the state
/// `found_rv` a read found for incarnation `uid` (pure).
pub(super) fn still_behind(cached: CachedMeta<'_>, uid: &str, found_rv: &str) -> bool {
    cached.is_some_and(|(cached_uid, cached_rv)| {
        cached_uid == uid && compare_rv(found_rv, cached_rv) == Some(std::cmp::Ordering::Greater)
    })
}

/// One read of a round.
pub(super) enum Read {
    /// A target of the pass, or (`second`) the re-read of a suspect.
    Check { target: Target, second: bool },
    /// A target whose cache was behind etcd's `found_rv`: read whole if it
    /// still is.
    Repair { target: Target, found_rv: String },
}

/// What the scan carries from round to round.
pub(super) struct Scan {
    pub(super) pass: VecDeque<Target>,
    pub(super) pass_started: Instant,
    pub(super) suspects: VecDeque<(Instant, Target)>,
    /// (when to look again, the target, the resourceVersion etcd had).
    pub(super) behind: VecDeque<(Instant, Target, String)>,
}

impl Scan {
    /// Up to `reads` reads for this round: rechecks that are due first, then
    /// the pass. A pass that ends mid-round is not started again until the
    /// next round, so no target is read twice in one.
    /// The repairs due by `now`, between rounds.
    pub(super) fn due_repairs(&mut self, now: Instant) -> Vec<Read> {
        let mut out = Vec::new();
        while self.behind.front().is_some_and(|(at, _, _)| *at <= now)
            && let Some((_, target, found_rv)) = self.behind.pop_front()
        {
            out.push(Read::Repair { target, found_rv });
        }
        out
    }

    pub(super) fn round(&mut self, reads: usize, now: Instant) -> Vec<Read> {
        let mut out = Vec::with_capacity(reads);
        while out.len() < reads {
            if self.behind.front().is_some_and(|(at, _, _)| *at <= now)
                && let Some((_, target, found_rv)) = self.behind.pop_front()
            {
                out.push(Read::Repair { target, found_rv });
            } else if self.suspects.front().is_some_and(|(at, _)| *at <= now)
                && let Some((_, target)) = self.suspects.pop_front()
            {
                out.push(Read::Check {
                    target,
                    second: true,
                });
            } else if let Some(target) = self.pass.pop_front() {
                out.push(Read::Check {
                    target,
                    second: false,
                });
            } else {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hardened_watcher::ObjectKey;

    use super::super::Kind;
    use super::*;

    fn target(name: &str) -> Target {
        Target {
            kind: Kind::Pod,
            key: ObjectKey::new("ns", name),
            uid: format!("uid-{name}"),
        }
    }

    fn names(reads: &[Read]) -> Vec<String> {
        reads
            .iter()
            .map(|read| match read {
                Read::Check { target, second } => {
                    format!("{}{}", target.key.name, if *second { " again" } else { "" })
                }
                Read::Repair { target, .. } => format!("{} repair", target.key.name),
            })
            .collect()
    }

    #[test]
    fn a_round_takes_due_rechecks_first_and_reads_no_target_twice() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut scan = Scan {
            pass: ["a", "b", "c"].map(target).into(),
            pass_started: now,
            suspects: [(now, target("s")), (later, target("t"))].into(),
            behind: [(now, target("r"), "12".to_string())].into(),
        };
        assert_eq!(
            names(&scan.round(3, now)),
            ["r repair", "s again", "a"],
            "due rechecks first, then the pass"
        );
        assert_eq!(
            names(&scan.round(5, now)),
            ["b", "c"],
            "the pass ends: the round ends, a suspect not yet due waits"
        );
        assert_eq!(names(&scan.round(5, later)), ["t again"]);

        // Between rounds, only the repairs that are due.
        scan.behind = [
            (now, target("x"), "3".to_string()),
            (later, target("y"), "4".to_string()),
        ]
        .into();
        assert_eq!(names(&scan.due_repairs(now)), ["x repair"]);
        assert!(scan.due_repairs(now).is_empty());
        assert_eq!(names(&scan.due_repairs(later)), ["y repair"]);
    }

    #[test]
    fn a_ghost_takes_two_reads_a_newer_state_is_behind_and_a_cache_that_moved_on_is_fine() {
        let meta = |uid: &str, rv: &str| LiveMeta {
            uid: uid.into(),
            resource_version: rv.into(),
        };
        let cases = [
            (
                "found, same state",
                Some(meta("u1", "10")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "the watch is ahead of the read",
                Some(meta("u1", "9")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "etcd holds a newer state",
                Some(meta("u1", "12")),
                Some(("u1", "10")),
                false,
                Verdict::Behind,
            ),
            (
                "opaque resourceVersions",
                Some(meta("u1", "x")),
                Some(("u1", "10")),
                false,
                Verdict::Fine,
            ),
            (
                "gone once: suspect",
                None,
                Some(("u1", "10")),
                false,
                Verdict::Suspect,
            ),
            (
                "gone twice: ghost",
                None,
                Some(("u1", "10")),
                true,
                Verdict::Ghost,
            ),
            (
                "another incarnation in etcd",
                Some(meta("u2", "3")),
                Some(("u1", "10")),
                false,
                Verdict::Ghost,
            ),
            (
                "the DELETE arrived meanwhile",
                None,
                None,
                true,
                Verdict::Fine,
            ),
            (
                "the cache holds a newer incarnation",
                None,
                Some(("u2", "11")),
                true,
                Verdict::Fine,
            ),
        ];
        for (case, found, cached, second, want) in cases {
            assert_eq!(
                verdict(found.as_ref(), cached, "u1", second),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn a_cache_that_caught_up_or_moved_on_needs_no_repair() {
        assert!(still_behind(Some(("u1", "10")), "u1", "12"), "still behind");
        assert!(!still_behind(Some(("u1", "12")), "u1", "12"), "caught up");
        assert!(!still_behind(Some(("u1", "13")), "u1", "12"), "ahead");
        assert!(
            !still_behind(Some(("u2", "1")), "u1", "12"),
            "another incarnation"
        );
        assert!(!still_behind(None, "u1", "12"), "deleted meanwhile");
    }
}
