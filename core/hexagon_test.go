package core_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreImportsOnlyPortsAndPureLibraries keeps the hexagon: the core may
// depend on the standard library, ports and small pure libraries, never on
// adapters, plugins, generated protocol code or the heavy clients.
func TestCoreImportsOnlyPortsAndPureLibraries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/virtlet/virtlet/core/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/virtlet/virtlet/adapters",
		"github.com/virtlet/virtlet/plugins",
		"github.com/virtlet/virtlet/proto",
		"github.com/virtlet/virtlet/cmd",
		"github.com/virtlet/virtlet/testing",
		"google.golang.org/grpc",
		"k8s.io/apimachinery", // its resource package brought in gogo/protobuf
		"github.com/hashicorp/go-plugin",
		"libvirt.org/",
		"github.com/containers/image",
		"github.com/ceph/go-ceph",
		"k8s.io/cri-api",
		"k8s.io/client-go",
		"go.etcd.io/bbolt",
		"github.com/containernetworking",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too little to be the real dependency list: %v", deps)
	}
	for _, dep := range deps {
		for _, bad := range forbidden {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("core depends on %s", dep)
			}
		}
		if strings.Contains(dep, "protobuf") { // any protobuf runtime: Google's, gogo's, golang's
			t.Errorf("core depends on %s: a protocol library", dep)
		}
	}
}
