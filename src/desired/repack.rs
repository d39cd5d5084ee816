//! Upstream's canonical Endpoints layout (`pkg/api/v1/endpoints` RepackSubsets
//! and SortSubsets).
//!
//! Repacking expands subsets into (address, port, ready) triples and regroups
//! them: addresses are de-duplicated by (IP, targetRef UID) keeping the first
//! copy seen; for one address and port, not-ready beats ready; addresses that
//! offer exactly the same ports with the same readiness form one subset; a
//! subset without ports is carried through a sentinel port and comes out with
//! `ports` absent. Then everything is sorted: addresses by IP text bytes then
//! UID, ports and subsets by the digest in [`super::spew`] the release's
//! rules pick.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset};

use super::rules::SpewHash;
use super::spew::{port_digest, subset_digest};

/// How two ports with the same appProtocol text are told apart.
///
/// Upstream keys a Go map by the EndpointPort struct, whose appProtocol is a
/// pointer: equal texts behind different pointers are different keys. When
/// computing, all pods share the Service port's pointer, so comparing values is
/// exact. When repacking an object read from the API, every decoded port has its
/// own pointer, so each port carrying an appProtocol is distinct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AppProtocolIdentity {
    ByValue,
    ByOccurrence,
}

/// A port as repacking tells ports apart; borrowed from the subsets being
/// repacked (a key made per port, not per address, and never cloned).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortKey<'a> {
    name: &'a str,
    port: i32,
    protocol: &'a str,
    /// `None` for an absent appProtocol (all nil pointers are equal).
    app_protocol: Option<AppProtocolKey<'a>>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum AppProtocolKey<'a> {
    Text(&'a str),
    Occurrence(usize),
}

/// Stand-in for upstream's "no ports" sentinel (port -1, everything else empty).
const SENTINEL_PORT: i32 = -1;

struct PortEntry<'a> {
    port: Option<&'a EndpointPort>,
    /// Address index → ready; not-ready is sticky.
    readiness: BTreeMap<usize, bool>,
}

/// Where an address sits in the subsets being repacked: subset, list (ready
/// or not), position.
#[derive(Clone, Copy)]
struct AddressAt {
    subset: usize,
    ready: bool,
    index: usize,
}

impl AddressAt {
    fn get(self, subsets: &[EndpointSubset]) -> Option<&EndpointAddress> {
        let subset = subsets.get(self.subset)?;
        let list = if self.ready {
            &subset.addresses
        } else {
            &subset.not_ready_addresses
        };
        list.as_ref()?.get(self.index)
    }

    fn get_mut(self, subsets: &mut [EndpointSubset]) -> Option<&mut EndpointAddress> {
        let subset = subsets.get_mut(self.subset)?;
        let list = if self.ready {
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        list.as_mut()?.get_mut(self.index)
    }
}

/// Ports grouped by the exact set of (address number, ready) they are
/// offered on; address number `n` is the first copy of its key, `addresses[n]`.
struct Grouping {
    addresses: Vec<AddressAt>,
    groups: BTreeMap<Vec<(usize, bool)>, Vec<EndpointPort>>,
}

/// Repack and sort subsets into upstream's canonical form.
///
/// Addresses and ports are borrowed while grouping; each address is cloned
/// once, into the subset it ends up in. The maps are ordered ones: for the
/// few keys of one Service, comparing beats hashing (the order they give is
/// irrelevant: [`sort_subsets`] decides).
pub(crate) fn repack_subsets(
    subsets: &[EndpointSubset],
    identity: AppProtocolIdentity,
    order: SpewHash,
) -> Vec<EndpointSubset> {
    let Grouping { addresses, groups } = group(subsets, identity);
    emit(groups, order, |n| {
        addresses
            .get(n)
            .and_then(|at| at.get(subsets))
            .cloned()
            .unwrap_or_default()
    })
}

/// [`repack_subsets`] of subsets it may consume: an address is moved into its
/// last place in the result instead of being cloned and its original dropped.
pub(crate) fn repack_owned_subsets(
    mut subsets: Vec<EndpointSubset>,
    identity: AppProtocolIdentity,
    order: SpewHash,
) -> Vec<EndpointSubset> {
    let Grouping { addresses, groups } = group(&subsets, identity);
    let mut uses = vec![0usize; addresses.len()];
    for (n, _) in groups.keys().flatten() {
        if let Some(count) = uses.get_mut(*n) {
            *count += 1;
        }
    }
    emit(groups, order, |n| {
        let Some(address) = addresses.get(n).and_then(|at| at.get_mut(&mut subsets)) else {
            return EndpointAddress::default();
        };
        match uses.get_mut(n) {
            Some(count) if *count > 1 => {
                *count -= 1;
                address.clone()
            }
            _ => std::mem::take(address),
        }
    })
}

fn group(subsets: &[EndpointSubset], identity: AppProtocolIdentity) -> Grouping {
    let mut addresses: Vec<AddressAt> = Vec::new();
    let mut address_index: BTreeMap<AddressKey, usize> = BTreeMap::new();
    let mut ports: Vec<PortEntry> = Vec::new();
    let mut port_index: BTreeMap<PortKey, usize> = BTreeMap::new();
    let mut occurrences = 0usize;

    for (subset_at, subset) in subsets.iter().enumerate() {
        let subset_ports: Vec<Option<&EndpointPort>> = match subset.ports.as_deref() {
            Some(list) if !list.is_empty() => list.iter().map(Some).collect(),
            _ => vec![None],
        };
        let ready = subset.addresses.as_deref().unwrap_or_default();
        let not_ready = subset.not_ready_addresses.as_deref().unwrap_or_default();
        for port in subset_ports {
            let mut key = Some(port_key(port, identity, &mut occurrences));
            // The port's entry, made when its first address comes.
            let mut port_at: Option<usize> = None;
            let tagged = ready
                .iter()
                .enumerate()
                .map(|(index, a)| (a, true, index))
                .chain(
                    not_ready
                        .iter()
                        .enumerate()
                        .map(|(index, a)| (a, false, index)),
                );
            for (address, is_ready, index) in tagged {
                let address_at = *address_index
                    .entry(address_key(address))
                    .or_insert_with(|| {
                        addresses.push(AddressAt {
                            subset: subset_at,
                            ready: is_ready,
                            index,
                        });
                        addresses.len() - 1
                    });
                let at = match (port_at, key.take()) {
                    (Some(at), _) => at,
                    (None, Some(key)) => *port_index.entry(key).or_insert_with(|| {
                        ports.push(PortEntry {
                            port,
                            readiness: BTreeMap::new(),
                        });
                        ports.len() - 1
                    }),
                    // The key is taken only when `port_at` is set.
                    (None, None) => continue,
                };
                port_at = Some(at);
                let was = ports[at].readiness.entry(address_at).or_insert(is_ready);
                *was = *was && is_ready;
            }
        }
    }

    let mut groups: BTreeMap<Vec<(usize, bool)>, Vec<EndpointPort>> = BTreeMap::new();
    for entry in ports {
        let members: Vec<(usize, bool)> = entry.readiness.into_iter().collect();
        let group = groups.entry(members).or_default();
        if let Some(port) = entry.port.filter(|p| p.port > 0) {
            group.push(port.clone());
        }
    }
    Grouping { addresses, groups }
}

/// The subsets of `groups`, sorted; `address(n)` gives address number `n`
/// each time a group lists it, in the groups' order.
fn emit(
    groups: BTreeMap<Vec<(usize, bool)>, Vec<EndpointPort>>,
    order: SpewHash,
    mut address: impl FnMut(usize) -> EndpointAddress,
) -> Vec<EndpointSubset> {
    let repacked: Vec<EndpointSubset> = groups
        .into_iter()
        .map(|(members, group_ports)| {
            let mut pick = |wanted: bool| -> Option<Vec<EndpointAddress>> {
                let list: Vec<EndpointAddress> = members
                    .iter()
                    .filter(|(_, ready)| *ready == wanted)
                    .map(|(n, _)| address(*n))
                    .collect();
                (!list.is_empty()).then_some(list)
            };
            EndpointSubset {
                addresses: pick(true),
                not_ready_addresses: pick(false),
                ports: (!group_ports.is_empty()).then_some(group_ports),
            }
        })
        .collect();
    sort_subsets(repacked, order)
}

fn port_key<'a>(
    port: Option<&'a EndpointPort>,
    identity: AppProtocolIdentity,
    occurrences: &mut usize,
) -> PortKey<'a> {
    let Some(port) = port else {
        return PortKey {
            name: "",
            port: SENTINEL_PORT,
            protocol: "",
            app_protocol: None,
        };
    };
    let app_protocol = port.app_protocol.as_deref().map(|text| match identity {
        AppProtocolIdentity::ByValue => AppProtocolKey::Text(text),
        AppProtocolIdentity::ByOccurrence => {
            *occurrences += 1;
            AppProtocolKey::Occurrence(*occurrences)
        }
    });
    PortKey {
        name: port.name.as_deref().unwrap_or_default(),
        port: port.port,
        protocol: port.protocol.as_deref().unwrap_or_default(),
        app_protocol,
    }
}

/// Upstream's address order: IP text bytes, then an address without targetRef
/// first, then targetRef UID.
fn address_order(address: &EndpointAddress) -> (&str, bool, &str) {
    let uid = address
        .target_ref
        .as_ref()
        .map(|r| r.uid.as_deref().unwrap_or(""));
    (address.ip.as_str(), uid.is_some(), uid.unwrap_or(""))
}

/// An address as repacking de-duplicates it: IP and targetRef UID (absent
/// reads as "", as in [`repack_subsets`]).
type AddressKey<'a> = (&'a str, &'a str);

fn address_key(address: &EndpointAddress) -> AddressKey<'_> {
    let uid = address.target_ref.as_ref().and_then(|r| r.uid.as_deref());
    (address.ip.as_str(), uid.unwrap_or_default())
}

/// The address keys of `subsets`, sorted and de-duplicated: all of them, and
/// those listed as not ready somewhere.
fn address_key_sets(subsets: &[EndpointSubset]) -> (Vec<AddressKey<'_>>, Vec<AddressKey<'_>>) {
    let mut all = Vec::new();
    let mut not_ready = Vec::new();
    for subset in subsets {
        all.extend(subset.addresses.iter().flatten().map(address_key));
        not_ready.extend(subset.not_ready_addresses.iter().flatten().map(address_key));
    }
    all.extend_from_slice(&not_ready);
    for keys in [&mut all, &mut not_ready] {
        keys.sort_unstable();
        keys.dedup();
    }
    (all, not_ready)
}

/// Whether repacking `subsets` could give `repacked` (subsets in the form
/// [`repack_subsets`] returns): false only when it cannot, so a caller may
/// skip the repack. Repacking keeps every address key (one copy of each), and
/// a key listed as not ready for some port stays not ready for it; so the set
/// of keys and the set of keys not ready somewhere are the same before and
/// after. If either differs from `repacked`'s, the repack cannot equal it.
/// A pod turning ready or not ready moves its key in or out of the second
/// set, which is why this check decides most updates.
pub(crate) fn repack_may_equal(subsets: &[EndpointSubset], repacked: &[EndpointSubset]) -> bool {
    address_key_sets(subsets) == address_key_sets(repacked)
}

/// Upstream's SortSubsets, ports and subsets by the `order` digest.
pub(crate) fn sort_subsets(
    mut subsets: Vec<EndpointSubset>,
    order: SpewHash,
) -> Vec<EndpointSubset> {
    for subset in &mut subsets {
        for list in [&mut subset.addresses, &mut subset.not_ready_addresses]
            .into_iter()
            .flatten()
        {
            list.sort_by(|a, b| address_order(a).cmp(&address_order(b)));
        }
        if let Some(ports) = subset.ports.as_mut() {
            ports.sort_by_cached_key(|port| port_digest(port, order));
        }
    }
    subsets.sort_by_cached_key(|subset| subset_digest(subset, order));
    subsets
}

#[cfg(test)]
#[path = "repack_tests.rs"]
mod tests;
