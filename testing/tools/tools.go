//go:build tools

// Package tools pins the real CRI clients the tests drive: crictl and the
// CRI validation suite critest, from cri-tools.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
