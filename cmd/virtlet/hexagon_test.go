package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// daemonMayImport are the project's packages the daemon process may link:
// the core, the inbound adapters, the local ones it runs itself (state
// store, image files, Kubernetes objects) and the plugin host's client
// glue. Adapters that belong in a plugin process (libvirt, CNI, volumes,
// cloud-init media, image sources) are not on it, nor are their heavy
// libraries below.
var daemonMayImport = []string{
	"github.com/virtlet/virtlet/cmd/virtlet",
	"github.com/virtlet/virtlet/plugins/buildinfo",
	"github.com/virtlet/virtlet/core",
	"github.com/virtlet/virtlet/ports",
	"github.com/virtlet/virtlet/proto",
	"github.com/virtlet/virtlet/plugins/base",
	"github.com/virtlet/virtlet/plugins/host",
	"github.com/virtlet/virtlet/plugins/manifest",
	"github.com/virtlet/virtlet/plugins/datasource",
	"github.com/virtlet/virtlet/plugins/hypervisor",
	"github.com/virtlet/virtlet/plugins/image",
	"github.com/virtlet/virtlet/plugins/network",
	"github.com/virtlet/virtlet/plugins/volume",
	"github.com/virtlet/virtlet/adapters/cri",
	"github.com/virtlet/virtlet/adapters/crirouter",
	"github.com/virtlet/virtlet/adapters/streaming",
	"github.com/virtlet/virtlet/adapters/vmtools",
	"github.com/virtlet/virtlet/adapters/admin",
	"github.com/virtlet/virtlet/adapters/internal/rpcguard",
	"github.com/virtlet/virtlet/adapters/internal/unixsock",
	"github.com/virtlet/virtlet/adapters/dialer",
	"github.com/virtlet/virtlet/adapters/boltstore",
	"github.com/virtlet/virtlet/adapters/imagefiles",
	"github.com/virtlet/virtlet/adapters/imagetranslations",
	"github.com/virtlet/virtlet/adapters/kubeapi",
	"github.com/virtlet/virtlet/adapters/kubedir",
	"github.com/virtlet/virtlet/adapters/kubefiles",
	"github.com/virtlet/virtlet/adapters/metrics",
	// The node's own state for diag dump (netlink, /proc, libvirt's log
	// files): the daemon's view of its host, as kubefiles is.
	"github.com/virtlet/virtlet/adapters/nodeinspect",
	// Checkpoint archives: tar files of what the hypervisor plugin wrote,
	// packed and unpacked by the daemon, written whole (atomicfile).
	"github.com/virtlet/virtlet/adapters/checkpointarchive",
	"github.com/virtlet/virtlet/adapters/internal/atomicfile",
	// The daemons' live migration link: mutual TLS between nodes, joining
	// unix sockets of libvirtd and QEMU; it links no libvirt library.
	"github.com/virtlet/virtlet/adapters/migrationpeer",
}

// daemonMustNotLink are the outbound adapters' libraries.
var daemonMustNotLink = []string{
	"libvirt.org/",
	"github.com/ceph/go-ceph",
	"github.com/containers/image",
	"github.com/containernetworking",
}

func TestDaemonLinksNoPluginAdapter(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/virtlet/virtlet/cmd/virtlet").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too little to be the real dependency list: %v", deps)
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "github.com/virtlet/virtlet/") && !hasPrefix(dep, daemonMayImport) {
			t.Errorf("the daemon links %s, which is not on its allow-list", dep)
		}
		if hasPrefix(dep, daemonMustNotLink) {
			t.Errorf("the daemon links %s: that library belongs in a plugin process", dep)
		}
	}
}

func hasPrefix(pkg string, list []string) bool {
	for _, a := range list {
		if pkg == a || strings.HasPrefix(pkg, strings.TrimSuffix(a, "/")+"/") || strings.HasSuffix(a, "/") && strings.HasPrefix(pkg, a) {
			return true
		}
	}
	return false
}

// The flexvolume driver, which kubelet execs for every mount, links no
// core: the data it hands the daemon is a port's type.
func TestFlexvolumeDriverLinksNoCore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/virtlet/virtlet/cmd/virtlet-flexvolume-driver").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/virtlet/virtlet/adapters/flexvolume") {
		t.Fatalf("go list returned no flexvolume adapter, so not the driver's dependencies: %v", deps)
	}
	for _, dep := range deps {
		if dep == "github.com/virtlet/virtlet/core" || strings.HasPrefix(dep, "github.com/virtlet/virtlet/core/") {
			t.Errorf("the flexvolume driver links %s", dep)
		}
	}
}
