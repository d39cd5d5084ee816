# endpoints-guard — the commands the README gives users and CI runs.
#
#   make demo          build, start a local control plane, run endpoints-guard on a sample
#   make test          fmt, clippy, unit tests, end-to-end tests on the local control plane
#   make controlplane  build (or reuse) kube-apiserver, kube-controller-manager, etcd, helm
#   make parity        full differential test against kube-controller-manager
#
# The control plane programs are built from Go modules (tests/controlplane/); set
# KUBEBUILDER_ASSETS or EG_KUBE_APISERVER / EG_KUBE_CONTROLLER_MANAGER / EG_ETCD / EG_HELM
# to use binaries you already have.

SHELL := /bin/bash
CARGO ?= cargo
# Tests start several control planes; two at a time fits a 2-core machine.
TEST_THREADS ?= 2

.PHONY: all build controlplane toolchain fmt-check clippy unit-test e2e-test test parity demo clean

all: build

toolchain:
	@command -v $(CARGO) >/dev/null || { echo "make: cargo not found: install Rust (https://rustup.rs)"; exit 1; }
	@command -v go >/dev/null || { echo "make: go not found: install Go 1.26 or newer (https://go.dev/doc/install)"; exit 1; }
	@if command -v rustup >/dev/null; then rustup component add rustfmt clippy >/dev/null 2>&1 || true; fi

build: toolchain
	$(CARGO) build --release --bins

controlplane: toolchain
	@bash tests/controlplane/build.sh

fmt-check: toolchain
	$(CARGO) fmt --all -- --check

clippy: toolchain
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit-test: toolchain
	$(CARGO) test --workspace --lib --bins

e2e-test: controlplane
	$(CARGO) test --workspace --tests -- --test-threads=$(TEST_THREADS)

test: fmt-check clippy controlplane
	$(CARGO) test --workspace -- --test-threads=$(TEST_THREADS)

parity: controlplane
	EG_PARITY_SCALE=full $(CARGO) test --release --test parity -- --nocapture

demo: controlplane
	$(CARGO) build --release --bins
	$(CARGO) run --release -p eg-testsupport --bin eg-demo

clean:
	$(CARGO) clean
