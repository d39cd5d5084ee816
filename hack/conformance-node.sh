#!/usr/bin/env bash
# Prepares the real-node part of make conformance (docs/conformance.md): as
# root, installs the Debian packages the real node needs when missing (as
# hack/e2e-node.sh does: containerd, runc, containernetworking-plugins,
# iptables, nftables, conntrack, ca-certificates; and curl and wget, which go into the
# agnhost image); not root, or without apt-get, it says so and exits 0, and
# eg-conformance skips the real-node specs. Then it makes the images
# upstream's real-node e2e specs run, imported into the node's containerd
# since no image can be pulled, named as the e2e framework of the release
# KUBE_VERSION picks asks for them (their tags read from
# test/utils/image/manifest.go of that k8s.io/kubernetes module), so no
# KUBE_TEST_REPO_LIST is needed:
#   registry.k8s.io/e2e-test-images/agnhost:<that release's tag>
#       /agnhost built from k8s.io/kubernetes/test/images/agnhost
#       (tests/conformance/build.sh), with what the specs run through
#       `/bin/sh -c`: dash as /bin/sh, Debian's static busybox (seq, ...),
#       nc from netcat-openbsd (-t, -u, -v, -w, as in upstream's image),
#       curl and wget, with the shared libraries they link
#   registry.k8s.io/pause:<that release's tag> and eg.local/pause:e2e
#       tests/node/images/pause: pods the specs make with the pause image, and
#       the node's sandbox image
# Each is a docker-archive tarball in target/conformance/<k8s-version>/images/
# (hack/image-archive.py). busybox-static and netcat-openbsd are fetched with
# apt-get download into target/conformance/debs/ and unpacked there, never
# installed.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

log() { echo "conformance-node: $*" >&2; }
skip() {
  log "real-node specs will be skipped: $*"
  exit 0
}

packages=(containerd runc containernetworking-plugins iptables nftables conntrack ca-certificates curl wget)
need_node_packages "${packages[@]}"

# shellcheck source=../tests/controlplane/release.sh
. "$root/tests/controlplane/release.sh"
kube_release || die "KUBE_VERSION=${KUBE_VERSION:-}: no such release"
release="$root/target/conformance/$kube_version"
agnhost="$release/bin/agnhost"
[ -x "$agnhost" ] || die "$agnhost is missing: run 'KUBE_VERSION=${KUBE_VERSION:-} bash tests/conformance/build.sh'"

# image_tag NAME: the tag the release's e2e framework gives image NAME.
manifest="$(cd "$root/tests/conformance/node/$kube_minor" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/utils/image/manifest.go"
image_tag() {
  local tag
  tag=$(sed -n "s/^[[:space:]]*configs\[$1\] = Config{[^,]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$manifest")
  [ -n "$tag" ] || die "no tag of image $1 in $manifest"
  echo "$tag"
}
agnhost_tag=registry.k8s.io/e2e-test-images/agnhost:$(image_tag Agnhost)
pause_tag=registry.k8s.io/pause:$(image_tag Pause)
log "Kubernetes $kube_version: $agnhost_tag, $pause_tag"

out="$release/images"
debs="$root/target/conformance/debs"
work="$release/rootfs"
command -v curl >/dev/null || die "curl is missing: install Debian's curl"
rm -rf "$work"
mkdir -p "$out" "$debs" "$work/pause" "$work/agnhost"

# unpacked PACKAGE: the folder holding Debian's PACKAGE, downloaded once.
unpacked() {
  local dir="$debs/$1"
  if [ ! -d "$dir" ]; then
    # apt-get download writes into the current folder; _apt cannot write
    # to target/, so it warns and downloads as root.
    (cd "$debs" && apt-get download -qq "$1" 2>/dev/null) || die "apt-get download $1 failed"
    dpkg-deb -x "$debs/$1"_*.deb "$dir.tmp"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

rootfs="$work/agnhost"
cp "$agnhost" "$rootfs/agnhost"
# Upstream's image has it too; entrypoint specs run it by this name.
ln -s agnhost "$rootfs/agnhost-2"
mkdir -p "$rootfs/bin" "$rootfs/usr/bin" "$rootfs/tmp" "$rootfs/uploads" "$rootfs/etc"
chmod 1777 "$rootfs/tmp"
busybox="$(unpacked busybox-static)/bin/busybox"
cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
  case "$applet" in
    # Its own name is in the list; busybox's nc knows neither -t, -u nor -v;
    # its sh runs its own applets before PATH (nc included), so sh is dash.
    # Its static wget crashes resolving without the NSS modules it was
    # built for: Debian's wget instead.
    busybox | nc | sh | wget) ;;
    *) ln -s busybox "$rootfs/bin/$applet" ;;
  esac
done
nc="$(unpacked netcat-openbsd)/bin/nc.openbsd"
cp "$nc" "$rootfs/bin/nc"
cp "$(command -v curl)" "$rootfs/usr/bin/curl"
dash=$(command -v dash) || die "dash is missing: install Debian's dash"
cp "$dash" "$rootfs/bin/sh"
wget=$(command -v wget) || die "wget is missing: install Debian's wget"
cp "$wget" "$rootfs/usr/bin/wget"
for lib in $(for bin in "$nc" "$(command -v curl)" "$dash" "$wget"; do shared_libraries "$bin"; done | sort -u); do
  copy_into_rootfs "$rootfs" "$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"

(cd "$root/tests/node/images" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/pause/pause" ./pause)

python3 "$root/hack/image-archive.py" --rootfs "$work/agnhost" --tag "$agnhost_tag" \
  --out "$out/agnhost.tar" --entrypoint '["/agnhost"]' --cmd '["pause"]' >/dev/null
python3 "$root/hack/image-archive.py" --rootfs "$work/pause" --tag "$pause_tag" --tag eg.local/pause:e2e \
  --out "$out/pause.tar" --entrypoint '["/pause"]' >/dev/null
rm -rf "$work"
log "images in $out"
