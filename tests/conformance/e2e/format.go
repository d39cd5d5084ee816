//go:build !eg_ktesting_format

// Gomega's object formatting, as e2e.test sets it up: the package is
// test/utils/format up to Kubernetes 1.36. build.sh sets the tag
// eg_ktesting_format for the releases where it moved (format_ktesting.go).
// `go mod tidy` reads both files, so tidying a release's pins needs -e.
package e2e

import _ "k8s.io/kubernetes/test/utils/format"
