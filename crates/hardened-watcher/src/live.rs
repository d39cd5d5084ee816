//! Reads that reach etcd, and what "gone" means.
//!
//! A GET with resourceVersion unset is served from etcd (kube-apiserver v1.36,
//! the storage delegator), unlike a LIST, which the watch cache answers once
//! it has caught up: only a GET can disprove a ghost in the watch cache.
//!
//! "Gone" is decided here, not by a library: a 404 whose body is a `Status`
//! with reason `NotFound` naming the very object asked for (its name, and the
//! resource as `details.kind`, which is how kube-apiserver fills it). A 404
//! from anything else — a proxy or load balancer answering in text, a Status
//! for another object, a NotFound without details — is an error: retried and
//! counted, and nothing is deleted on its word. (kube 5's `get_opt` requires
//! reason NotFound today, but client-go's `IsNotFound` accepts any 404 with an
//! unknown reason; a library that aligned would silently open the guard.)

use std::fmt::Debug;

use kube::core::params::GetParams;
use kube::core::{ObjectList, Request};
use serde::de::DeserializeOwned;

use super::count::page_count;
use super::decode::{Listed, RawList, RawMeta};
use super::list::{PageAt, decode_error, page_request, send};
use super::object::LiveRead;
use super::object::ObjectKey;
use super::protobuf;
use super::selectors::Selectors;

/// Whether `err` says the object `name` of `resource` (plural, e.g. "pods")
/// does not exist.
pub fn is_gone(err: &kube::Error, name: &str, resource: &str) -> bool {
    let kube::Error::Api(status) = err else {
        return false;
    };
    status.code == 404
        && status.reason == "NotFound"
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.name == name && d.kind == resource)
}

/// Classifies the answer to a GET of `name` of `resource`.
fn classify<K>(
    answer: Result<K, kube::Error>,
    name: &str,
    resource: &str,
) -> Result<LiveRead<K>, kube::Error> {
    match answer {
        Ok(obj) => Ok(LiveRead::Found(obj)),
        Err(err) if is_gone(&err, name, resource) => Ok(LiveRead::Gone),
        Err(err) => Err(err),
    }
}

/// Requests about `key`'s collection of `K`: its namespace's, or the
/// cluster's for a cluster-scoped object (an empty namespace).
fn requests_for<K: kube::Resource>(dyntype: &K::DynamicType, key: &ObjectKey) -> Request {
    let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
    Request::new(K::url_path(dyntype, namespace))
}

/// GETs `key` of `K` (described by `dyntype`, `()` for k8s-openapi types)
/// with resourceVersion unset: a read from etcd.
pub async fn get<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    key: &ObjectKey,
) -> Result<LiveRead<K>, kube::Error>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    let mut req = requests_for::<K>(dyntype, key)
        .get(&key.name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("get");
    classify(
        client.request::<K>(req).await,
        &key.name,
        &K::plural(dyntype),
    )
}

/// Reads `key` of `K` as a watcher with `selectors` sees it: a consistent
/// LIST (a read from etcd) of the one object by name, with the selectors.
/// An object that exists but no longer matches them is [`LiveRead::Gone`]
/// to that watcher, as its watch said with a DELETED event.
pub async fn get_selected<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    key: &ObjectKey,
    selectors: &Selectors,
) -> Result<LiveRead<K>, kube::Error>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    let mut req = requests_for::<K>(dyntype, key)
        .list(&selectors.one_object(&key.name))
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("list");
    let list = client.request::<ObjectList<K>>(req).await?;
    Ok(list
        .items
        .into_iter()
        .next()
        .map_or(LiveRead::Gone, LiveRead::Found))
}

/// What a metadata read found of one object: enough to tell whether the
/// incarnation a cache holds still exists, and whether the cache holds its
/// latest state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveMeta {
    /// The object's UID (empty when it has none).
    pub uid: String,
    /// Its resourceVersion in etcd now (empty when it has none).
    pub resource_version: String,
}

/// GETs only the metadata of `key` of `K` (a read from etcd, but only
/// metadata crosses the wire to us) and reads only its UID and
/// resourceVersion. The answer's other fields (labels, annotations,
/// managedFields) are skipped by the parser without being built, which is
/// most of the CPU of a metadata read.
pub async fn get_meta<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    key: &ObjectKey,
) -> Result<LiveRead<LiveMeta>, kube::Error>
where
    K: kube::Resource,
{
    let mut req = requests_for::<K>(dyntype, key)
        .get_metadata(&key.name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("get_metadata");
    let answer = client
        .request::<MetaOnly>(req)
        .await
        .map(MetaOnly::into_live);
    classify(answer, &key.name, &K::plural(dyntype))
}

/// An object reduced to its UID and resourceVersion; every other field is
/// skipped unbuilt.
#[derive(serde::Deserialize)]
struct MetaOnly {
    #[serde(default)]
    metadata: MetaFields,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    uid: Option<String>,
    resource_version: Option<String>,
}

impl MetaOnly {
    fn into_live(self) -> LiveMeta {
        LiveMeta {
            uid: self.metadata.uid.unwrap_or_default(),
            resource_version: self.metadata.resource_version.unwrap_or_default(),
        }
    }
}

/// What a metadata-only LIST accepts: `PartialObjectMetadataList` in
/// protobuf, the same in JSON, then plain JSON. Protobuf answers are about
/// three quarters of the JSON's size (managedFields are most of an object's
/// metadata, and their field sets are the same JSON bytes in either format),
/// and the client skips the fields it does not read without building them;
/// a server that serves neither answers whole objects, whose metadata is
/// read all the same.
const META_LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, \
     application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";

/// Where a page of a LIST starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageFrom<'a> {
    /// A consistent read of the current state (resourceVersion unset).
    Current,
    /// Exactly this resourceVersion (`resourceVersionMatch=Exact`): served
    /// by etcd unless the watch cache holds a snapshot of it; 410 once etcd
    /// has compacted it.
    Exactly(&'a str),
    /// The page after the one that returned this continue token, which
    /// carries the first page's resourceVersion (kube-apiserver refuses a
    /// resourceVersion beside one).
    Continue(&'a str),
}

/// One page of a metadata-only LIST.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaPage {
    /// Each item's key with its UID and resourceVersion.
    pub items: Vec<(ObjectKey, LiveMeta)>,
    /// Items without a readable name: not in `items`.
    pub unreadable: usize,
    /// The list's resourceVersion (empty when the answer had none).
    pub resource_version: String,
    /// `None` on the last page.
    pub continue_token: Option<String>,
    /// Whether the server answered in protobuf.
    pub protobuf: bool,
}

/// What a LIST asks kube-apiserver to put in each item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListShape {
    /// `PartialObjectMetadata`: the metadata alone.
    Metadata,
    /// Whole objects, as a watcher's list asks for them (protobuf, JSON
    /// second); only their metadata is read, since every kind's message
    /// holds its ObjectMeta first, as `PartialObjectMetadata` does.
    Whole,
}

/// LISTs one page of the metadata of every `K` in the cluster (a read from
/// etcd for [`PageFrom::Current`], and for [`PageFrom::Exactly`] below the
/// watch cache's snapshots), in protobuf when the server serves it.
/// `request_label` names the request in the client's metrics.
pub async fn list_meta_page<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    limit: u32,
    from: PageFrom<'_>,
    request_label: &'static str,
) -> Result<MetaPage, kube::Error>
where
    K: kube::Resource,
{
    list_page_as::<K>(
        client,
        dyntype,
        limit,
        from,
        ListShape::Metadata,
        request_label,
    )
    .await
}

/// LISTs one page of every `K` in the cluster in the given shape and reads
/// each item's key, UID and resourceVersion, as [`list_meta_page`] does. A
/// [`ListShape::Whole`] page costs kube-apiserver what a watcher's list
/// page costs it, which is how the two shapes are compared.
pub async fn list_page_as<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    limit: u32,
    from: PageFrom<'_>,
    shape: ListShape,
    request_label: &'static str,
) -> Result<MetaPage, kube::Error>
where
    K: kube::Resource,
{
    let query = PageQuery {
        limit,
        from,
        shape,
        request_label,
    };
    let (page, _count) = fetch_page_as::<K>(client, dyntype, query).await?;
    Ok(page)
}

/// How many `K` the store held at exactly `rv` (items and
/// `remainingItemCount` of a one-item metadata LIST there): etcd's count
/// when no snapshot of the watch cache covers `rv`, as below its
/// compaction revision's successors (see [`PageFrom::Exactly`]). `None`
/// when the server did not count. A 410 is returned as the error it is.
pub async fn count_at<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    rv: &str,
    request_label: &'static str,
) -> Result<Option<u64>, kube::Error>
where
    K: kube::Resource,
{
    let query = PageQuery {
        limit: 1,
        from: PageFrom::Exactly(rv),
        shape: ListShape::Metadata,
        request_label,
    };
    let (_page, count) = fetch_page_as::<K>(client, dyntype, query).await?;
    Ok(count)
}

/// What one page of [`fetch_page_as`] asks for.
struct PageQuery<'a> {
    limit: u32,
    from: PageFrom<'a>,
    shape: ListShape,
    request_label: &'static str,
}

/// One page as [`list_page_as`] reads it, with the store's count when the
/// page is a first one that says it.
async fn fetch_page_as<K>(
    client: &kube::Client,
    dyntype: &K::DynamicType,
    query: PageQuery<'_>,
) -> Result<(MetaPage, Option<u64>), kube::Error>
where
    K: kube::Resource,
{
    let PageQuery {
        limit,
        from,
        shape,
        request_label,
    } = query;
    let (exact_rv, continue_token) = match from {
        PageFrom::Current => (None, None),
        PageFrom::Exactly(rv) => (Some(rv), None),
        PageFrom::Continue(token) => (None, Some(token)),
    };
    let page = PageAt {
        limit,
        continue_token,
        exact_rv,
        selectors: None,
    };
    let mut req = page_request(&Request::new(K::url_path(dyntype, None)), &page)?;
    req.extensions_mut().insert(request_label);
    req.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(match shape {
            ListShape::Metadata => META_LIST_ACCEPT,
            ListShape::Whole => protobuf::ACCEPT,
        }),
    );
    let (content_type, body) = send(client, req).await?;
    decode_meta_page(content_type.as_deref(), &body)
}

/// Reads a metadata LIST answer in the format its Content-Type names, and
/// the store's count if the answer gives it.
fn decode_meta_page(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(MetaPage, Option<u64>), kube::Error> {
    let mut page = MetaPage::default();
    let remaining;
    let metas = if protobuf::is_protobuf(content_type) {
        page.protobuf = true;
        let list = protobuf::decode_list(body, meta_message, &Some).map_err(decode_error)?;
        page.resource_version = list.resource_version;
        page.continue_token = list.continue_token;
        remaining = list.remaining_item_count;
        list.items
    } else {
        let text = std::str::from_utf8(body)
            .map_err(|err| decode_error(format!("a LIST answer that is not UTF-8: {err}")))?;
        let list = RawList::parse(text).map_err(kube::Error::SerdeError)?;
        let metas = list
            .items()
            .iter()
            .map(|raw| RawMeta::read(raw).map_or(Listed::Unknown(None), Listed::Item))
            .collect();
        page.resource_version = list.metadata.resource_version.unwrap_or_default();
        page.continue_token = list.metadata.continue_.filter(|t| !t.is_empty());
        remaining = list.metadata.remaining_item_count;
        metas
    };
    let count = page_count(metas.len(), page.continue_token.is_some(), remaining);
    for listed in metas {
        match listed {
            Listed::Item(meta) => page.items.push((
                meta.key,
                LiveMeta {
                    uid: meta.uid,
                    resource_version: meta.resource_version,
                },
            )),
            Listed::Unknown(_) => page.unreadable += 1,
        }
    }
    Ok((page, count))
}

/// A `PartialObjectMetadata` message (its ObjectMeta is field 1, as every
/// kind's is) read to its key, UID and resourceVersion.
fn meta_message(raw: &[u8]) -> Result<RawMeta, String> {
    protobuf::read_meta(raw).ok_or_else(|| "metadata without a name".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    /// The error kube makes of an API answer with this Status.
    fn api_error(code: u16, reason: &str, details: Option<(&str, &str)>) -> kube::Error {
        let mut status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "msg", "reason": reason, "code": code,
        });
        if let Some((name, kind)) = details {
            status["details"] = serde_json::json!({"name": name, "kind": kind});
        }
        match serde_json::from_value::<Status>(status) {
            Ok(status) => kube::Error::Api(status.boxed()),
            Err(err) => panic!("test Status: {err}"),
        }
    }

    #[test]
    fn gone_only_for_a_not_found_status_naming_the_object() {
        let cases = [
            (
                "kube-apiserver's NotFound",
                api_error(404, "NotFound", Some(("web", "services"))),
                true,
            ),
            (
                "a bare text 404 from a proxy (kube's reconstructed Status)",
                api_error(404, "Failed to parse error data", None),
                false,
            ),
            (
                "NotFound without details",
                api_error(404, "NotFound", None),
                false,
            ),
            (
                "NotFound for another object",
                api_error(404, "NotFound", Some(("other", "services"))),
                false,
            ),
            (
                "NotFound for another resource (e.g. the namespace)",
                api_error(404, "NotFound", Some(("web", "namespaces"))),
                false,
            ),
            (
                "a 404 with an empty reason",
                api_error(404, "", Some(("web", "services"))),
                false,
            ),
            (
                "forbidden",
                api_error(403, "Forbidden", Some(("web", "services"))),
                false,
            ),
            (
                "a NotFound reason on another code",
                api_error(500, "NotFound", Some(("web", "services"))),
                false,
            ),
        ];
        for (case, err, want) in cases {
            assert_eq!(is_gone(&err, "web", "services"), want, "{case}");
        }
        let transport = kube::Error::Service("connection reset".into());
        assert!(!is_gone(&transport, "web", "services"), "transport error");
    }

    #[test]
    fn a_metadata_read_keeps_the_uid_and_resource_version_and_skips_the_rest() {
        let partial = serde_json::json!({
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "web", "uid": "u1", "resourceVersion": "42", "labels": {"a": "b"},
                         "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
        });
        let only: MetaOnly = match serde_json::from_value(partial) {
            Ok(only) => only,
            Err(err) => panic!("decode: {err}"),
        };
        let want = LiveMeta {
            uid: "u1".into(),
            resource_version: "42".into(),
        };
        assert_eq!(only.into_live(), want);
        let bare: MetaOnly =
            match serde_json::from_str(r#"{"metadata":{"uid":null,"resourceVersion":null}}"#) {
                Ok(only) => only,
                Err(err) => panic!("decode: {err}"),
            };
        assert_eq!(bare.into_live(), LiveMeta::default());
    }

    #[test]
    fn classify_keeps_errors_that_are_not_gone() {
        let found = classify(Ok(7), "web", "services");
        assert!(matches!(found, Ok(LiveRead::Found(7))));
        let gone = classify::<u8>(
            Err(api_error(404, "NotFound", Some(("web", "services")))),
            "web",
            "services",
        );
        assert!(matches!(gone, Ok(LiveRead::Gone)));
        let bare = classify::<u8>(
            Err(api_error(404, "Failed to parse error data", None)),
            "web",
            "services",
        );
        assert!(bare.is_err());
    }

    fn meta_of(uid: &str, rv: &str) -> LiveMeta {
        LiveMeta {
            uid: uid.into(),
            resource_version: rv.into(),
        }
    }

    #[test]
    fn a_protobuf_metadata_page_is_read_to_keys_uids_and_versions() {
        use crate::protobuf::encode::{counted_list, list, meta};
        let nameless = meta("", "ns", "u0", "7");
        let body = list(
            "PartialObjectMetadataList",
            vec![
                meta("a", "ns", "u1", "5"),
                nameless,
                meta("b", "", "u2", "6"),
            ],
            "9",
            "next",
        );
        let content_type =
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let (page, count) = match decode_meta_page(Some(content_type), &body) {
            Ok(read) => read,
            Err(err) => panic!("decode: {err}"),
        };
        assert_eq!(count, None, "more pages, none counted");
        let counted = counted_list(
            "PartialObjectMetadataList",
            Vec::new(),
            "9",
            "next",
            Some(5),
        );
        let count = decode_meta_page(Some(content_type), &counted).map(|(_, count)| count);
        assert!(matches!(count, Ok(Some(5))), "{count:?}");
        let want = MetaPage {
            items: vec![
                (ObjectKey::new("ns", "a"), meta_of("u1", "5")),
                (ObjectKey::new("", "b"), meta_of("u2", "6")),
            ],
            unreadable: 1,
            resource_version: "9".into(),
            continue_token: Some("next".into()),
            protobuf: true,
        };
        assert_eq!(page, want);
        // The last page carries an empty token on this wire.
        let last = list("PartialObjectMetadataList", Vec::new(), "9", "");
        let page =
            decode_meta_page(Some(content_type), &last).map(|(p, count)| (p.continue_token, count));
        assert!(matches!(page, Ok((None, Some(0)))), "{page:?}");
        let not_a_list = crate::protobuf::encode::envelope("Pod", meta("a", "ns", "u1", "5"));
        assert!(decode_meta_page(Some(content_type), &not_a_list).is_err());
    }

    #[test]
    fn a_json_metadata_page_or_a_whole_object_list_is_read_the_same() {
        let partial = serde_json::json!({
            "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "9", "continue": "next", "remainingItemCount": 40},
            "items": [
                {"metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "5",
                              "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]}},
                {"metadata": {"namespace": "ns"}},
            ],
        });
        let whole = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "9"},
            "items": [{"metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "5"},
                       "spec": {"containers": []}}],
        });
        let read = |body: &serde_json::Value| match decode_meta_page(
            Some("application/json"),
            body.to_string().as_bytes(),
        ) {
            Ok(read) => read,
            Err(err) => panic!("decode: {err}"),
        };
        let (page, count) = read(&partial);
        assert_eq!(
            count,
            Some(42),
            "both items, the unreadable one too, and 40 more"
        );
        assert_eq!(
            page.items,
            vec![(ObjectKey::new("ns", "a"), meta_of("u1", "5"))]
        );
        assert_eq!(page.unreadable, 1);
        assert_eq!(page.continue_token.as_deref(), Some("next"));
        assert!(!page.protobuf);
        let (page, count) = read(&whole);
        assert_eq!(count, Some(1));
        assert_eq!(
            page.items,
            vec![(ObjectKey::new("ns", "a"), meta_of("u1", "5"))]
        );
        assert_eq!(page.continue_token, None);
        assert!(decode_meta_page(None, b"{\"items\": 3}").is_err());
    }
}
