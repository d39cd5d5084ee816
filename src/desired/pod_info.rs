//! [`PodInfo`]: a pod's Endpoints inputs packed into three allocations.
//!
//! Why packed: the pod cache holds one of these per pod, and at 10,000 pods
//! the owned form ([`super::PodFields`]: a dozen `String`s, a label `BTreeMap`
//! whose smallest node is ~500 bytes) cost about 1.2 KB a pod, most of the
//! controller's heap. Packed, every string lives in one buffer and is found by
//! its end offset; a typical pod takes about 300 bytes.

use std::fmt;

use k8s_openapi::jiff::Timestamp;

use super::pod::{NamedPort, PodFields};

/// The fixed string slots, in buffer order; labels, IPs and ports follow.
const NAMESPACE: usize = 0;
const NAME: usize = 1;
const UID: usize = 2;
const RESOURCE_VERSION: usize = 3;
const PHASE: usize = 4;
const HOSTNAME: usize = 5;
const SUBDOMAIN: usize = 6;
const NODE_NAME: usize = 7;
const FIXED_SLOTS: usize = 8;

/// Bits of [`PodInfo::flags`]: the two booleans, then which optional slots are
/// set (an absent field and an empty one differ upstream, so both are kept).
const READY: u8 = 1;
const TERMINATING: u8 = 1 << 1;
const fn present(slot: usize) -> u8 {
    1 << (slot - PHASE + 2)
}

/// Borrowed fields to pack; built from a Pod or from [`PodFields`].
pub(super) struct Parts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub resource_version: &'a str,
    pub phase: Option<&'a str>,
    pub hostname: Option<&'a str>,
    pub subdomain: Option<&'a str>,
    pub node_name: Option<&'a str>,
    /// Sorted by key, each key once (as a label map iterates).
    pub labels: Vec<(&'a str, &'a str)>,
    pub pod_ips: Vec<&'a str>,
    /// (name, containerPort, protocol)
    pub ports: Vec<(&'a str, i32, &'a str)>,
    pub ready: bool,
    pub terminating: bool,
    pub ready_transition: Option<Timestamp>,
}

/// Compact projection of a Pod: only what Endpoints computation and the
/// pod→Service index need. Read through its accessors; build with
/// [`PodInfo::from_pod`] or [`PodFields::pack`].
#[derive(Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Every string, back to back.
    text: Box<str>,
    /// The end offset in `text` of each string: the fixed slots, then each
    /// label's key and value, each IP, each port's name and protocol. After
    /// them, each port's number (as `u32` bits): one allocation fewer per pod.
    table: Box<[u32]>,
    labels: u32,
    ips: u32,
    ports: u32,
    flags: u8,
    ready_transition: Option<Timestamp>,
}

/// A named container port, borrowed from a [`PodInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedPortRef<'a> {
    pub name: &'a str,
    pub container_port: i32,
    pub protocol: &'a str,
}

fn offset(len: usize) -> u32 {
    // An object's text is far below 4 GiB (etcd caps it at 1.5 MiB); were it
    // not, the slot would read as "" rather than panic.
    u32::try_from(len).unwrap_or(u32::MAX)
}

impl PodInfo {
    pub(super) fn pack(parts: &Parts<'_>) -> PodInfo {
        let strings =
            FIXED_SLOTS + 2 * parts.labels.len() + parts.pod_ips.len() + 2 * parts.ports.len();
        let mut text = String::new();
        let mut table = Vec::with_capacity(strings + parts.ports.len());
        let mut flags = 0;
        if parts.ready {
            flags |= READY;
        }
        if parts.terminating {
            flags |= TERMINATING;
        }
        let optional = [
            (PHASE, parts.phase),
            (HOSTNAME, parts.hostname),
            (SUBDOMAIN, parts.subdomain),
            (NODE_NAME, parts.node_name),
        ];
        for (slot, value) in optional {
            if value.is_some() {
                flags |= present(slot);
            }
        }
        let fixed = [
            parts.namespace,
            parts.name,
            parts.uid,
            parts.resource_version,
        ]
        .into_iter()
        .chain(optional.iter().map(|(_, v)| v.unwrap_or("")));
        let labels = parts.labels.iter().flat_map(|(k, v)| [*k, *v]);
        let ips = parts.pod_ips.iter().copied();
        let ports = parts
            .ports
            .iter()
            .flat_map(|(name, _, protocol)| [*name, *protocol]);
        for s in fixed.chain(labels).chain(ips).chain(ports) {
            text.push_str(s);
            table.push(offset(text.len()));
        }
        // The i32 is stored bit for bit; `port_number` turns it back.
        table.extend(
            parts
                .ports
                .iter()
                .map(|(_, number, _)| number.cast_unsigned()),
        );
        PodInfo {
            text: text.into_boxed_str(),
            table: table.into_boxed_slice(),
            labels: offset(parts.labels.len()),
            ips: offset(parts.pod_ips.len()),
            ports: offset(parts.ports.len()),
            flags,
            ready_transition: parts.ready_transition,
        }
    }

    /// The string in slot `i` ("" for a slot out of range, which packing never makes).
    fn slot(&self, i: usize) -> &str {
        let start = match i.checked_sub(1) {
            None => 0,
            Some(prev) => self.table.get(prev).copied().unwrap_or(0),
        };
        let end = self.table.get(i).copied().unwrap_or(0);
        self.text.get(start as usize..end as usize).unwrap_or("")
    }

    fn optional(&self, slot: usize) -> Option<&str> {
        (self.flags & present(slot) != 0).then(|| self.slot(slot))
    }

    fn ips_start(&self) -> usize {
        FIXED_SLOTS + 2 * self.labels as usize
    }

    fn ports_start(&self) -> usize {
        self.ips_start() + self.ips as usize
    }

    fn numbers_start(&self) -> usize {
        self.ports_start() + 2 * self.ports as usize
    }

    pub fn namespace(&self) -> &str {
        self.slot(NAMESPACE)
    }

    pub fn name(&self) -> &str {
        self.slot(NAME)
    }

    pub fn uid(&self) -> &str {
        self.slot(UID)
    }

    pub fn resource_version(&self) -> &str {
        self.slot(RESOURCE_VERSION)
    }

    pub fn phase(&self) -> Option<&str> {
        self.optional(PHASE)
    }

    pub fn hostname(&self) -> Option<&str> {
        self.optional(HOSTNAME)
    }

    pub fn subdomain(&self) -> Option<&str> {
        self.optional(SUBDOMAIN)
    }

    pub fn node_name(&self) -> Option<&str> {
        self.optional(NODE_NAME)
    }

    /// The first PodReady condition has status "True".
    pub fn ready(&self) -> bool {
        self.flags & READY != 0
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn terminating(&self) -> bool {
        self.flags & TERMINATING != 0
    }

    /// lastTransitionTime of the Ready condition (upstream's trigger time source).
    pub fn ready_transition(&self) -> Option<Timestamp> {
        self.ready_transition
    }

    /// Labels as (key, value), sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        let start = FIXED_SLOTS;
        (0..self.labels as usize)
            .map(move |i| (self.slot(start + 2 * i), self.slot(start + 2 * i + 1)))
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// `status.podIPs` in order (see [`PodFields::pod_ips`]).
    pub fn pod_ips(&self) -> impl Iterator<Item = &str> + '_ {
        let start = self.ips_start();
        (start..start + self.ips as usize).map(|i| self.slot(i))
    }

    /// Named container ports, in the order upstream searches them (see
    /// [`PodFields::container_ports`]).
    pub fn container_ports(&self) -> impl Iterator<Item = NamedPortRef<'_>> + '_ {
        let (start, numbers) = (self.ports_start(), self.numbers_start());
        (0..self.ports as usize).map(move |i| NamedPortRef {
            name: self.slot(start + 2 * i),
            container_port: self.table.get(numbers + i).map_or(0, |n| n.cast_signed()),
            protocol: self.slot(start + 2 * i + 1),
        })
    }

    /// Equal in everything Endpoints are computed from: all but the
    /// resourceVersion, whose change alone leaves Endpoints as they are.
    pub fn same_endpoint_inputs(&self, other: &PodInfo) -> bool {
        let slots = self.numbers_start();
        self.flags == other.flags
            && self.ready_transition == other.ready_transition
            && (self.labels, self.ips, self.ports) == (other.labels, other.ips, other.ports)
            && self.table.get(slots..) == other.table.get(slots..)
            && (0..slots)
                .filter(|i| *i != RESOURCE_VERSION)
                .all(|i| self.slot(i) == other.slot(i))
    }

    /// Back to owned fields.
    pub fn fields(&self) -> PodFields {
        PodFields {
            namespace: self.namespace().to_string(),
            name: self.name().to_string(),
            uid: self.uid().to_string(),
            resource_version: self.resource_version().to_string(),
            labels: self
                .labels()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            phase: self.phase().map(str::to_string),
            pod_ips: self.pod_ips().map(str::to_string).collect(),
            ready: self.ready(),
            ready_transition: self.ready_transition,
            terminating: self.terminating(),
            hostname: self.hostname().map(str::to_string),
            subdomain: self.subdomain().map(str::to_string),
            node_name: self.node_name().map(str::to_string),
            container_ports: self
                .container_ports()
                .map(|p| NamedPort {
                    name: p.name.to_string(),
                    container_port: p.container_port,
                    protocol: p.protocol.to_string(),
                })
                .collect(),
        }
    }
}

impl fmt::Debug for PodInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fields().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn full() -> PodFields {
        PodFields {
            namespace: "ns".into(),
            name: "web-1".into(),
            uid: "7f6c0f0e-1111-2222-3333-444455556666".into(),
            resource_version: "42".into(),
            labels: BTreeMap::from([
                ("app".to_string(), "web".to_string()),
                ("tier".to_string(), String::new()),
            ]),
            phase: Some("Running".into()),
            pod_ips: vec!["10.0.0.1".into(), "fd00::1".into()],
            ready: true,
            ready_transition: Some(Timestamp::from_second(100).expect("ts")),
            terminating: false,
            hostname: Some(String::new()),
            subdomain: None,
            node_name: Some("node-1".into()),
            container_ports: vec![
                NamedPort {
                    name: "http".into(),
                    container_port: 8080,
                    protocol: "TCP".into(),
                },
                NamedPort {
                    name: "dns".into(),
                    container_port: -1,
                    protocol: String::new(),
                },
            ],
        }
    }

    #[test]
    fn packing_round_trips_every_field() {
        let cases = [
            ("full", full()),
            ("empty", PodFields::default()),
            (
                "terminating, not ready, no ports",
                PodFields {
                    ready: false,
                    terminating: true,
                    container_ports: Vec::new(),
                    ..full()
                },
            ),
        ];
        for (case, fields) in cases {
            assert_eq!(fields.pack().fields(), fields, "{case}");
        }
    }

    #[test]
    fn absent_and_empty_optional_fields_differ() {
        let packed = full().pack();
        assert_eq!(packed.hostname(), Some(""), "set but empty");
        assert_eq!(packed.subdomain(), None, "absent");
        assert_eq!(packed.label("tier"), Some(""));
        assert_eq!(packed.label("missing"), None);
    }

    #[test]
    fn endpoint_inputs_ignore_only_the_resource_version() {
        let base = full().pack();
        let newer = PodFields {
            resource_version: "43".into(),
            ..full()
        };
        assert!(base.same_endpoint_inputs(&newer.pack()));
        type Edit = (&'static str, fn(&mut PodFields));
        let edits: [Edit; 6] = [
            ("ready", |p| p.ready = false),
            ("ip", |p| p.pod_ips[1] = "fd00::2".into()),
            ("label", |p| {
                p.labels.insert("x".into(), "y".into());
            }),
            ("port number", |p| {
                p.container_ports[0].container_port = 8081
            }),
            ("hostname absent", |p| p.hostname = None),
            ("name moved between slots", |p| {
                p.namespace = "nsw".into();
                p.name = "eb-1".into();
            }),
        ];
        for (case, edit) in edits {
            let mut changed = full();
            edit(&mut changed);
            assert!(!base.same_endpoint_inputs(&changed.pack()), "{case}");
        }
    }
}
