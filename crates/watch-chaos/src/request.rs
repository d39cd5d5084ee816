//! What a request to kube-apiserver is about: the resource, the namespace and
//! name from its path, and whether it is a watch, a list or anything else.

/// The resource a request path names, e.g. `/api/v1/namespaces/a/pods` →
/// `pods` in namespace `a`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Plural resource name: `services`, `pods`, `endpoints`, ...
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// A subresource such as `status` (never transformed).
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub watch_path: bool,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...`; `None` for any
/// other path (discovery, `/readyz`, `/version`, ...).
pub fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest {
        // `/namespaces/x/<resource>...` but not `/namespaces/x` (a namespace itself).
        ["namespaces", ns, resource, rest @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*resource];
            v.extend_from_slice(rest);
            v
        }),
        other => (None, other.to_vec()),
    };
    let resource = rest.first().filter(|r| !r.is_empty())?.to_string();
    Some(Target {
        resource,
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
        watch_path,
    })
}

/// The query parameters that matter to the proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
}

/// Parses a query string (without `?`); values are taken as written, which is
/// enough for the parameters above (booleans and decimal numbers).
pub fn parse_query(query: Option<&str>) -> Query {
    let mut q = Query::default();
    for pair in query.unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "watch" => q.watch = matches!(value, "true" | "1"),
            "resourceVersion" => q.resource_version = Some(value.to_string()),
            "sendInitialEvents" => q.send_initial_events = value == "true",
            _ => {}
        }
    }
    q
}

/// How the proxy treats a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A watch of a collection: its events are transformed.
    Watch,
    /// A LIST of a collection.
    List,
    /// Anything else: forwarded untouched (still subject to refuse/delay).
    Other,
}

/// Classifies a request by method, path and query.
pub fn classify(method: &http::Method, target: Option<&Target>, query: &Query) -> Kind {
    let Some(target) = target else {
        return Kind::Other;
    };
    if method != http::Method::GET || target.subresource.is_some() {
        return Kind::Other;
    }
    if query.watch || target.watch_path {
        return Kind::Watch;
    }
    if target.name.is_none() {
        Kind::List
    } else {
        Kind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(resource: &str, ns: Option<&str>, name: Option<&str>) -> Target {
        Target {
            resource: resource.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            subresource: None,
            watch_path: false,
        }
    }

    #[test]
    fn core_paths() {
        assert_eq!(
            parse_path("/api/v1/services"),
            Some(target("services", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/pods"),
            Some(target("pods", Some("a"), None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/endpoints/web"),
            Some(target("endpoints", Some("a"), Some("web")))
        );
        // A namespace object itself.
        assert_eq!(
            parse_path("/api/v1/namespaces/a"),
            Some(target("namespaces", None, Some("a")))
        );
        let status = parse_path("/api/v1/namespaces/a/pods/p/status").expect("parses");
        assert_eq!(status.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn group_and_watch_paths() {
        assert_eq!(
            parse_path("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices"),
            Some(target("endpointslices", Some("x"), None))
        );
        let w = parse_path("/api/v1/watch/namespaces/x/services").expect("parses");
        assert!(w.watch_path);
        assert_eq!(w.resource, "services");
        assert_eq!(parse_path("/readyz"), None);
        assert_eq!(parse_path("/apis/apps/v1"), None);
        assert_eq!(parse_path("/api/v1"), None);
    }

    #[test]
    fn queries_and_kinds() {
        let q = parse_query(Some(
            "allowWatchBookmarks=true&resourceVersion=42&watch=true",
        ));
        assert!(q.watch);
        assert_eq!(q.resource_version.as_deref(), Some("42"));
        let get = http::Method::GET;
        let t = parse_path("/api/v1/services");
        assert_eq!(classify(&get, t.as_ref(), &q), Kind::Watch);
        let list = parse_query(Some("limit=500&resourceVersion=0"));
        assert_eq!(classify(&get, t.as_ref(), &list), Kind::List);
        assert_eq!(list.resource_version.as_deref(), Some("0"));
        assert_eq!(
            classify(&http::Method::POST, t.as_ref(), &list),
            Kind::Other
        );
        let one = parse_path("/api/v1/namespaces/a/services/web");
        assert_eq!(classify(&get, one.as_ref(), &Query::default()), Kind::Other);
        assert_eq!(parse_query(None), Query::default());
    }
}
