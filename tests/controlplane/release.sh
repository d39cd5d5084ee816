# shellcheck shell=bash
# Sourced by the build scripts: which Kubernetes release a build is for, and
# which Go builds it.
#
# KUBE_VERSION picks the release: a minor (1.34, v1.34) with pins in
# tests/controlplane/kubernetes/v<minor>/go.mod, or that minor's exact pinned
# version (1.34.4); unset, the newest minor pinned there. kube_release sets
#   kube_minor    v1.34  (the folder of that release's pins everywhere)
#   kube_version  v1.34.4 (the k8s.io/kubernetes version of those pins)

release_pins="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kubernetes"

# The Go toolchain used when pins need a newer Go than the local one; the Go
# module proxy serves it (GOTOOLCHAIN downloads it on first use).
newer_go_toolchain=go1.27.3

kube_minors() { # the pinned minors, oldest first
  local dir
  for dir in "$release_pins"/v1.*/; do
    [ -f "$dir/go.mod" ] && basename "$dir"
  done | sort -V
}

kube_release() {
  local wanted=${KUBE_VERSION:-} supported
  supported=$(kube_minors | sed 's/^v//' | paste -sd' ')
  if [ -z "$wanted" ]; then
    kube_minor=$(kube_minors | tail -1)
  else
    wanted=${wanted#v}
    kube_minor=v$(echo "$wanted" | cut -d. -f1,2)
  fi
  if [ -z "$kube_minor" ] || [ ! -f "$release_pins/$kube_minor/go.mod" ]; then
    echo "KUBE_VERSION=${KUBE_VERSION:-}: not a release pinned here (supported: $supported)" >&2
    return 1
  fi
  kube_version=$(awk '($1 == "k8s.io/kubernetes" && $2 ~ /^v/) { print $2; exit }
                      ($1 == "require" && $2 == "k8s.io/kubernetes") { print $3; exit }' \
    "$release_pins/$kube_minor/go.mod")
  if [ -z "$kube_version" ]; then
    echo "no k8s.io/kubernetes version in $release_pins/$kube_minor/go.mod" >&2
    return 1
  fi
  # An exact version must be the pinned one: building another would mislabel it.
  case "$wanted" in
    *.*.*) [ "v$wanted" = "$kube_version" ] || {
      echo "KUBE_VERSION=$KUBE_VERSION: $kube_minor is pinned at $kube_version" >&2
      return 1
    } ;;
  esac
}

# go_for GO_MOD...: exports GOTOOLCHAIN=$newer_go_toolchain when a `go` line
# of these module files asks for a newer Go than the local one.
go_for() {
  local need have
  need=$(awk '$1 == "go" { print $2 }' "$@" | sort -V | tail -1)
  have=$(GOTOOLCHAIN=local go env GOVERSION)
  have=${have#go}
  have=${have%% *}
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -1)" != "$have" ]; then
    export GOTOOLCHAIN=$newer_go_toolchain
    echo "go: these pins need Go $need, the local Go is $have: GOTOOLCHAIN=$GOTOOLCHAIN" >&2
  fi
}
