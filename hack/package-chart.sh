#!/usr/bin/env bash
# Lints charts/endpoints-guard with --strict and packages it:
#   <OUT_DIR>/endpoints-guard-<chart version>.tgz   (default OUT_DIR: target/chart)
# Push the package to an OCI registry with
#   helm push <OUT_DIR>/endpoints-guard-<version>.tgz oci://<registry>/<path>
#
# Usage: hack/package-chart.sh [OUT_DIR]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

out=${1:-$root/target/chart}
helm=$(find_helm)
mkdir -p "$out"
"$helm" lint --strict "$root/charts/endpoints-guard"
"$helm" package "$root/charts/endpoints-guard" --destination "$out"
