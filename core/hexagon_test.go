package core_test

import (
	"os/exec"
	"strings"
	"testing"
)

// coreMayImport is everything outside the standard library the core may
// depend on: the ports, and small pure libraries (no I/O clients, no
// protocol runtimes). Anything else is a new dependency to argue for here.
var coreMayImport = []string{
	"github.com/virtlet/virtlet/core",
	"github.com/virtlet/virtlet/ports",
	"github.com/sirupsen/logrus",
	"golang.org/x/sys/unix", // logrus's terminal check
	"github.com/google/uuid",
	"github.com/opencontainers/go-digest",
	"github.com/distribution/reference",
	"sigs.k8s.io/yaml",
	"go.yaml.in/yaml/v2",
	"golang.org/x/sync/singleflight",
}

// TestCoreImportsOnlyPortsAndPureLibraries keeps the hexagon with an
// allow-list: the core depends on the standard library, the ports and the
// libraries above, never on adapters, plugins, generated protocol code or
// the heavy clients.
func TestCoreImportsOnlyPortsAndPureLibraries(t *testing.T) {
	for _, dep := range deps(t, "github.com/virtlet/virtlet/core/...") {
		if !standard(dep) && !allowed(dep, coreMayImport) {
			t.Errorf("core depends on %s, which is not on its allow-list", dep)
		}
	}
}

// deps lists the packages pattern depends on (tests excluded).
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pattern).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	list := strings.Fields(string(out))
	if len(list) < 10 {
		t.Fatalf("go list returned too little to be the real dependency list: %v", list)
	}
	return list
}

// standard tells a standard-library package: no dot in its first element.
func standard(pkg string) bool {
	first, _, _ := strings.Cut(pkg, "/")
	return !strings.Contains(first, ".")
}

func allowed(pkg string, list []string) bool {
	for _, a := range list {
		if pkg == a || strings.HasPrefix(pkg, a+"/") {
			return true
		}
	}
	return false
}
