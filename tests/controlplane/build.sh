#!/usr/bin/env bash
# Builds (or reuses) the programs the local control plane runs, pinned by the
# Go modules beside this script, into target/controlplane/<k8s-version>/bin/:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy (the real node of make e2e-node), etcd and etcdutl (its snapshot
# restore tool, same etcd release), helm, prometheus and promtool, and
# etcd-fault-proxy (our own gRPC proxy between kube-apiserver and etcd that can
# drop watch events).
#
# Reuse, in this order:
#   1. EG_KUBE_APISERVER / EG_KUBE_CONTROLLER_MANAGER / EG_ETCD / EG_ETCDUTL /
#      EG_HELM / EG_PROMETHEUS / EG_PROMTOOL name existing binaries: each one
#      named is used as is.
#   2. KUBEBUILDER_ASSETS (the envtest convention) holds kube-apiserver and
#      etcd (and, where present, any of the others).
#   3. a binary already in the output folder is kept.
# Whatever is still missing is built from the Go module proxy.
#
# Prints the folder holding the programs on its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
k8s_version=$(awk '$1=="k8s.io/kubernetes" {print $2; exit}' "$here/kubernetes/go.mod")
[ -n "$k8s_version" ] || { echo "build.sh: no k8s.io/kubernetes version in $here/kubernetes/go.mod" >&2; exit 1; }
out="${EG_CONTROLPLANE_DIR:-$root/target/controlplane/$k8s_version/bin}"
mkdir -p "$out"

command -v go >/dev/null || { echo "build.sh: Go is required (go 1.26 or newer): https://go.dev/doc/install" >&2; exit 1; }

# program  module-dir  package
programs=(
  "kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager kubernetes k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler kubernetes k8s.io/kubernetes/cmd/kube-scheduler"
  "kubelet kubernetes k8s.io/kubernetes/cmd/kubelet"
  "kube-proxy kubernetes k8s.io/kubernetes/cmd/kube-proxy"
  "etcd etcd endpoints-guard.local/controlplane/etcd"
  "etcdutl etcd go.etcd.io/etcd/etcdutl/v3"
  "etcd-fault-proxy etcdproxy endpoints-guard.local/controlplane/etcdproxy"
  "helm helm helm.sh/helm/v4/cmd/helm"
  "prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus"
  "promtool prometheus github.com/prometheus/prometheus/cmd/promtool"
)

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
  if [ -x "$out/$name" ] && [ ! -L "$out/$name" ]; then
    echo "controlplane: $name: reusing $out/$name"
    continue
  fi
  echo "controlplane: building $name ($pkg) — the first build downloads modules and takes minutes"
  start=$(date +%s)
  ldflags='-s -w'
  if [ "$dir" = kubernetes ]; then
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
  (cd "$here/$dir" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -buildvcs=false \
     -ldflags="$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "controlplane: built $name in $(( $(date +%s) - start ))s"
done
echo "$out"
