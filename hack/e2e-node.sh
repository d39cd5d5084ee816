#!/usr/bin/env bash
# make e2e-node: endpoints-guard's chart on a real one-node cluster on this host
# (kubelet, containerd, kube-proxy, a CNI bridge), traffic through a Service as
# the judge, every fault row against endpoints-guard and against
# kube-controller-manager's own endpoint controllers (tests/e2e/real_node/,
# docs/e2e-node.md).
#
#   hack/e2e-node.sh [full|short]    (default full; make test runs short)
#
# As root it installs what is missing (Debian: containerd, runc,
# containernetworking-plugins, iptables, nftables, conntrack, ca-certificates);
# not root, or without apt-get, it says so in one line and exits 0. It refuses to run
# beside a kubelet, containerd or kube-proxy it did not start. The host is
# compared before and after; a failed run keeps its logs and prints where.
#
# Environment:
#   EG_IMAGE_PROFILE  cargo profile whose binaries go into the controller image:
#                     release (default) or debug (make test, already built)
#   CARGO             cargo binary (default cargo)
#   EG_E2E_NODE_ONLY  at-scale or overload: that row alone, on a node of its own
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

form=${1:-full}
profile=${EG_IMAGE_PROFILE:-release}
cargo=${CARGO:-cargo}
packages=(containerd runc containernetworking-plugins iptables nftables conntrack ca-certificates)

log() { echo "e2e-node: $*" >&2; }
skip() {
  log "skipped: $*"
  exit 0
}

case "$form" in full | short) ;; *) die "usage: $0 [full|short]" ;; esac
case "$profile" in release | debug) ;; *) die "EG_IMAGE_PROFILE must be release or debug" ;; esac

need_node_packages "${packages[@]}"

# One node at a time: a second run (a conformance run on the node, another
# checkout's make test) waits for the first instead of finding its kubelet.
exec 9>/run/eg-e2e-node.lock
if ! flock -n 9; then
  log "another real-node run holds /run/eg-e2e-node.lock; waiting for it"
  flock -w 3600 9 || die "waited an hour for /run/eg-e2e-node.lock"
fi

for program in kubelet containerd kube-proxy; do
  if pgrep -x "$program" >/dev/null; then
    die "a $program this run did not start is running (pid $(pgrep -x "$program" | tr '\n' ' ')): refusing to touch its node"
  fi
done

if [ "$profile" = release ]; then
  log "building the release binaries"
  (cd "$root" && "$cargo" build --release -p endpoints-guard -p watch-chaos --bins)
else
  (cd "$root" && "$cargo" build -p endpoints-guard -p watch-chaos --bins)
fi
log "building the node images"
EG_BIN_DIR="$root/target/$profile" bash "$root/hack/node-images.sh" >/dev/null

rows() {
  (cd "$root" && EG_E2E_NODE="$form" "$cargo" test --test e2e -- --nocapture --exact real_node::rows_under_traffic)
}
if [ -n "${EG_E2E_NODE_ONLY:-}" ]; then
  log "running tests/e2e/real_node/ ($form, $EG_E2E_NODE_ONLY only)"
  rows
else
  log "running tests/e2e/real_node/ ($form)"
  rows
  # A node of its own: API Priority and Fairness on, with seats two cores
  # can fill (the other rows keep it off).
  log "running the overload row ($form)"
  EG_E2E_NODE_ONLY=overload rows
fi
