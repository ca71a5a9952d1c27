//go:build tools

// Package tools pins runc 1.3 for the tests' containerd (idmapped mounts
// for pods in user namespaces, recursive read-only mounts; Debian 12 has
// 1.1). Built with cgo and libseccomp (the seccomp build tag).
package tools

import _ "github.com/opencontainers/runc"
