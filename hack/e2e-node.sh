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
# compared before and after; a failed run keeps its logs and prints where;
# a run stopped part way (INT, TERM) takes its node down before it exits.
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
(cd "$root" && "$cargo" build -q -p eg-node --bin eg-node-clean)
cleaner="$root/target/debug/eg-node-clean"
log "building the node images"
EG_BIN_DIR="$root/target/$profile" bash "$root/hack/node-images.sh" >/dev/null

# Process $1 and everything under it, deepest first (none is reparented
# before it is signalled).
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}

# Stopped or killed part way (Ctrl-C, a job stopped, a CI timeout), the
# test process dies without taking its node down: do it here, so no
# kubelet, shim, bridge or rule outlives the run.
rows_pid=
take_down() {
  local status=$?
  trap - EXIT INT TERM
  if [ -n "$rows_pid" ]; then
    kill_tree "$rows_pid"
    wait "$rows_pid" 2>/dev/null || true
  fi
  if [ -e /run/eg-e2e-node.json ]; then
    log "taking down the node of the interrupted run"
    "$cleaner" || log "the node was not fully taken down; the next run tries again"
  fi
  exit "$status"
}
trap take_down EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# In the background so a signal reaches take_down at once, not when the
# test ends.
rows() {
  (cd "$root" && EG_E2E_NODE="$form" "$cargo" test --test e2e -- --nocapture --exact real_node::rows_under_traffic) &
  rows_pid=$!
  wait "$rows_pid"
  rows_pid=
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
