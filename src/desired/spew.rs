//! The ordering key upstream sorts ports and subsets by.
//!
//! Upstream (`pkg/api/v1/endpoints` SortSubsets) orders the ports inside a subset,
//! and the subsets themselves, by comparing 128-bit digests (big-endian bytes)
//! of a textual dump of each value: MD5 up to Kubernetes 1.34, FNV-1a 128 from
//! 1.35 ([`SpewHash`], picked by the [`super::Rules`] in force). The dump is go-spew's `%#v` rendering
//! with the configuration of `k8s.io/utils/dump.ForHash` (methods disabled, no
//! pointer addresses, no capacities). Since that order ends up in the object we
//! write, reproducing it byte for byte is the only way to write what upstream
//! writes. Only the shapes of core `v1.EndpointPort` and `v1.EndpointSubset` are
//! needed, and for EndpointSlices (`k8s.io/endpointslice/util` NewPortMapKey) the
//! shape of discovery `v1.EndpointPort`, whose fields are all pointers.
//!
//! The rendering rules that matter here, all checked against golden values from
//! the real Go code in the tests below:
//! - the outermost value is prefixed with its Go type, `(v1.EndpointSubset)`;
//! - every struct field is `Name:(type)value`, fields separated by one space;
//! - slice elements carry no type prefix, but their own fields do;
//! - strings are written raw (no quotes, no escaping), so Go's empty string is
//!   just nothing after the type;
//! - a nil pointer or nil slice is `<nil>`; a non-nil pointer is `(*T)` followed
//!   by the pointee without another type prefix; an empty slice is `[]`.

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, ObjectReference};
use k8s_openapi::api::discovery::v1::EndpointPort as SlicePort;
use md5::Digest as _;

use super::rules::SpewHash;

/// A 128-bit digest (MD5 or FNV-1a) read as a big-endian number: comparing
/// these numbers compares upstream's digest bytes.
pub(crate) type Digest = u128;

const FNV128_OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

pub(crate) fn fnv1a_128(bytes: &[u8]) -> Digest {
    bytes.iter().fold(FNV128_OFFSET_BASIS, |state, byte| {
        (state ^ u128::from(*byte)).wrapping_mul(FNV128_PRIME)
    })
}

pub(crate) fn md5_128(bytes: &[u8]) -> Digest {
    u128::from_be_bytes(md5::Md5::digest(bytes).into())
}

fn digest(hash: SpewHash, dump: &str) -> Digest {
    match hash {
        SpewHash::Md5 => md5_128(dump.as_bytes()),
        SpewHash::Fnv128a => fnv1a_128(dump.as_bytes()),
    }
}

/// Sort key of an EndpointPort inside its subset.
pub(crate) fn port_digest(port: &EndpointPort, hash: SpewHash) -> Digest {
    digest(hash, &render_port(port))
}

/// Sort key of an EndpointSlice port among the ports of its slice.
pub(crate) fn slice_port_digest(port: &SlicePort, hash: SpewHash) -> Digest {
    digest(hash, &render_slice_port(port))
}

/// Sort key of a subset among the subsets.
pub(crate) fn subset_digest(subset: &EndpointSubset, hash: SpewHash) -> Digest {
    digest(hash, &render_subset(subset))
}

/// `%#v` of a `v1.EndpointPort` passed by value.
pub(crate) fn render_port(port: &EndpointPort) -> String {
    let mut out = String::from("(v1.EndpointPort)");
    write_port_fields(&mut out, port);
    out
}

/// `%#v` of a `v1.EndpointSubset` passed by value.
pub(crate) fn render_subset(subset: &EndpointSubset) -> String {
    let mut out = String::from("(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)");
    write_slice(&mut out, subset.addresses.as_deref(), write_address_fields);
    out.push_str(" NotReadyAddresses:([]v1.EndpointAddress)");
    write_slice(
        &mut out,
        subset.not_ready_addresses.as_deref(),
        write_address_fields,
    );
    out.push_str(" Ports:([]v1.EndpointPort)");
    write_slice(&mut out, subset.ports.as_deref(), write_port_fields);
    out.push('}');
    out
}

/// `%#v` of a discovery `v1.EndpointPort` passed by value: every field is a
/// pointer, so each carries its type and may be `<nil>`.
pub(crate) fn render_slice_port(port: &SlicePort) -> String {
    let mut out = String::from("(v1.EndpointPort){Name:");
    write_string_pointer(&mut out, &port.name);
    out.push_str(" Protocol:(*v1.Protocol)");
    out.push_str(port.protocol.as_deref().unwrap_or("<nil>"));
    out.push_str(" Port:(*int32)");
    match port.port {
        Some(number) => out.push_str(&number.to_string()),
        None => out.push_str("<nil>"),
    }
    out.push_str(" AppProtocol:");
    write_string_pointer(&mut out, &port.app_protocol);
    out.push('}');
    out
}

/// Go `string` fields are never absent: an absent Rust value is Go's "".
fn go_string(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("")
}

fn write_slice<T>(out: &mut String, items: Option<&[T]>, write_item: fn(&mut String, &T)) {
    let Some(items) = items else {
        out.push_str("<nil>");
        return;
    };
    out.push('[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(' ');
        }
        write_item(out, item);
    }
    out.push(']');
}

/// A Go `*string` field: the type prefix is always there, then the pointee or `<nil>`.
fn write_string_pointer(out: &mut String, value: &Option<String>) {
    out.push_str("(*string)");
    out.push_str(value.as_deref().unwrap_or("<nil>"));
}

fn write_port_fields(out: &mut String, port: &EndpointPort) {
    out.push_str("{Name:(string)");
    out.push_str(go_string(&port.name));
    out.push_str(" Port:(int32)");
    out.push_str(&port.port.to_string());
    out.push_str(" Protocol:(v1.Protocol)");
    out.push_str(go_string(&port.protocol));
    out.push_str(" AppProtocol:");
    write_string_pointer(out, &port.app_protocol);
    out.push('}');
}

fn write_address_fields(out: &mut String, address: &EndpointAddress) {
    out.push_str("{IP:(string)");
    out.push_str(&address.ip);
    out.push_str(" Hostname:(string)");
    out.push_str(go_string(&address.hostname));
    out.push_str(" NodeName:");
    write_string_pointer(out, &address.node_name);
    out.push_str(" TargetRef:(*v1.ObjectReference)");
    match &address.target_ref {
        Some(reference) => write_reference_fields(out, reference),
        None => out.push_str("<nil>"),
    }
    out.push('}');
}

fn write_reference_fields(out: &mut String, reference: &ObjectReference) {
    let fields: [(&str, &str, &Option<String>); 7] = [
        ("Kind", "string", &reference.kind),
        ("Namespace", "string", &reference.namespace),
        ("Name", "string", &reference.name),
        ("UID", "types.UID", &reference.uid),
        ("APIVersion", "string", &reference.api_version),
        ("ResourceVersion", "string", &reference.resource_version),
        ("FieldPath", "string", &reference.field_path),
    ];
    out.push('{');
    for (index, (name, go_type, value)) in fields.into_iter().enumerate() {
        if index > 0 {
            out.push(' ');
        }
        out.push_str(name);
        out.push_str(":(");
        out.push_str(go_type);
        out.push(')');
        out.push_str(go_string(value));
    }
    out.push('}');
}

#[cfg(test)]
#[path = "spew_tests.rs"]
mod tests;
