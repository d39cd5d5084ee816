//! How each cached kind is keyed, and what of it the cache keeps.

use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, Node, ObjectReference};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use serde_json::value::RawValue;

use crate::desired::slices::{self, NodeInfo};
use crate::desired::{self, PodInfo};
use crate::wire::EndpointsWire;
use hardened_watcher::Whole;

/// A Service as the cache keeps it: whole, less its managedFields.
pub type CachedService = Whole<k8s_openapi::api::core::v1::Service>;
use crate::error::{Error, Result};
use hardened_watcher::{Cached, ObjectKey};

fn key_of<K: kube::Resource>(obj: &K) -> ObjectKey {
    ObjectKey {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

fn meta_str(field: &Option<String>) -> &str {
    field.as_deref().unwrap_or("")
}

/// A Kubernetes object kept as compact JSON in two parts: the object less
/// its managedFields and one list field (an Endpoints' `subsets`, a slice's
/// `endpoints`), and that field alone, where every `"uid"` is a targetRef's.
/// Key, uid and resourceVersion, read on every event, are kept as fields.
///
/// Why JSON: decoded, an Endpoints of 10 addresses takes ~8 KB (each address
/// is ~240 bytes of `Option<String>` slots before its strings, and serde
/// leaves the address vectors up to half empty); its JSON takes ~2 KB. It is
/// decoded only when its Service is reconciled.
#[derive(Clone, Debug, PartialEq)]
struct PackedObject {
    key: ObjectKey,
    uid: Box<str>,
    resource_version: Box<str>,
    object_json: Box<str>,
    field_json: Box<str>,
}

impl PackedObject {
    /// Packs `obj` (managedFields dropped), its list field taken out by
    /// `take`; returns the rest of the object too, for the fields a kind
    /// keeps beside. `None` only if it cannot be encoded, which a decoded
    /// object can.
    fn new<K, F>(obj: K, take: impl FnOnce(&mut K) -> F) -> Option<(Self, K)>
    where
        K: kube::Resource + serde::Serialize,
        F: serde::Serialize,
    {
        let mut obj = strip_managed_fields(obj);
        let field = take(&mut obj);
        let field_json = serde_json::to_string(&field).ok()?;
        Self::pack(obj, field_json.into_boxed_str())
    }

    /// Packs `obj` (managedFields dropped; its list field already out) with
    /// that field as it came on the wire, `raw`: kept as that very text when
    /// it reads as serde_json would write it (compact, and no escape, so a
    /// string is its bytes and [`Self::references`] finds a UID in it), else
    /// decoded as `F` and written again. Either way it decodes to the same
    /// field; the first way spares decoding and re-encoding every address of
    /// an object on each of its events (docs/cpu-profile.md). `None` if the
    /// field does not decode as `F` or the object cannot be encoded.
    fn from_wire<K, F>(obj: K, raw: Option<&RawValue>) -> Option<(Self, K)>
    where
        K: kube::Resource + serde::Serialize,
        F: serde::de::DeserializeOwned + serde::Serialize,
    {
        let field_json: Box<str> = match raw {
            None => "null".into(),
            Some(raw) if reads_as_written(raw.get()) => raw.get().into(),
            Some(raw) => {
                let field: F = serde_json::from_str(raw.get()).ok()?;
                serde_json::to_string(&field).ok()?.into_boxed_str()
            }
        };
        Self::pack(strip_managed_fields(obj), field_json)
    }

    fn pack<K>(obj: K, field_json: Box<str>) -> Option<(Self, K)>
    where
        K: kube::Resource + serde::Serialize,
    {
        let object_json = serde_json::to_string(&obj).ok()?;
        let meta = obj.meta();
        let packed = Self {
            key: key_of(&obj),
            uid: meta_str(&meta.uid).into(),
            resource_version: meta_str(&meta.resource_version).into(),
            object_json: object_json.into_boxed_str(),
            field_json,
        };
        Some((packed, obj))
    }

    /// The whole object back, the list field put in by `put`.
    fn decode<K, F>(&self, what: &'static str, put: impl FnOnce(&mut K, F)) -> Result<K>
    where
        K: serde::de::DeserializeOwned,
        F: serde::de::DeserializeOwned,
    {
        let error = |source| Error::Decode {
            what,
            key: self.key.to_string(),
            source,
        };
        let mut obj: K = serde_json::from_str(&self.object_json).map_err(error)?;
        put(
            &mut obj,
            serde_json::from_str(&self.field_json).map_err(error)?,
        );
        Ok(obj)
    }

    /// Whether a targetRef in the list field has this UID.
    fn references(&self, uid: &TargetRefUid) -> bool {
        uid.0
            .as_deref()
            .is_some_and(|needle| self.field_json.contains(needle))
    }
}

/// An Endpoints object as the cache keeps it: packed ([`PackedObject`], the
/// list field being `subsets`), and its managed-by label.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedEndpoints {
    packed: PackedObject,
    managed_by: Option<Box<str>>,
}

impl CachedEndpoints {
    /// `None` only if the object cannot be encoded, which a decoded object can.
    pub fn new(ep: Endpoints) -> Option<Self> {
        let (packed, ep) = PackedObject::new(ep, |ep| ep.subsets.take())?;
        Some(Self {
            packed,
            managed_by: managed_by(&ep).map(Into::into),
        })
    }

    /// Endpoints as read from the API ([`EndpointsWire`]: the subsets left
    /// as JSON text; see [`PackedObject::from_wire`]). `None` if the subsets
    /// do not decode or the object cannot be encoded.
    pub fn from_wire(wire: EndpointsWire) -> Option<Self> {
        let EndpointsWire { metadata, subsets } = wire;
        let ep = Endpoints {
            metadata,
            subsets: None,
        };
        let (packed, ep) =
            PackedObject::from_wire::<_, Option<Vec<EndpointSubset>>>(ep, subsets.as_deref())?;
        Some(Self {
            packed,
            managed_by: managed_by(&ep).map(Into::into),
        })
    }

    /// The whole object back.
    pub fn decode(&self) -> Result<Endpoints> {
        self.packed
            .decode("cached Endpoints", |ep: &mut Endpoints, subsets| {
                ep.subsets = subsets;
            })
    }

    /// The `endpoints.kubernetes.io/managed-by` label.
    pub fn managed_by(&self) -> Option<&str> {
        self.managed_by.as_deref()
    }

    /// See [`is_deletable`].
    pub fn is_deletable(&self) -> bool {
        deletable_manager(self.managed_by())
    }

    /// Whether an address (ready or not) has a targetRef with this UID.
    pub fn references(&self, uid: &TargetRefUid) -> bool {
        self.packed.references(uid)
    }
}

/// The pods the addresses of `ep` name (ready and not ready alike).
pub fn pod_target_refs(ep: &Endpoints) -> impl Iterator<Item = &ObjectReference> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .filter_map(|a| a.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
}

/// A targetRef UID as it reads in the JSON of [`CachedEndpoints`]' subsets
/// or [`CachedSlice`]'s endpoints: made once, then searched for in every
/// object of a namespace.
pub struct TargetRefUid(Option<String>);

impl TargetRefUid {
    pub fn new(uid: &str) -> Self {
        // serde_json wrote the subsets, so a targetRef's uid reads exactly
        // like this (escapes included). Encoding a &str cannot fail; were it
        // to, nothing would match.
        Self(
            serde_json::to_string(uid)
                .ok()
                .map(|value| format!("\"uid\":{value}")),
        )
    }
}

impl Cached for CachedEndpoints {
    fn key(&self) -> ObjectKey {
        self.packed.key.clone()
    }
    fn uid(&self) -> &str {
        &self.packed.uid
    }
    fn resource_version(&self) -> &str {
        &self.packed.resource_version
    }
}

/// An EndpointSlice as the cache keeps it: packed ([`PackedObject`], the
/// list field being `endpoints`), its service-name label and whether we may
/// take it over.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedSlice {
    packed: PackedObject,
    /// `kubernetes.io/service-name`: the one label indexed.
    service_name: Option<Box<str>>,
    /// Managed by us or by upstream's controller (see [`slices::is_adoptable`]).
    adoptable: bool,
}

impl CachedSlice {
    /// `None` only if the object cannot be encoded, which a decoded object can.
    pub fn new(slice: EndpointSlice) -> Option<Self> {
        let (packed, slice) =
            PackedObject::new(slice, |slice| std::mem::take(&mut slice.endpoints))?;
        Some(Self {
            packed,
            service_name: slices::slice_service_name(&slice).map(Into::into),
            adoptable: slices::is_adoptable(&slice),
        })
    }

    /// The whole object back.
    pub fn decode(&self) -> Result<EndpointSlice> {
        self.packed.decode(
            "cached EndpointSlice",
            |slice: &mut EndpointSlice, endpoints| {
                slice.endpoints = endpoints;
            },
        )
    }

    /// The Service this slice is labelled for.
    pub fn service_key(&self) -> Option<ObjectKey> {
        let name = self.service_name.as_deref()?;
        Some(ObjectKey::new(self.packed.key.namespace.clone(), name))
    }

    /// Whether we may change or delete it: ours, or upstream's (adopted).
    pub fn is_adoptable(&self) -> bool {
        self.adoptable
    }

    /// Whether an endpoint has a targetRef with this UID.
    pub fn references(&self, uid: &TargetRefUid) -> bool {
        self.packed.references(uid)
    }
}

impl Cached for CachedSlice {
    fn key(&self) -> ObjectKey {
        self.packed.key.clone()
    }
    fn uid(&self) -> &str {
        &self.packed.uid
    }
    fn resource_version(&self) -> &str {
        &self.packed.resource_version
    }
    /// Indexed by the service-name label only: the reconcile of a Service
    /// finds its slices through the index.
    const LABEL_INDEXED: bool = true;
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.service_name
            .as_deref()
            .map(|name| (slices::LABEL_SERVICE_NAME, name))
            .into_iter()
    }
}

/// The pods the endpoints of `slice` name.
pub fn slice_pod_refs(slice: &EndpointSlice) -> impl Iterator<Item = &ObjectReference> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
}

/// A Node as the cache keeps it: what EndpointSlices need ([`NodeInfo`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedNode {
    uid: Box<str>,
    resource_version: Box<str>,
    pub info: NodeInfo,
}

impl CachedNode {
    /// `None` for a Node without a name.
    pub fn new(node: &Node) -> Option<Self> {
        Some(Self {
            uid: meta_str(&node.metadata.uid).into(),
            resource_version: meta_str(&node.metadata.resource_version).into(),
            info: NodeInfo::from_node(node)?,
        })
    }
}

impl Cached for CachedNode {
    fn key(&self) -> ObjectKey {
        ObjectKey::new("", self.info.name.as_str())
    }
    fn uid(&self) -> &str {
        &self.uid
    }
    fn resource_version(&self) -> &str {
        &self.resource_version
    }
}

/// Labels values of `endpoints.kubernetes.io/managed-by` whose Endpoints we may
/// delete: upstream's and `endpoints-guard`, whichever of the two we write (we
/// adopt what upstream made when we replace it).
pub fn is_deletable(ep: &Endpoints) -> bool {
    deletable_manager(managed_by(ep))
}

fn deletable_manager(manager: Option<&str>) -> bool {
    matches!(
        manager,
        Some(desired::MANAGER) | Some(desired::UPSTREAM_MANAGER)
    )
}

pub fn managed_by(ep: &Endpoints) -> Option<&str> {
    ep.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(desired::LABEL_MANAGED_BY))
        .map(String::as_str)
}

impl Cached for PodInfo {
    fn key(&self) -> ObjectKey {
        ObjectKey::new(self.namespace(), self.name())
    }
    fn uid(&self) -> &str {
        PodInfo::uid(self)
    }
    fn resource_version(&self) -> &str {
        PodInfo::resource_version(self)
    }
    const LABEL_INDEXED: bool = true;
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        PodInfo::labels(self)
    }
}

/// Whether JSON text reads exactly as serde_json would write the same
/// values: no whitespace (serde_json writes none; kube-apiserver neither, but
/// a proxy may) and no escape (serde_json and Go escape differently: Go
/// writes `<` as `\u003c`). Whitespace inside a string also says no: the
/// text is then written again, which is only slower.
fn reads_as_written(text: &str) -> bool {
    !text
        .bytes()
        .any(|b| matches!(b, b'\\' | b' ' | b'\n' | b'\r' | b'\t'))
}

/// managedFields are often the largest part of an object and nothing here reads
/// them; an update sent without them leaves the server's record as it is. So
/// no object goes into a cache with them.
pub fn strip_managed_fields<K: kube::Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

#[cfg(test)]
#[path = "cached_tests.rs"]
mod tests;
