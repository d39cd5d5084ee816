#!/usr/bin/env bash
# Builds what `make conformance` runs besides the control plane, into
# target/conformance/<k8s-version>/, for the release KUBE_VERSION names (as
# tests/controlplane/build.sh; default the newest pinned), from the Go
# modules beside this script:
#   bin/e2e-network.test  upstream's e2e specs of k8s.io/kubernetes/test/e2e/network
#                         (e2e/: the network suite only, which builds in a fraction
#                         of the time of the whole e2e.test), pinned per release
#                         by <release>/go.mod (passed as -modfile)
#   bin/kwok              KWOK (sigs.k8s.io/kwok, kwok/): fake nodes and pod
#                         lifecycles, the same for every release
#   kwok-stages.yaml      KWOK's own node and pod stages, read from its module
#   bin/agnhost           upstream's test image program (node/<release>/, the
#                         same release), for the real-node specs' image
#                         (hack/conformance-node.sh)
#   bin/kubectl           kubectl of the same release (node/<release>/), which
#                         the suite runs for `kubectl exec` (--kubectl-path)
# A binary newer than its module files is reused. kube-scheduler comes from
# `make controlplane`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v go >/dev/null || { echo "conformance/build.sh: Go is required (go 1.26 or newer)" >&2; exit 1; }
# shellcheck source-path=SCRIPTDIR source=../controlplane/release.sh
. "$here/../controlplane/release.sh"
kube_release || exit 1
out="$root/target/conformance/$kube_version"
mkdir -p "$out/bin"
echo "conformance: Kubernetes $kube_version"
go_for "$here/$kube_minor/go.mod" "$here/node/$kube_minor/go.mod" "$here/kwok/go.mod"

# Same flags as tests/controlplane/build.sh, so the packages both builds share
# (client-go, apimachinery, ...) come from one build cache.
export GOFLAGS=-mod=readonly CGO_ENABLED=0

fresh() { # fresh BINARY SOURCE...: the binary exists and is newer than every source
  local bin=$1; shift
  [ -x "$bin" ] || return 1
  local src
  for src in "$@"; do
    [ "$bin" -nt "$src" ] || return 1
  done
}

timed() { # timed NAME COMMAND...
  local name=$1; shift
  local start
  start=$(date +%s)
  echo "conformance: building $name — the first build downloads modules and takes minutes"
  "$@"
  echo "conformance: built $name in $(( $(date +%s) - start ))s"
}

e2e="$out/bin/e2e-network.test"
pins="$here/$kube_minor"
# The release's e2e framework sets up gomega's formatting from a package that
# moved in 1.37 (e2e/format.go, e2e/format_ktesting.go).
tags=
if [ -d "$(cd "$here" && go list -modfile="$pins/go.mod" -m -f '{{.Dir}}' k8s.io/kubernetes)/test/utils/ktesting/format" ]; then
  tags=eg_ktesting_format
fi
if fresh "$e2e" "$pins/go.mod" "$pins/go.sum" "$here"/e2e/*.go; then
  echo "conformance: e2e-network.test: reusing $e2e"
else
  timed e2e-network.test bash -c "cd '$here' && go test -modfile='$pins/go.mod' -tags='$tags' -c -trimpath -buildvcs=false -ldflags='-s -w' -o '$e2e.tmp' ./e2e && mv '$e2e.tmp' '$e2e'"
fi

# KWOK is the same for every release: another release's build is copied.
kwok="$out/bin/kwok"
shared_kwok=
for candidate in "$root"/target/conformance/*/bin/kwok; do
  if [ "$candidate" != "$kwok" ] && fresh "$candidate" "$here/kwok/go.mod" "$here/kwok/go.sum"; then
    shared_kwok=$candidate
    break
  fi
done
if fresh "$kwok" "$here/kwok/go.mod" "$here/kwok/go.sum"; then
  echo "conformance: kwok: reusing $kwok"
elif [ -n "$shared_kwok" ]; then
  cp -p "$shared_kwok" "$kwok.tmp"
  mv "$kwok.tmp" "$kwok"
  echo "conformance: kwok: copied from $shared_kwok"
else
  timed kwok bash -c "cd '$here/kwok' && go build -trimpath -buildvcs=false -ldflags='-s -w' -o '$kwok.tmp' sigs.k8s.io/kwok/cmd/kwok && mv '$kwok.tmp' '$kwok'"
fi

# Stamped with the release, as upstream's build does (else kubectl reports
# v0.0.0-master); the version is the one node/<release>/go.mod pins.
node="$here/node/$kube_minor"
k8s_version=$(cd "$node" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
v=k8s.io/component-base/version
stamp="-X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$(echo "$k8s_version" | cut -d. -f2) -X $v.gitTreeState=clean"
for tool in test/images/agnhost cmd/kubectl; do
  bin="$out/bin/${tool##*/}"
  if fresh "$bin" "$node/go.mod" "$node/go.sum"; then
    echo "conformance: ${tool##*/}: reusing $bin"
  else
    timed "${tool##*/}" bash -c "cd '$node' && go build -trimpath -buildvcs=false -ldflags='-s -w $stamp' -o '$bin.tmp' k8s.io/kubernetes/$tool && mv '$bin.tmp' '$bin'"
  fi
done

# KWOK's stages as its kustomizations list them: nodes become Ready at once and
# keep a Lease; pods are created (an IP from their node's podCIDR), run, turn
# Ready, complete, and go when deleted.
stages_dir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
{
  for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/general/pod-create pod/general/pod-init-container-running \
    pod/general/pod-init-container-completed pod/general/pod-ready \
    pod/general/pod-complete pod/general/pod-delete; do
    echo "---"
    cat "$stages_dir/$stage.yaml"
  done
} >"$out/kwok-stages.yaml.tmp"
mv "$out/kwok-stages.yaml.tmp" "$out/kwok-stages.yaml"
echo "$out"
