//! Which Kubernetes release's rules the desired state follows.
//!
//! endpoints-guard writes what the cluster's own kube-controller-manager would
//! write, and that is not the same on every release. What differs, read from
//! each release's sources (`docs/versions.md` lists it with the differences
//! kept on purpose):
//! - up to 1.34 the Endpoints controller orders subsets and ports, and the
//!   EndpointSlice controller orders slice ports, by an MD5 digest of their
//!   go-spew dump; from 1.35 by FNV-1a 128 ([`SpewHash`]);
//! - on 1.34 the `PreferSameTrafficDistribution` feature gate is beta and may
//!   be off: then `PreferSameZone` and `PreferSameNode` give no hints. From
//!   1.35 it is GA and locked on.
//!
//! A [`Rules`] value is handed to the pure code of [`crate::desired`]; where
//! it comes from (the server's version or `--kube-rules`) is decided at
//! start-up, outside.

/// A Kubernetes minor release whose endpoint controllers endpoints-guard can
/// stand in for (`--kube-rules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum KubeRelease {
    #[value(name = "1.34")]
    V1_34,
    #[value(name = "1.35")]
    V1_35,
    #[value(name = "1.36")]
    V1_36,
    #[value(name = "1.37")]
    V1_37,
}

impl KubeRelease {
    /// Every supported release, oldest first.
    pub const ALL: [KubeRelease; 4] = [
        KubeRelease::V1_34,
        KubeRelease::V1_35,
        KubeRelease::V1_36,
        KubeRelease::V1_37,
    ];

    /// The oldest and the newest supported release.
    pub const OLDEST: KubeRelease = KubeRelease::V1_34;
    pub const NEWEST: KubeRelease = KubeRelease::V1_37;

    /// The minor version number (34 for 1.34).
    pub fn minor(self) -> u32 {
        match self {
            KubeRelease::V1_34 => 34,
            KubeRelease::V1_35 => 35,
            KubeRelease::V1_36 => 36,
            KubeRelease::V1_37 => 37,
        }
    }

    /// The release of minor version 1.`minor`, if supported.
    pub fn of_minor(minor: u32) -> Option<KubeRelease> {
        Self::ALL.into_iter().find(|r| r.minor() == minor)
    }

    /// The supported range as text, `1.34–1.37`.
    pub fn range() -> String {
        format!("{}–{}", Self::OLDEST, Self::NEWEST)
    }

    /// The release an API server reports in `/version`: `major` and `minor`
    /// (managed clusters may suffix the minor, `34+`), else the
    /// `gitVersion` (`v1.34.4-eks-1`). A 1.x newer than the newest release
    /// here gets the newest one's rules, and says so; anything else outside
    /// the range is an error naming it and the flag that overrides the
    /// choice.
    pub fn of_server(major: &str, minor: &str, git_version: &str) -> Result<ServerRelease, String> {
        let number = |text: &str| -> Option<u32> {
            let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let from_fields = number(major).zip(number(minor));
        let from_git = || {
            let mut parts = git_version.trim_start_matches('v').split('.');
            number(parts.next()?).zip(parts.next().and_then(number))
        };
        let Some((major, minor)) = from_fields.or_else(from_git) else {
            return Err(format!(
                "the API server's version (major {major:?}, minor {minor:?}, gitVersion {git_version:?}) \
                 does not parse; pass --kube-rules {} to pick the rules",
                Self::choices()
            ));
        };
        match (major, Self::of_minor(minor)) {
            (1, Some(release)) => Ok(ServerRelease {
                release,
                newer_minor: None,
            }),
            // A release newer than every one here: its controllers change
            // little from one minor to the next, and refusing to start would
            // freeze every Service this controller alone publishes.
            (1, None) if minor > Self::NEWEST.minor() => Ok(ServerRelease {
                release: Self::NEWEST,
                newer_minor: Some(minor),
            }),
            _ => Err(format!(
                "the API server is Kubernetes {major}.{minor} ({git_version}); endpoints-guard \
                 follows the rules of {}: pass --kube-rules {} to run with one of them",
                Self::range(),
                Self::choices()
            )),
        }
    }

    /// `1.34|1.35|1.36|1.37`.
    pub fn choices() -> String {
        Self::ALL
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("|")
    }
}

/// The release whose rules serve an API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerRelease {
    pub release: KubeRelease,
    /// The server's minor, when it is newer than every release here
    /// (`release` is then the newest).
    pub newer_minor: Option<u32>,
}

impl std::fmt::Display for KubeRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

/// The digest upstream sorts by (`pkg/api/v1/endpoints` SortSubsets and
/// `k8s.io/endpointslice/util` NewPortMapKey), over the same go-spew dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpewHash {
    /// `crypto/md5`: Kubernetes 1.34 and before.
    Md5,
    /// `hash/fnv` New128a: Kubernetes 1.35 and after.
    Fnv128a,
}

/// The feature gates of kube-controller-manager that change what it writes
/// and that its version does not tell (`--feature-gates`); `None`: the
/// release's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// `PreferSameTrafficDistribution` (beta, on by default, in 1.34; GA and
    /// locked on from 1.35).
    pub prefer_same_traffic_distribution: Option<bool>,
}

impl FeatureGates {
    /// The gates this controller knows.
    pub const KNOWN: [&str; 1] = ["PreferSameTrafficDistribution"];

    /// Parses kube-controller-manager's form, `Name=true,Other=false`.
    pub fn parse(text: &str) -> Result<FeatureGates, String> {
        let mut gates = FeatureGates::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: a gate is Name=true or Name=false"))?;
            let value = match value.trim() {
                "true" => true,
                "false" => false,
                other => return Err(format!("{name}={other}: the value is true or false")),
            };
            match name.trim() {
                "PreferSameTrafficDistribution" => {
                    gates.prefer_same_traffic_distribution = Some(value);
                }
                other => {
                    return Err(format!(
                        "unknown feature gate {other:?}: endpoints-guard knows {}",
                        Self::KNOWN.join(", ")
                    ));
                }
            }
        }
        Ok(gates)
    }
}

/// The rules of one release, with its feature gates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    release: KubeRelease,
    prefer_same_traffic_distribution: bool,
    /// The API server's minor, when newer than `release` (the newest here).
    server_newer_minor: Option<u32>,
}

impl Rules {
    /// The rules of `release` with every gate at its default.
    pub const fn of(release: KubeRelease) -> Rules {
        Rules {
            release,
            prefer_same_traffic_distribution: true,
            server_newer_minor: None,
        }
    }

    /// The rules of `release` with `gates`; a gate locked on that release
    /// cannot be turned off (kube-controller-manager refuses it too).
    pub fn with_gates(release: KubeRelease, gates: FeatureGates) -> Result<Rules, String> {
        let mut rules = Rules::of(release);
        if let Some(on) = gates.prefer_same_traffic_distribution {
            if !on && release >= KubeRelease::V1_35 {
                return Err(format!(
                    "feature gate PreferSameTrafficDistribution is GA and locked on from \
                     Kubernetes 1.35: it can be turned off with the rules of 1.34 only, not {release}"
                ));
            }
            rules.prefer_same_traffic_distribution = on;
        }
        Ok(rules)
    }

    /// The release these rules are of.
    pub fn release(self) -> KubeRelease {
        self.release
    }

    /// These rules, followed for an API server of the newer minor 1.`minor`.
    pub fn for_newer_server(mut self, minor: u32) -> Rules {
        self.server_newer_minor = Some(minor);
        self
    }

    /// The API server's minor, when it is newer than these rules' release.
    pub fn server_newer_minor(self) -> Option<u32> {
        self.server_newer_minor
    }

    /// The digest Endpoints ports and subsets, and slice ports, are sorted by.
    pub fn port_order(self) -> SpewHash {
        if self.release <= KubeRelease::V1_34 {
            SpewHash::Md5
        } else {
            SpewHash::Fnv128a
        }
    }

    /// Whether `trafficDistribution: PreferSameZone` and `PreferSameNode`
    /// give hints.
    pub fn prefer_same_traffic_distribution(self) -> bool {
        self.prefer_same_traffic_distribution
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_version_picks_the_release() {
        let of = |major, minor, git| KubeRelease::of_server(major, minor, git).map(|r| r.release);
        assert_eq!(of("1", "34", "v1.34.4"), Ok(KubeRelease::V1_34));
        assert_eq!(of("1", "35+", "v1.35.4-gke.100"), Ok(KubeRelease::V1_35));
        assert_eq!(of("", "", "v1.36.3-eks-1"), Ok(KubeRelease::V1_36));
        assert_eq!(of("1", "37", "v1.37.2"), Ok(KubeRelease::V1_37));
        for (major, minor, git) in [("1", "33", "v1.33.7"), ("2", "0", "v2.0.0")] {
            let err = of(major, minor, git).unwrap_err();
            assert!(
                err.contains("1.34–1.37") && err.contains("--kube-rules 1.34|1.35|1.36|1.37"),
                "{err}"
            );
            assert!(!err.contains('\n'), "one line: {err}");
        }
        let err = of("", "", "master").unwrap_err();
        assert!(err.contains("--kube-rules"), "{err}");
    }

    #[test]
    fn a_newer_server_gets_the_newest_rules_and_says_so() {
        for (minor, git) in [("38", "v1.38.0"), ("41+", "v1.41.2-eks-3")] {
            let picked = KubeRelease::of_server("1", minor, git);
            assert_eq!(
                picked.as_ref().map(|r| r.release),
                Ok(KubeRelease::NEWEST),
                "{git}"
            );
            assert!(
                picked.is_ok_and(|r| r.newer_minor.is_some_and(|m| m > 37)),
                "{git}"
            );
        }
        assert_eq!(
            KubeRelease::of_server("1", "37", "v1.37.2").map(|r| r.newer_minor),
            Ok(None)
        );
    }

    #[test]
    fn md5_up_to_1_34_and_fnv_after() {
        let order = |release| Rules::of(release).port_order();
        assert_eq!(order(KubeRelease::V1_34), SpewHash::Md5);
        for release in [KubeRelease::V1_35, KubeRelease::V1_36, KubeRelease::V1_37] {
            assert_eq!(order(release), SpewHash::Fnv128a, "{release}");
        }
    }

    #[test]
    fn prefer_same_traffic_distribution_can_be_off_on_1_34_only() {
        let off = FeatureGates {
            prefer_same_traffic_distribution: Some(false),
        };
        let on = FeatureGates {
            prefer_same_traffic_distribution: Some(true),
        };
        for release in KubeRelease::ALL {
            assert!(
                Rules::of(release).prefer_same_traffic_distribution(),
                "{release}: on by default"
            );
            assert_eq!(Rules::with_gates(release, on), Ok(Rules::of(release)));
        }
        let rules = Rules::with_gates(KubeRelease::V1_34, off).unwrap();
        assert!(!rules.prefer_same_traffic_distribution());
        for release in [KubeRelease::V1_35, KubeRelease::V1_36, KubeRelease::V1_37] {
            let err = Rules::with_gates(release, off).unwrap_err();
            assert!(err.contains("locked on"), "{release}: {err}");
        }
    }

    #[test]
    fn feature_gates_parse_as_kube_controller_manager_writes_them() {
        assert_eq!(FeatureGates::parse(""), Ok(FeatureGates::default()));
        assert_eq!(
            FeatureGates::parse("PreferSameTrafficDistribution=false"),
            Ok(FeatureGates {
                prefer_same_traffic_distribution: Some(false)
            })
        );
        assert_eq!(
            FeatureGates::parse(
                "PreferSameTrafficDistribution=false, PreferSameTrafficDistribution=true"
            ),
            Ok(FeatureGates {
                prefer_same_traffic_distribution: Some(true)
            }),
            "the last one wins"
        );
        for bad in [
            "PreferSameTrafficDistribution",
            "PreferSameTrafficDistribution=no",
            "WatchListClient=true",
        ] {
            assert!(FeatureGates::parse(bad).is_err(), "{bad}");
        }
    }
}
