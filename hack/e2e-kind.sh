#!/usr/bin/env bash
# End-to-end test on a kind cluster whose upstream endpoints controller is off:
# build the image, load it into kind, install the chart (with the watch-chaos
# sidecar, a test-only chart value) and run the scenarios below against it.
#
# Usage:
#   hack/e2e-kind.sh [run]        everything (needs Docker, kind, kubectl, helm)
#   hack/e2e-kind.sh scenarios    only the scenarios, against $KUBECONFIG
#   hack/e2e-kind.sh kind-config  print the kind cluster config
#   hack/e2e-kind.sh helm-values  print the chart values the e2e installs with
#   hack/e2e-kind.sh helm-template  print `helm template` of what the e2e installs
#
# Environment:
#   KIND_CLUSTER_NAME  cluster name (default endpoints-guard-e2e)
#   KIND_NODE_IMAGE    kindest/node image (default: kind's own default)
#   KIND_WORKERS       worker nodes (default 2)
#   IMAGE              image to build and load (default endpoints-guard:e2e)
#   EG_CHAOS_FAULTS    space-separated watch-chaos faults, each passed as --fault
#                      (default "services:old-delete-rv pods:duplicate")
#   EG_E2E_TEST_CMD    extra command run after the scenarios, with KUBECONFIG set
#                      (e.g. a cargo test suite that targets an existing cluster)
#   KEEP_CLUSTER=1     do not delete the cluster at the end
#   HELM               helm binary (default: target/controlplane/*/bin/helm or PATH)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

cluster=${KIND_CLUSTER_NAME:-endpoints-guard-e2e}
workers=${KIND_WORKERS:-2}
image=${IMAGE:-endpoints-guard:e2e}
# The test-only sidecar's image: the Dockerfile's watch-chaos stage.
chaos_image=${image%:*}-watch-chaos:${image##*:}
faults=${EG_CHAOS_FAULTS:-services:old-delete-rv pods:duplicate}
release=endpoints-guard
namespace=endpoints-guard
test_ns=eg-e2e

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

log() { echo "--- e2e-kind: $*" >&2; }

kind_config() {
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
name: ${cluster}
kubeadmConfigPatches:
  - |
    kind: ClusterConfiguration
    controllerManager:
      extraArgs:
        controllers: "*,-endpoints-controller,-endpointslice-controller"
nodes:
  - role: control-plane
EOF
  local i
  for ((i = 0; i < workers; i++)); do
    echo "  - role: worker"
  done
}

helm_values() {
  cat "$root/hack/kind-values.yaml"
  echo "image:"
  echo "  repository: ${image%:*}"
  echo "  tag: \"${image##*:}\""
  echo "  pullPolicy: Never"
  echo "chaos:"
  echo "  enabled: true"
  echo "  image:"
  echo "    repository: ${chaos_image%:*}"
  echo "    tag: \"${chaos_image##*:}\""
  echo "  args:"
  echo "    - --listen=127.0.0.1:8001"
  echo "    - --control=127.0.0.1:8002"
  local fault
  for fault in $faults; do
    echo "    - --fault=${fault}"
  done
}

values_file() {
  helm_values >"$workdir/values.yaml"
  echo "$workdir/values.yaml"
}

helm_template() {
  "$(find_helm)" template "$release" "$root/charts/endpoints-guard" \
    --namespace "$namespace" -f "$(values_file)"
}

helm_install() {
  "$(find_helm)" upgrade --install "$release" "$root/charts/endpoints-guard" \
    --namespace "$namespace" --create-namespace -f "$(values_file)" --wait --timeout 5m
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is required (see README: kind e2e)"
  done
}

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: retry COMMAND every second.
wait_for() {
  local what=$1 timeout=$2 start
  shift 2
  start=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    if (($(date +%s) - start > timeout)); then
      die "timed out after ${timeout}s waiting for: $what"
    fi
    sleep 1
  done
}

endpoint_ips() {
  kubectl -n "$test_ns" get endpoints "$1" -o jsonpath='{.subsets[*].addresses[*].ip}' 2>/dev/null | wc -w
}

ips_are() {
  [ "$(endpoint_ips "$1")" -eq "$2" ]
}

endpoints_gone() {
  ! kubectl -n "$test_ns" get endpoints "$1" >/dev/null 2>&1
}

managed_by_us() {
  [ "$(kubectl -n "$test_ns" get endpoints "$1" -o jsonpath='{.metadata.labels.endpoints\.kubernetes\.io/managed-by}')" = endpoints-guard ]
}

lease_holder() {
  kubectl -n "$namespace" get lease endpoints-guard -o jsonpath='{.spec.holderIdentity}'
}

lease_held() {
  [ -n "$(lease_holder)" ]
}

holder_is_not() {
  local holder
  holder=$(lease_holder)
  [ -n "$holder" ] && [ "$holder" != "$1" ]
}

make_workload() {
  local name=$1 replicas=$2
  kubectl -n "$test_ns" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ${name}
spec:
  replicas: ${replicas}
  selector:
    matchLabels: {app: ${name}}
  template:
    metadata:
      labels: {app: ${name}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.10
          ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: ${name}
spec:
  selector: {app: ${name}}
  ports: [{name: http, port: 80, targetPort: http}]
EOF
}

scenario_reconcile() {
  log "scenario: Endpoints follow pods (create, scale up and down, Service deleted)"
  make_workload web 3
  wait_for "3 addresses in web" 180 ips_are web 3
  managed_by_us web || die "web's Endpoints are not labelled managed-by=endpoints-guard"
  kubectl -n "$test_ns" scale deployment web --replicas=1
  wait_for "1 address in web" 120 ips_are web 1
  kubectl -n "$test_ns" scale deployment web --replicas=4
  wait_for "4 addresses in web" 180 ips_are web 4
  kubectl -n "$test_ns" delete service web
  wait_for "web's Endpoints deleted with their Service" 60 endpoints_gone web
  kubectl -n "$test_ns" delete deployment web --wait=false
}

scenario_chaos() {
  log "scenario: under watch-chaos faults ($faults), Endpoints of live Services are never deleted"
  make_workload steady 2
  wait_for "2 addresses in steady" 180 ips_are steady 2
  local i
  for ((i = 0; i < 30; i++)); do
    # Service churn: label changes and short-lived Services around the steady one.
    kubectl -n "$test_ns" label service steady "churn=$i" --overwrite >/dev/null
    kubectl -n "$test_ns" create service clusterip "tmp-$i" --tcp=80:8080 >/dev/null
    kubectl -n "$test_ns" delete service "tmp-$i" --wait=false >/dev/null
    if endpoints_gone steady; then
      die "steady's Endpoints vanished while its Service existed (iteration $i)"
    fi
    sleep 1
  done
  ips_are steady 2 || die "steady has $(endpoint_ips steady) addresses after the churn, want 2"
}

scenario_failover() {
  log "scenario: deleting the leader pod hands the Lease over and writes continue"
  local leader
  leader=$(lease_holder)
  [ -n "$leader" ] || die "nobody holds the Lease"
  kubectl -n "$namespace" delete pod "$leader" --grace-period=0 --force >/dev/null 2>&1 || true
  wait_for "another replica to hold the Lease" 60 holder_is_not "$leader"
  log "Lease moved from $leader to $(lease_holder)"
  kubectl -n "$test_ns" scale deployment steady --replicas=3
  wait_for "3 addresses in steady after the failover" 180 ips_are steady 3
}

scenarios() {
  need kubectl
  [ -n "${KUBECONFIG:-}" ] || die "KUBECONFIG must name the cluster's kubeconfig"
  kubectl create namespace "$test_ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  scenario_reconcile
  scenario_chaos
  scenario_failover
  if [ -n "${EG_E2E_TEST_CMD:-}" ]; then
    log "running: $EG_E2E_TEST_CMD"
    bash -c "$EG_E2E_TEST_CMD"
  fi
  kubectl delete namespace "$test_ns" --wait=false >/dev/null
  log "all scenarios passed"
}

upstream_endpoints_controller_off() {
  kubectl -n kube-system get pods -l component=kube-controller-manager \
    -o jsonpath='{.items[*].spec.containers[*].command}' | grep -q -- '-endpoints-controller,-endpointslice-controller'
}

cleanup() {
  rm -rf "$workdir"
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    log "keeping cluster $cluster (delete it with: kind delete cluster --name $cluster)"
  else
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
}

run() {
  need docker kind kubectl
  docker info >/dev/null 2>&1 || die "no Docker daemon reachable: kind needs one"
  trap cleanup EXIT
  kind_config >"$workdir/kind.yaml"

  if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "creating kind cluster $cluster (upstream endpoints controller off)"
    local node_image=()
    if [ -n "${KIND_NODE_IMAGE:-}" ]; then
      node_image=(--image "$KIND_NODE_IMAGE")
    fi
    kind create cluster --config "$workdir/kind.yaml" "${node_image[@]}" --wait 180s
  fi
  kind get kubeconfig --name "$cluster" >"$workdir/kubeconfig"
  export KUBECONFIG=$workdir/kubeconfig
  upstream_endpoints_controller_off || die "kube-controller-manager still runs the endpoints or endpointslice controller"

  log "building $image and $chaos_image"
  docker build -t "$image" "$root"
  docker build --target watch-chaos -t "$chaos_image" "$root"
  kind load docker-image "$image" "$chaos_image" --name "$cluster"

  log "installing the chart (watch-chaos sidecar on)"
  helm_install
  kubectl -n "$namespace" rollout status deployment/"$release" --timeout=180s
  wait_for "a replica to hold the Lease" 60 lease_held

  scenarios
}

case "${1:-run}" in
  run) run ;;
  scenarios) scenarios ;;
  kind-config) kind_config ;;
  helm-values) helm_values ;;
  helm-template) helm_template ;;
  *) die "unknown command ${1}: run, scenarios, kind-config, helm-values or helm-template" ;;
esac
