// The module of upstream's e2e suite wrapper (e2e/). Its pins are per
// Kubernetes release, in v1.XX/go.mod beside this file: build.sh builds with
// -modfile=v1.XX/go.mod, so this file only marks the module's root (Go reads
// none of it then).
module endpoints-guard.local/conformance

go 1.26.0
