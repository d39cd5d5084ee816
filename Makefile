# endpoints-guard — the commands the README gives users and CI runs.
#
#   make demo          build, start a local control plane, run endpoints-guard on a sample
#   make test          fmt, clippy, unit tests, end-to-end tests on the local control plane
#   make controlplane  build (or reuse) kube-apiserver, kube-controller-manager, etcd, helm,
#                      prometheus, promtool
#   make parity        full differential tests against kube-controller-manager (Endpoints, EndpointSlices)
#   make chaos         watch-chaos scenario matrix: endpoints-guard vs kube-controller-manager
#   make soak          DURATION=30m of workload and rotating faults → target/soak/ (docs/soak.md)
#   make bench         endpoints-guard vs kube-controller-manager (SIZE=S|M|L|XL,
#                      KIND=endpoints|endpointslices|both, REPEAT=N) → target/bench/
#   make image-smoke   the runtime image under Docker, as the chart runs it, on the local control plane
#   make e2e-node      the chart on a real one-node cluster on this host (root; kubelet, containerd,
#                      kube-proxy), traffic through a Service under every fault → target/e2e-node/
#   make chart-package helm lint --strict and helm package → target/chart/
#   make chart-readme  the chart's README values table (from values.yaml's comments) and runbook.md
#   make conformance   upstream's e2e specs for the endpoint controllers, kube-controller-manager's
#                      and endpoints-guard's, on local clusters of KWOK nodes and (root) on a
#                      real one-node cluster → target/conformance/
#   make matrix        every pinned Kubernetes release against its own kube-controller-manager:
#                      parity, conformance on fake nodes, the restore and ghost chaos rows, the
#                      real-node short form (root) → target/matrix/ (docs/versions.md)
#
# KUBE_VERSION=1.34|1.35|1.36|1.37 (default the newest) picks the Kubernetes release
# every target builds and runs against (docs/testing.md, docs/versions.md).
#
# The control plane programs are built from Go modules (tests/controlplane/); set
# KUBEBUILDER_ASSETS or EG_KUBE_APISERVER / EG_KUBE_CONTROLLER_MANAGER / EG_ETCD / EG_HELM /
# EG_PROMETHEUS / EG_PROMTOOL to use binaries you already have.

SHELL := /bin/bash
CARGO ?= cargo
# The two programs the image, the demo and the bench run.
RELEASE_BINS := -p endpoints-guard -p watch-chaos --bins
# Tests start several control planes; two at a time fits a 2-core machine.
TEST_THREADS ?= 2
# The oldest pinned Kubernetes release (v1.34): make test runs parity on it too.
OLDEST_KUBE := $(firstword $(shell ls tests/controlplane/kubernetes | grep '^v1\.' | sort -V))

.PHONY: all build controlplane toolchain fmt-check clippy doc unit-test e2e-test test parity demo clean chaos

all: build

toolchain:
	@command -v $(CARGO) >/dev/null || { echo "make: cargo not found: install Rust (https://rustup.rs)"; exit 1; }
	@command -v go >/dev/null || { echo "make: go not found: install Go 1.26 or newer (https://go.dev/doc/install)"; exit 1; }
	@if command -v rustup >/dev/null; then rustup component add rustfmt clippy >/dev/null 2>&1 || true; fi

# EG_REVISION is endpoints_guard_build_info's revision label (else "unknown").
build: toolchain
	EG_REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) $(CARGO) build --release $(RELEASE_BINS)

controlplane: toolchain
	@bash tests/controlplane/build.sh

# The oldest release's control plane, for make test's parity on it.
.PHONY: controlplane-oldest
controlplane-oldest: toolchain
	@KUBE_VERSION=$(OLDEST_KUBE) bash tests/controlplane/build.sh

fmt-check: toolchain
	$(CARGO) fmt --all -- --check

clippy: toolchain
	$(CARGO) clippy --workspace --all-targets --features endpoints-guard/profiling -- -D warnings

unit-test: toolchain
	$(CARGO) test --workspace --lib --bins

# The end-to-end tests run the watch-chaos binary of crates/watch-chaos and the
# controller binary, both built first (the suite would build each itself, inside
# the first test that runs it, as `make chaos` and `make parity` leave it to).
# The hardened-watcher crate's own tests find a real API server through
# HARDENED_WATCHER_TEST_KUBECONFIG (they skip without it): eg-with-controlplane
# starts one and sets it.
e2e-test: controlplane haproxy
	$(CARGO) build -p watch-chaos --bins
	$(CARGO) build -p endpoints-guard --bin endpoints-guard
	$(CARGO) test --workspace --tests -- --test-threads=$(TEST_THREADS)
	$(CARGO) run -p eg-harness --bin eg-with-controlplane -- $(CARGO) test -p hardened-watcher

# The fake-node conformance specs (docs/conformance.md), both columns, with the
# debug endpoints-guard binary; report in target/conformance/test/. The
# Endpoints and EndpointSlice parity tests run again against the oldest
# release's kube-controller-manager (docs/versions.md).
test: fmt-check clippy doc lint-shell haproxy controlplane controlplane-oldest conformance-build
	$(CARGO) build -p watch-chaos --bins
	$(CARGO) build -p endpoints-guard --bin endpoints-guard
	EG_BINARY=$(CURDIR)/target/debug/endpoints-guard $(CARGO) run -p eg-node --bin eg-conformance -- --nodes fake --out $(CURDIR)/target/conformance/test
	EG_SOAK_DURATION=3m $(CARGO) test --workspace -- --test-threads=$(TEST_THREADS)
	KUBE_VERSION=$(OLDEST_KUBE) $(CARGO) test --test e2e -- --test-threads=$(TEST_THREADS) endpoints_parity:: slice_parity::
	$(CARGO) run -p eg-harness --bin eg-with-controlplane -- $(CARGO) test -p hardened-watcher
	EG_IMAGE_PROFILE=debug bash hack/e2e-node.sh short

# rustdoc of the hardened-watcher crate, warnings as errors, and the crate as
# crates.io would take it (packaged, then built from the package alone); then
# its public API against a baseline commit's, by cargo-semver-checks.
doc: toolchain semver-check
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p hardened-watcher --no-deps --features testing
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p endpoints-guard --no-deps --lib
	$(CARGO) package -p hardened-watcher --allow-dirty

# The commit whose hardened-watcher API the current one must stay compatible
# with, at the crate's version then (0.1.0): a change that breaks it fails
# `make doc` until the crate's version says so (0.2.0) and this names the
# commit of that release (docs/testing.md, "The watcher's API").
WATCHER_API_BASELINE := 3cb668c
SEMVER_CHECKS_VERSION := 0.51.0
SEMVER_CHECKS := $(CURDIR)/target/tools/bin/cargo-semver-checks

.PHONY: semver-check
semver-check: toolchain
	@$(SEMVER_CHECKS) --version 2>/dev/null | grep -qF $(SEMVER_CHECKS_VERSION) || \
		$(CARGO) install --locked --quiet cargo-semver-checks --version $(SEMVER_CHECKS_VERSION) --root $(CURDIR)/target/tools
	@git cat-file -e $(WATCHER_API_BASELINE)^{commit} 2>/dev/null || \
		{ echo "make: commit $(WATCHER_API_BASELINE) (the watcher's API baseline) is not in this clone: fetch the full history (git fetch --unshallow)"; exit 1; }
	PATH="$(CURDIR)/target/tools/bin:$$PATH" $(CARGO) semver-checks check-release -p hardened-watcher --baseline-rev $(WATCHER_API_BASELINE)

parity: controlplane
	EG_PARITY_SCALE=full $(CARGO) test --release --test e2e -- --nocapture endpoints_parity:: slice_parity::

# Every pinned Kubernetes release (KUBE_VERSION=1.34 … 1.37), each against its own
# kube-controller-manager: builds its programs (make controlplane conformance-build),
# then make parity's corpus, the fake-node conformance specs in three columns, the
# chaos rows of etcd restores and of a pod DELETE lost in the watch cache, and (root)
# the real-node short form. target/matrix/report.{json,md}, every step's own report in
# target/matrix/<version>/. Fails on a different object, a spec upstream passes that
# endpoints-guard does not, a chaos row of endpoints-guard not converged or with a
# spurious deletion, a request failed by wrong endpoints on the real node.
# MATRIX_ARGS: --versions 1.34,1.37 and --only parity,conformance,chaos,real-node.
.PHONY: matrix
MATRIX_ARGS ?=
matrix: toolchain
	$(CARGO) run -p eg-matrix --bin eg-matrix -- $(MATRIX_ARGS)

# Bench size: S = 100 Services × 1,000 pods, M = 1,000 × 10,000, L = 3,000 × 30,000,
# XL = 10,000 × 100,000, or a number N of Services (N × 10N). Each size runs
# endpoints-guard, kube-controller-manager (client QPS 20) and kube-controller-manager
# with --kube-api-qps/--kube-api-burst 1000 (docs/bench-xl.md); the first two also
# through a pod DELETE lost in kube-apiserver's watch cache (the ghost phase, docs/bench.md).
# REPEAT=N runs every controller N times on the one workload (reports in
# target/bench/run-<i>/), for the spread between runs.
SIZE ?= S
REPEAT ?= 1

.PHONY: bench
bench: controlplane
	$(CARGO) build --release $(RELEASE_BINS)
	SIZE=$(SIZE) KIND=$(KIND) $(CARGO) run --release -p eg-bench --bin eg-bench -- --repeat $(REPEAT)

# Every scenario on a fresh control plane, once per controller, both behind watch-chaos;
# writes target/chaos/report.json and target/chaos/report.md (make test runs a fast
# subset); then the overload row on the highly available control plane, both
# controllers side by side (target/chaos/overload.json); then ten minutes of pod churn
# that must leave no tombstones behind.
chaos: controlplane haproxy
	EG_CHAOS=full $(CARGO) test --test e2e -- --nocapture chaos::
	EG_CHAOS=full $(CARGO) test --test e2e -- --nocapture pressure::
	EG_CHURN_SECONDS=600 $(CARGO) test --test e2e -- --nocapture --exact store::tombstones_stay_bounded_under_pod_churn

# The soak (issue 15): endpoints-guard (release binary, both controllers, enforce mode)
# behind watch-chaos on the local control plane, a workload that never stops and a
# rotating fault schedule, judged by an independent oracle; resource use sampled every
# 10 s must stay flat. Writes target/soak/report.json, report.md, soak.svg (docs/soak.md).
# make test runs the 3-minute form (EG_SOAK_DURATION=3m, debug build, target/soak/short/).
DURATION ?= 30m

.PHONY: soak
soak: controlplane
	$(CARGO) build --release -p watch-chaos --bins
	EG_SOAK_DURATION=$(DURATION) $(CARGO) test --release --test e2e -- --nocapture soak::

demo: controlplane
	$(CARGO) build --release $(RELEASE_BINS)
	$(CARGO) run --release -p eg-demo --bin eg-demo

clean:
	$(CARGO) clean

# --- deployment: chart, plain manifests, kind e2e -------------------------------
.PHONY: deploy-manifests chart-package chart-readme e2e-kind image-smoke lint-shell

# Renders deploy/ from charts/endpoints-guard (tests/e2e/chart.rs fails on drift).
deploy-manifests: controlplane
	bash hack/render-manifests.sh

# The chart as a package: target/chart/endpoints-guard-<chart version>.tgz, linted
# first (--strict). Push it to an OCI registry with
#   helm push target/chart/endpoints-guard-<version>.tgz oci://<registry>/<path>
# (docs/install.md).
CHART_DIR ?= target/chart
chart-package: controlplane
	bash hack/package-chart.sh $(CHART_DIR)

# The chart's own documents: the values table of charts/endpoints-guard/README.md,
# from the comment block above each key of values.yaml (every value needs one),
# and runbook.md, a copy of docs/runbook.md (tests/e2e/chart.rs fails on drift).
chart-readme: toolchain
	$(CARGO) run -p eg-chart --bin eg-chart-readme

# A real one-node cluster on this host (docs/e2e-node.md): as root, installs containerd,
# runc, the CNI plugins and iptables when missing (else skips, exit 0), builds kubelet,
# kube-scheduler and kube-proxy (make controlplane), the images (hack/node-images.sh),
# installs the chart and runs every scenario with endpoints-guard and with
# kube-controller-manager's endpoint controllers, then the overload row on a node of its
# own with API Priority and Fairness on; the host is compared before and after.
# make test runs the short form (one fault row per controller, a shorter flood).
.PHONY: e2e-node
FORM ?= full
e2e-node: controlplane conformance-build
	bash hack/e2e-node.sh $(FORM)

# kind e2e (needs Docker, kind, kubectl): cluster without the upstream endpoints
# controller, image built and loaded, chart installed with the watch-chaos sidecar.
e2e-kind: controlplane
	bash hack/e2e-kind.sh run

# The runtime image assembled from the release binaries and their shared libraries on
# an empty base (no image can be pulled here), run by Docker with the chart's security
# settings against the local control plane (see docs/image-smoke.md). Skips, exit 0,
# without Docker; not part of `make test`.
image-smoke: controlplane
	$(CARGO) build --release $(RELEASE_BINS)
	CARGO=$(CARGO) bash hack/image-smoke.sh

# HAProxy, the load balancer in front of the API servers of the
# production-shaped control plane (three etcd members, two kube-apiservers:
# tests/harness); installed with apt-get when missing, as root.
.PHONY: haproxy
haproxy:
	@command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || [ -n "$$EG_HAPROXY" ] || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq haproxy; } \
	  || { echo "make: haproxy is missing: install it (Debian/Ubuntu: apt-get install haproxy) or set EG_HAPROXY"; exit 1; }

# shellcheck on hack/ (installs it with apt-get when missing, as root).
lint-shell:
	@command -v shellcheck >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq shellcheck; } \
	  || { echo "make: shellcheck is missing: install it (Debian/Ubuntu: apt-get install shellcheck)"; exit 1; }
	shellcheck hack/*.sh

# --- conformance: upstream's e2e specs (docs/conformance.md) -----------------------
# e2e-network.test (upstream's network e2e specs) and KWOK built from Go modules
# (tests/conformance/), reused while newer than their module files.
.PHONY: conformance conformance-build
conformance-build: controlplane
	bash tests/conformance/build.sh

# Every fake-node spec for the Endpoints, EndpointSlice and mirroring controllers,
# against kube-controller-manager's endpoint controllers and against endpoints-guard
# (release binary, enforce mode), each on a fresh cluster (local control plane,
# kube-scheduler, KWOK nodes); target/conformance/report.{json,md}, JUnit per column.
# Fails when endpoints-guard fails a spec kube-controller-manager passes.
# Then, where a real node can run (root; Debian packages, installed when
# missing), the specs that need exec, container logs, traffic or Service names,
# both columns on the real one-node cluster (one node at a time:
# /run/eg-e2e-node.lock), with agnhost and pause built here and imported
# (hack/conformance-node.sh); elsewhere those rows are skipped, and say why.
conformance: conformance-build
	$(CARGO) build --release -p endpoints-guard --bin endpoints-guard
	bash hack/conformance-node.sh
	$(CARGO) run -p eg-node --bin eg-conformance
