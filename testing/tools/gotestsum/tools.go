//go:build tools

// Package tools pins gotestsum, which runs every suite of `make check`:
// it prints go test's usual output and keeps each test's events as JSON,
// from which the check's closing table names the slowest tests.
package tools

import (
	_ "gotest.tools/gotestsum"
)
