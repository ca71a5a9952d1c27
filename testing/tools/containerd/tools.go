//go:build tools

// Package tools pins the container runtime that container pods are
// forwarded to in the tests: containerd 2.2 (its CRI plugin has user
// namespaces and recursive read-only mounts, which Debian 12's 1.6 lacks),
// its runc shim and ctr. runc is pinned in ../runc: it needs an older
// runtime-spec than containerd's.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
