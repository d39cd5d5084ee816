//! Which kind of object a bench run measures: Endpoints (`v1`, against
//! kube-controller-manager's `endpoints-controller`) or EndpointSlices
//! (`discovery.k8s.io/v1`, against its `endpointslice-controller`).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// The object kind both controllers write in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    #[default]
    #[serde(rename = "endpoints")]
    Endpoints,
    #[serde(rename = "endpointslices")]
    EndpointSlices,
}

impl Kind {
    /// Both, in the order `KIND=both` runs them.
    pub const ALL: [Kind; 2] = [Kind::Endpoints, Kind::EndpointSlices];

    /// `endpoints`, `endpointslices` or `both` (empty: `endpoints`).
    pub fn parse_list(value: &str) -> Result<Vec<Kind>> {
        Ok(match value.trim().to_ascii_lowercase().as_str() {
            "" | "endpoints" => vec![Kind::Endpoints],
            "endpointslices" | "endpointslice" | "slices" => vec![Kind::EndpointSlices],
            "both" | "all" => Kind::ALL.to_vec(),
            other => bail!("unknown bench kind {other:?} (use endpoints, endpointslices or both)"),
        })
    }

    /// The name in reports and flags (also endpoints-guard's `--controllers` value).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Endpoints => "endpoints",
            Kind::EndpointSlices => "endpointslices",
        }
    }

    /// The objects' name in prose.
    pub fn objects(self) -> &'static str {
        match self {
            Kind::Endpoints => "Endpoints",
            Kind::EndpointSlices => "EndpointSlices",
        }
    }

    /// kube-controller-manager's controller for the kind, and its worker-count flag.
    pub fn upstream_controller(self) -> (&'static str, &'static str) {
        match self {
            Kind::Endpoints => ("endpoints-controller", "--concurrent-endpoint-syncs"),
            Kind::EndpointSlices => (
                "endpointslice-controller",
                "--concurrent-service-endpoint-syncs",
            ),
        }
    }

    /// Suffix of the report files: "" for Endpoints (report.json as before),
    /// "-endpointslices" for slices.
    pub fn file_suffix(self) -> &'static str {
        match self {
            Kind::Endpoints => "",
            Kind::EndpointSlices => "-endpointslices",
        }
    }
}
