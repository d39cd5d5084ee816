#!/usr/bin/env bash
# Shared by the hack/ scripts: the repository root, how to find helm, and the
# controller image's root file system.
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export root

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# helm: $HELM, else the one `make controlplane` builds, else helm on PATH.
find_helm() {
  if [ -n "${HELM:-}" ]; then
    echo "$HELM"
    return
  fi
  local built
  for built in "$root"/target/controlplane/*/bin/helm; do
    if [ -x "$built" ]; then
      echo "$built"
      return
    fi
  done
  if command -v helm >/dev/null; then
    command -v helm
    return
  fi
  die "helm not found: set HELM, run 'make controlplane', or install helm"
}

# Copies FILE into the root file system ROOTFS at the same path, following
# symlinks (the libraries are symlinks to versioned files on Debian).
copy_into_rootfs() {
  mkdir -p "$1$(dirname "$2")"
  cp -L "$2" "$1$2"
}

# The shared libraries and the loader BINARY needs, as absolute paths.
shared_libraries() {
  local deps
  deps=$(ldd "$1") || die "ldd $1 failed"
  if grep -q 'not found' <<<"$deps"; then
    die "ldd $1: a library is missing: $deps"
  fi
  # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and
  # "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$deps"
}

# A stage of the Dockerfile (distroless cc: glibc, libgcc, CA certificates,
# uid/gid 65532), assembled in ROOTFS from what is on this machine, since no
# base image can be pulled: PROGRAM (default endpoints-guard, the runtime
# stage; watch-chaos for the test image) from BIN_DIR (default
# target/release), the libraries and loader it links, Debian's CA bundle (a
# TLS client that loads the system roots fails without one), /etc/passwd and
# /etc/group. Usage: assemble_controller_rootfs ROOTFS [BIN_DIR [PROGRAM]]
assemble_controller_rootfs() {
  local rootfs=$1 bins=${2:-$root/target/release} program=${3:-endpoints-guard} lib bundle=/etc/ssl/certs/ca-certificates.crt
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs"
  [ -x "$bins/$program" ] ||
    die "$bins/$program is missing: run 'cargo build --release -p endpoints-guard -p watch-chaos --bins'"
  cp "$bins/$program" "$rootfs/usr/local/bin/$program"
  # A debug build carries hundreds of MB of debug info the image has no use for.
  if command -v strip >/dev/null; then strip --strip-debug "$rootfs/usr/local/bin/$program"; fi
  for lib in $(shared_libraries "$bins/$program" | sort -u); do
    copy_into_rootfs "$rootfs" "$lib"
  done
  [ -s "$bundle" ] || die "$bundle is missing: install Debian's ca-certificates"
  cp -L "$bundle" "$rootfs$bundle"
  # As in distroless: root, and nonroot with uid/gid 65532.
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
}

# Installs the Debian packages a real node needs ("$@") where they are
# missing. Where it cannot (not root, or no apt-get), prints why on stdout and
# returns 1: the caller skips the run with that reason. Where apt-get fails,
# prints that and returns 2: the caller fails. (Run as `$(...)` in an `if`,
# errexit is off inside, hence the explicit checks.)
install_node_packages() {
  if [ "$(id -u)" != 0 ]; then
    echo "a real node needs root (kubelet, containerd, iptables, mounts)"
    return 1
  fi
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null; then
    echo "missing ${missing[*]} and no apt-get to install them"
    return 1
  fi
  echo "installing ${missing[*]}" >&2
  if ! apt-get update -qq >/dev/null; then
    echo "apt-get update failed"
    return 2
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "apt-get install ${missing[*]} failed"
    return 2
  fi
  # Debian's containerd package may start its service where an init system
  # runs one; the node runs its own containerd.
  if command -v service >/dev/null && pgrep -x containerd >/dev/null; then
    service containerd stop >/dev/null 2>&1 || true
  fi
}

# install_node_packages for a script that defines skip(): skips the run where
# the packages cannot be installed, fails where apt-get failed.
need_node_packages() {
  local status=0 reason
  reason=$(install_node_packages "$@") || status=$?
  case "$status" in
    0) ;;
    1) skip "$reason" ;;
    *) die "$reason" ;;
  esac
}
