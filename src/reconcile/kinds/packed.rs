//! What the kinds kept as compact JSON share: [`PackedObject`], and the
//! helpers of every cached form.

use hardened_watcher::ObjectKey;
use kube::ResourceExt;
use serde_json::value::RawValue;

use crate::error::{Error, Result};

pub(super) fn key_of<K: kube::Resource>(obj: &K) -> ObjectKey {
    ObjectKey {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

pub(super) fn meta_str(field: &Option<String>) -> &str {
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
pub(super) struct PackedObject {
    pub(super) key: ObjectKey,
    pub(super) uid: Box<str>,
    pub(super) resource_version: Box<str>,
    pub(super) object_json: Box<str>,
    field_json: Box<str>,
}

impl PackedObject {
    /// Packs `obj` (managedFields dropped), its list field taken out by
    /// `take`; returns the rest of the object too, for the fields a kind
    /// keeps beside. `None` only if it cannot be encoded, which a decoded
    /// object can.
    pub(super) fn new<K, F>(obj: K, take: impl FnOnce(&mut K) -> F) -> Option<(Self, K)>
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
    pub(super) fn from_wire<K, F>(obj: K, raw: Option<&RawValue>) -> Option<(Self, K)>
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
    pub(super) fn decode<K, F>(&self, what: &'static str, put: impl FnOnce(&mut K, F)) -> Result<K>
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
    pub(super) fn references(&self, uid: &TargetRefUid) -> bool {
        uid.0
            .as_deref()
            .is_some_and(|needle| self.field_json.contains(needle))
    }
}

/// A targetRef UID as it reads in the JSON of [`CachedEndpoints`](super::CachedEndpoints)' subsets
/// or [`CachedSlice`](super::CachedSlice)'s endpoints: made once, then searched for in every
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
