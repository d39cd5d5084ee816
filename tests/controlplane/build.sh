#!/usr/bin/env bash
# Builds (or reuses) the programs the local control plane runs, pinned by the
# Go modules beside this script, into target/controlplane/<k8s-version>/bin/,
# for the release KUBE_VERSION names (1.34, 1.35, ...; default the newest
# pinned, see release.sh): kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kube-proxy (the real node of make e2e-node) from
# kubernetes/<release>/, etcd and etcdutl (its snapshot restore tool) at the
# etcd release that Kubernetes release ships with, from etcd/<release>/; and,
# the same for every release, helm, prometheus and promtool, and
# etcd-fault-proxy (our own gRPC proxy between kube-apiserver and etcd that can
# drop watch events) and etcd-peer-proxy (our own proxy of the raft traffic
# between etcd members that can partition one).
#
# Reuse, in this order:
#   1. EG_KUBE_APISERVER / EG_KUBE_CONTROLLER_MANAGER / EG_ETCD / EG_ETCDUTL /
#      EG_HELM / EG_PROMETHEUS / EG_PROMTOOL name existing binaries: each one
#      named is used as is.
#   2. KUBEBUILDER_ASSETS (the envtest convention) holds kube-apiserver and
#      etcd (and, where present, any of the others).
#   3. a binary in the output folder newer than its pins is kept; one of the programs
#      every release shares is copied from another release's folder.
# Whatever is still missing is built from the Go module proxy, with Go 1.27.3
# where the pins ask for a newer Go than the local one (release.sh).
#
# Prints the folder holding the programs on its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v go >/dev/null || { echo "build.sh: Go is required (go 1.26 or newer): https://go.dev/doc/install" >&2; exit 1; }
# shellcheck source-path=SCRIPTDIR source=release.sh
. "$here/release.sh"
kube_release || exit 1
k8s_version=$kube_version
out="${EG_CONTROLPLANE_DIR:-$root/target/controlplane/$k8s_version/bin}"
mkdir -p "$out"
echo "controlplane: Kubernetes $k8s_version (KUBE_VERSION=${KUBE_VERSION:-, the newest pinned})"

# program  module-dir  package; the programs of the module folders without a
# release in their name are the same for every release.
programs=(
  "kube-apiserver kubernetes/$kube_minor k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager kubernetes/$kube_minor k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler kubernetes/$kube_minor k8s.io/kubernetes/cmd/kube-scheduler"
  "kubelet kubernetes/$kube_minor k8s.io/kubernetes/cmd/kubelet"
  "kube-proxy kubernetes/$kube_minor k8s.io/kubernetes/cmd/kube-proxy"
  "etcd etcd/$kube_minor go.etcd.io/etcd/server/v3"
  "etcdutl etcd/$kube_minor go.etcd.io/etcd/etcdutl/v3"
  "etcd-fault-proxy etcdproxy endpoints-guard.local/controlplane/etcdproxy"
  "etcd-peer-proxy peerproxy endpoints-guard.local/controlplane/peerproxy"
  "helm helm helm.sh/helm/v4/cmd/helm"
  "prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus"
  "promtool prometheus github.com/prometheus/prometheus/cmd/promtool"
)

# built_from BINARY MODULE-DIR: the binary exists and is newer than the
# module's pins and sources (changed pins rebuild it; Go's build cache makes
# that a link where the packages did not change).
built_from() {
  local source
  [ -x "$1" ] || return 1
  for source in "$here/$2"/go.mod "$here/$2"/go.sum "$here/$2"/*.go; do
    [ ! -e "$source" ] || [ "$1" -nt "$source" ] || return 1
  done
}

# built_for_another_release NAME MODULE-DIR: a binary of a program every
# release shares, built from the same pins in another release's folder.
built_for_another_release() {
  local candidate
  for candidate in "$root"/target/controlplane/*/bin/"$1"; do
    if [ "$candidate" != "$out/$1" ] && [ ! -L "$candidate" ] && built_from "$candidate" "$2"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

explicit_for() {
  case "$1" in
    kube-apiserver) echo "${EG_KUBE_APISERVER:-}" ;;
    kube-controller-manager) echo "${EG_KUBE_CONTROLLER_MANAGER:-}" ;;
    etcd) echo "${EG_ETCD:-}" ;;
    etcdutl) echo "${EG_ETCDUTL:-}" ;;
    helm) echo "${EG_HELM:-}" ;;
    prometheus) echo "${EG_PROMETHEUS:-}" ;;
    promtool) echo "${EG_PROMTOOL:-}" ;;
  esac
}

for entry in "${programs[@]}"; do
  read -r name dir pkg <<<"$entry"
  given=$(explicit_for "$name")
  if [ -z "$given" ] && [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/$name" ]; then
    given="$KUBEBUILDER_ASSETS/$name"
  fi
  if [ -n "$given" ]; then
    [ -x "$given" ] || { echo "build.sh: $name: $given is not an executable file" >&2; exit 1; }
    ln -sf "$(cd "$(dirname "$given")" && pwd)/$(basename "$given")" "$out/$name"
    echo "controlplane: $name: using $given"
    continue
  fi
  if [ ! -L "$out/$name" ] && built_from "$out/$name" "$dir"; then
    echo "controlplane: $name: reusing $out/$name"
    continue
  fi
  if [ "$dir" = "${dir%/v1.*}" ] && shared=$(built_for_another_release "$name" "$dir"); then
    cp -p "$shared" "$out/$name.tmp"
    mv "$out/$name.tmp" "$out/$name"
    echo "controlplane: $name: copied from $shared"
    continue
  fi
  echo "controlplane: building $name ($pkg) — the first build downloads modules and takes minutes"
  start=$(date +%s)
  ldflags='-s -w'
  if [ "$dir" = "kubernetes/$kube_minor" ]; then
    # Upstream's release build stamps the version; without it the binaries
    # report v0.0.0-master to clients (helm reads it for chart kubeVersion).
    minor=$(echo "$k8s_version" | cut -d. -f2)
    v=k8s.io/component-base/version
    ldflags="$ldflags -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
  fi
  if [ "$dir" = prometheus ]; then
    # Prometheus 3.x is published as module v0.3MM.P (3.5.0 = v0.305.0); its
    # release build stamps the version, which --version and the build-info API report.
    pv=$(awk '$1=="github.com/prometheus/prometheus" {print $2; exit}' "$here/prometheus/go.mod")
    n=$(echo "$pv" | cut -d. -f2)
    ldflags="$ldflags -X github.com/prometheus/common/version.Version=$((n / 100)).$((n % 100)).${pv##*.}"
  fi
  # -trimpath and no VCS stamping: the binary depends only on the pinned modules.
  (cd "$here/$dir" && go_for go.mod && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -buildvcs=false \
     -ldflags="$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "controlplane: built $name in $(( $(date +%s) - start ))s"
done
echo "$out"
