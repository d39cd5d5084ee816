#!/usr/bin/env bash
# make image-smoke: the runtime stage of the Dockerfile, assembled from what is on
# this machine (no image can be pulled), run under the chart's security settings
# against the local control plane. See docs/image-smoke.md.
#
# 1. Assembles an image FROM scratch from the root file system of
#    assemble_controller_rootfs (hack/lib.sh: the release binaries, their shared
#    libraries, a CA bundle, uid/gid 65532); USER 65532:65532, EXPOSE 8080, the
#    same ENTRYPOINT as the Dockerfile.
# 2. Runs tests/e2e/image_smoke.rs (EG_IMAGE_SMOKE=1), which starts the control plane,
#    applies the chart's RBAC, and runs the image with --read-only, --user
#    65532:65532, --cap-drop ALL, --security-opt no-new-privileges on the host
#    network, a ServiceAccount token mounted where in-cluster config reads it.
#
# Skips (exit 0) when Docker is absent or no daemon can be reached; as root with
# Debian's docker.io installed, starts dockerd itself (and stops it at the end).
#
# Environment:
#   IMAGE          tag to build and test (default endpoints-guard:smoke); removed at the end
#   KEEP_IMAGE=1   keep the image
#   CARGO          cargo binary (default cargo)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

image=${IMAGE:-endpoints-guard:smoke}
cargo=${CARGO:-cargo}
work="$root/target/image-smoke"
context="$work/context"
dockerd_pid=
host_before=
# Files dockerd writes outside its data and exec roots, and those of them it made.
docker_paths="/etc/docker/key.json /etc/docker /run/docker"
docker_paths_made=

log() { echo "image-smoke: $*" >&2; }
skip() {
  log "skipped: $*"
  exit 0
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

cleanup() {
  if [ "${KEEP_IMAGE:-0}" != 1 ]; then
    docker rmi -f "$image" >/dev/null 2>&1 || true
  fi
  rm -rf "$context"
  if [ -n "$dockerd_pid" ]; then
    log "stopping the dockerd this script started (pid $dockerd_pid)"
    kill "$dockerd_pid" 2>/dev/null || true
    wait "$dockerd_pid" 2>/dev/null || true
    # dockerd leaves its default network namespace bind-mounted.
    local mnt
    awk -v w="$work/docker" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
      while read -r mnt; do umount "$mnt" || true; done
    rm -rf "$work/docker" "$work/docker-exec"
    local path
    for path in $docker_paths_made; do
      rm -rf "$path"
    done
    if [ "$(host_state)" != "$host_before" ]; then
      log "the host differs from before dockerd started:"
      diff <(echo "$host_before") <(host_state) >&2 || true
      exit 1
    fi
    log "host as before dockerd started: iptables, links, ip_forward, mounts, $docker_paths"
  fi
}

# What a Docker daemon is known to change on the host (rule counters left out).
host_state() {
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//'
  ip -br link 2>/dev/null | awk '{print $1}'
  cat /proc/sys/net/ipv4/ip_forward
  awk '{ print $2 }' /proc/mounts | sort
  # shellcheck disable=SC2086 # a list of paths
  ls -d $docker_paths 2>/dev/null || true
}

# A reachable Docker daemon, or skip. As root, with dockerd installed, starts one.
ensure_docker() {
  command -v docker >/dev/null ||
    skip "docker not found (Debian/Ubuntu: apt-get install docker.io); 'make e2e-kind' on a real cluster also needs it"
  if docker info >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null; then
    skip "docker is installed but no daemon is reachable (start dockerd, or run as root with dockerd installed)"
  fi
  mkdir -p "$work"
  host_before=$(host_state)
  local path
  for path in $docker_paths; do
    [ -e "$path" ] || docker_paths_made+=" $path"
  done
  log "no Docker daemon running: starting dockerd (log: $work/dockerd.log)"
  # The containers here use --network none or host, so the daemon needs no
  # bridge: without these flags dockerd adds docker0, iptables chains and a
  # masquerade rule, turns ip_forward on and sets FORWARD's policy to DROP,
  # and leaves all of it behind when it stops.
  dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
    --data-root "$work/docker" --exec-root "$work/docker-exec" \
    --pidfile "$work/docker.pid" >"$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  local i
  for ((i = 0; i < 60; i++)); do
    if docker info >/dev/null 2>&1; then
      return
    fi
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      dockerd_pid=
      tail -n 20 "$work/dockerd.log" >&2
      skip "dockerd exited at start-up (log above: $work/dockerd.log)"
    fi
    sleep 0.5
  done
  tail -n 20 "$work/dockerd.log" >&2
  die "dockerd started but did not answer within 30s (log: $work/dockerd.log)"
}

assemble() {
  rm -rf "$context"
  assemble_controller_rootfs "$context/rootfs"
  # The runtime stage of the Dockerfile, on an empty base.
  cat >"$context/Dockerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/endpoints-guard"]
EOF
  log "image contents:"
  (cd "$context/rootfs" && find . -type f -printf '  /%P %s bytes\n' | sort) >&2
}

main() {
  local start step out
  start=$(now)
  ensure_docker
  trap cleanup EXIT
  log "docker: client $(docker version -f '{{.Client.Version}}' 2>/dev/null), server $(docker version -f '{{.Server.Version}}' 2>/dev/null)"

  step=$(now)
  assemble
  # The legacy builder (no buildx here) is enough for COPY into scratch; its
  # deprecation notice is noise, so output is shown only on failure.
  if ! out=$(docker build -t "$image" "$context" 2>&1); then
    echo "$out" >&2
    die "docker build failed"
  fi
  log "built $image ($(docker image inspect -f '{{.Size}}' "$image") bytes, user $(docker image inspect -f '{{.Config.User}}' "$image")) in $(since "$step")"

  # The loader, libraries and binary work together under the chart's settings.
  local version
  version=$(docker run --rm --network none --read-only --user 65532:65532 --cap-drop ALL \
    --security-opt no-new-privileges "$image" --version) || die "the image does not run: $version"
  log "docker run $image --version: $version"

  step=$(now)
  log "running: EG_IMAGE_SMOKE=1 EG_IMAGE_SMOKE_IMAGE=$image $cargo test --test e2e -- --nocapture image_smoke::"
  (cd "$root" && EG_IMAGE_SMOKE=1 EG_IMAGE_SMOKE_IMAGE="$image" "$cargo" test --test e2e -- --nocapture image_smoke::)
  log "cargo test --test e2e image_smoke:: took $(since "$step")"
  log "passed in $(since "$start")"
}

main "$@"
