#!/usr/bin/env bash
# The images a real node runs (make e2e-node), made here and imported into its
# containerd, since no image can be pulled:
#   eg.local/pause:e2e            the pod sandbox (tests/node/images/pause)
#   eg.local/testserver:e2e       the workload behind the test Service
#                                 (tests/node/images/testserver)
#   eg.local/endpoints-guard:e2e  the controller image: the Dockerfile's runtime
#                                 stage assembled from the release binary
#                                 (assemble_controller_rootfs in hack/lib.sh)
#   eg.local/watch-chaos:e2e      the test-only sidecar: the Dockerfile's
#                                 watch-chaos stage, assembled the same way
# Each is a docker-archive tarball in target/e2e-node/images/ (hack/image-archive.py).
# Needs Go and the binaries in $EG_BIN_DIR (default target/release: cargo build
# --release -p endpoints-guard -p watch-chaos --bins).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

out="$root/target/e2e-node/images"
work="$root/target/e2e-node/rootfs"
rm -rf "$work"
mkdir -p "$out" "$work/pause" "$work/testserver"

(cd "$root/tests/node/images" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/pause/pause" ./pause)
(cd "$root/tests/node/images" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/testserver/testserver" ./testserver)
assemble_controller_rootfs "$work/endpoints-guard" "${EG_BIN_DIR:-$root/target/release}"
assemble_controller_rootfs "$work/watch-chaos" "${EG_BIN_DIR:-$root/target/release}" watch-chaos

archive() {
  python3 "$root/hack/image-archive.py" --rootfs "$work/$1" --tag "$2" --out "$out/$1.tar" \
    --entrypoint "$3" --user 65532:65532
}
archive pause eg.local/pause:e2e '["/pause"]'
archive testserver eg.local/testserver:e2e '["/testserver"]'
archive endpoints-guard eg.local/endpoints-guard:e2e '["/usr/local/bin/endpoints-guard"]'
archive watch-chaos eg.local/watch-chaos:e2e '["/usr/local/bin/watch-chaos"]'
rm -rf "$work"
echo "$out"
