#!/usr/bin/env bash
# Shared by the hack/ scripts: the repository root and how to find helm.
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
