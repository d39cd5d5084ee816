//! [`Selectors`]: which objects of a resource a watcher sees, applied by the
//! API server to every request the watcher sends about them.

use kube::api::{ListParams, WatchParams};

/// A label selector and a field selector, as `kubectl --selector` and
/// `--field-selector` take them. The API server applies them to the
/// watcher's LISTs and WATCHes, so an object that stops matching arrives as
/// a DELETED event and is missing from the next list, as a deleted one
/// would be; the watcher's own live reads (of disputed list items) apply
/// them too ([`live::get_selected`](crate::live::get_selected)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selectors {
    /// The label selector, e.g. `app=web,tier!=cache`.
    pub labels: Option<String>,
    /// The field selector, e.g. `spec.nodeName=node-a`.
    pub fields: Option<String>,
}

impl Selectors {
    /// Whether neither selector is set: every object is seen.
    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    /// `params` with these selectors.
    pub(crate) fn on_list(&self, mut params: ListParams) -> ListParams {
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &self.fields {
            params = params.fields(fields);
        }
        params
    }

    /// `params` with these selectors.
    pub(crate) fn on_watch(&self, mut params: WatchParams) -> WatchParams {
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &self.fields {
            params = params.fields(fields);
        }
        params
    }

    /// A consistent LIST of the one object `name` that these selectors
    /// match: the object if it exists and matches, nothing otherwise.
    pub(crate) fn one_object(&self, name: &str) -> ListParams {
        let by_name = format!("metadata.name={name}");
        let fields = match &self.fields {
            Some(fields) => format!("{by_name},{fields}"),
            None => by_name,
        };
        let mut params = ListParams::default().fields(&fields);
        if let Some(labels) = &self.labels {
            params = params.labels(labels);
        }
        params
    }
}

#[cfg(test)]
mod tests {
    use super::Selectors;

    #[test]
    fn a_read_of_one_object_adds_its_name_to_the_field_selector() {
        let both = Selectors {
            labels: Some("app=web".into()),
            fields: Some("spec.nodeName=a".into()),
        };
        let params = both.one_object("web-1");
        assert_eq!(
            params.field_selector.as_deref(),
            Some("metadata.name=web-1,spec.nodeName=a")
        );
        assert_eq!(params.label_selector.as_deref(), Some("app=web"));
        let none = Selectors::default();
        assert!(none.is_empty());
        assert_eq!(
            none.one_object("web-1").field_selector.as_deref(),
            Some("metadata.name=web-1")
        );
        assert_eq!(none.one_object("web-1").label_selector, None);
    }
}
