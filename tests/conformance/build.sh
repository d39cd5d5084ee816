#!/usr/bin/env bash
# Builds what `make conformance` runs besides the control plane, into
# target/conformance/, from the Go modules beside this script:
#   bin/e2e-network.test  upstream's e2e specs of k8s.io/kubernetes/test/e2e/network
#                         (e2e/: the network suite only, which builds in a fraction
#                         of the time of the whole e2e.test), pinned like
#                         tests/controlplane/kubernetes
#   bin/kwok              KWOK (sigs.k8s.io/kwok, kwok/): fake nodes and pod lifecycles
#   kwok-stages.yaml      KWOK's own node and pod stages, read from its module
#   bin/agnhost           upstream's test image program (node/, the same pins as
#                         e2e/), for the real-node specs' image
#                         (hack/conformance-node.sh)
#   bin/kubectl           kubectl of the same release (node/), which the suite runs
#                         for `kubectl exec` (--kubectl-path)
# A binary newer than its module files is reused. kube-scheduler comes from
# `make controlplane`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/target/conformance"
mkdir -p "$out/bin"
command -v go >/dev/null || { echo "conformance/build.sh: Go is required (go 1.26 or newer)" >&2; exit 1; }

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
if fresh "$e2e" "$here/go.mod" "$here/go.sum" "$here"/e2e/*.go; then
  echo "conformance: e2e-network.test: reusing $e2e"
else
  timed e2e-network.test bash -c "cd '$here' && go test -c -trimpath -buildvcs=false -ldflags='-s -w' -o '$e2e.tmp' ./e2e && mv '$e2e.tmp' '$e2e'"
fi

kwok="$out/bin/kwok"
if fresh "$kwok" "$here/kwok/go.mod" "$here/kwok/go.sum"; then
  echo "conformance: kwok: reusing $kwok"
else
  timed kwok bash -c "cd '$here/kwok' && go build -trimpath -buildvcs=false -ldflags='-s -w' -o '$kwok.tmp' sigs.k8s.io/kwok/cmd/kwok && mv '$kwok.tmp' '$kwok'"
fi

# Stamped with the release, as upstream's build does (else kubectl reports
# v0.0.0-master); the version is the one node/go.mod pins.
k8s_version=$(cd "$here/node" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
v=k8s.io/component-base/version
stamp="-X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$(echo "$k8s_version" | cut -d. -f2) -X $v.gitTreeState=clean"
for tool in test/images/agnhost cmd/kubectl; do
  bin="$out/bin/${tool##*/}"
  if fresh "$bin" "$here/node/go.mod" "$here/node/go.sum"; then
    echo "conformance: ${tool##*/}: reusing $bin"
  else
    timed "${tool##*/}" bash -c "cd '$here/node' && go build -trimpath -buildvcs=false -ldflags='-s -w $stamp' -o '$bin.tmp' k8s.io/kubernetes/$tool && mv '$bin.tmp' '$bin'"
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
