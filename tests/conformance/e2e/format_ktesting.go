//go:build eg_ktesting_format

// Gomega's object formatting, as e2e.test sets it up: from Kubernetes 1.37
// the package is test/utils/ktesting/format (see format.go).
package e2e

import _ "k8s.io/kubernetes/test/utils/ktesting/format"
