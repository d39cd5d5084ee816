//! What every layer shares about the run: which controllers run, and
//! whether they write. The flags that set them are in `config`, a layer
//! above the parts they configure; those parts import the types from here.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Keep Endpoints in sync with Services and Pods.
    Enforce,
    /// Write nothing: compute desired Endpoints, report divergences and deletions
    /// made by others while their Service existed.
    Audit,
}

/// One of the controllers this binary runs (`--controllers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Controller {
    /// Endpoints (`v1`), in place of kube-controller-manager's
    /// `endpoint-controller`.
    Endpoints,
    /// EndpointSlices (`discovery.k8s.io/v1`), in place of
    /// kube-controller-manager's `endpointslice-controller`.
    Endpointslices,
}

impl Controller {
    pub const ALL: [Controller; 2] = [Controller::Endpoints, Controller::Endpointslices];

    /// What the controller writes, for log lines and Event notes.
    pub fn objects(self) -> &'static str {
        match self {
            Controller::Endpoints => "Endpoints",
            Controller::Endpointslices => "EndpointSlices",
        }
    }

    /// The bounded `controller` label value (also the flag value).
    pub fn metric_label(self) -> &'static str {
        match self {
            Controller::Endpoints => "endpoints",
            Controller::Endpointslices => "endpointslices",
        }
    }
}

/// The controllers that run: a set, whatever order or repeats the flag had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controllers {
    endpoints: bool,
    endpointslices: bool,
}

impl Controllers {
    /// Both, as by default.
    pub const ALL: Controllers = Controllers {
        endpoints: true,
        endpointslices: true,
    };

    pub fn of(list: &[Controller]) -> Self {
        Controllers {
            endpoints: list.contains(&Controller::Endpoints),
            endpointslices: list.contains(&Controller::Endpointslices),
        }
    }

    pub fn contains(self, controller: Controller) -> bool {
        match controller {
            Controller::Endpoints => self.endpoints,
            Controller::Endpointslices => self.endpointslices,
        }
    }

    /// The running ones, in [`Controller::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Controller> {
        Controller::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }
}

impl std::fmt::Display for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.metric_label())
    }
}

/// A Service named `namespace/name` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ServiceName {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(ServiceName {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{text:?}: a Service is NAMESPACE/NAME")),
        }
    }
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_is_namespace_slash_name() {
        assert_eq!(
            "shop/web".parse::<ServiceName>(),
            Ok(ServiceName {
                namespace: "shop".into(),
                name: "web".into()
            })
        );
        for bad in ["web", "/web", "shop/", "a/b/c", ""] {
            assert!(bad.parse::<ServiceName>().is_err(), "{bad:?}");
        }
    }
}
