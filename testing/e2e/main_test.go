// Package e2e holds the real-VM suites: real libvirtd, real QEMU (TCG
// here), real guest images built from Debian packages, the real daemon and
// its plugins as processes, driven by the real crictl.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/virtlet/virtlet/adapters/cni"
	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

var (
	bins        string // built binaries
	crictl      string
	tiny        string // the tiny guest image
	images      *imageserver.Server
	imgDir      string // what the image server serves
	translation string // names the served images virtlet.cloud/<name>
)

// tinyRef is the image name of the tiny guest, as a pod spec names it.
const tinyRef = "virtlet.cloud/tiny"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	var err error
	if crictl, err = harness.Tool("crictl", "CRICTL"); err != nil {
		return fail(err)
	}
	if err := harness.EnsureLibvirt(); err != nil {
		return fail(err)
	}
	// The CNI plugin installs its host-bridge firewall rules for good; the
	// suite leaves the host's firewall as it found it.
	firewall := cni.HostBridgeRuleState()
	defer cni.RestoreHostBridgeRules(firewall)
	if tiny, err = harness.GuestImage("tiny"); err != nil {
		return fail(err)
	}
	// One directory for every run of the suites in this checkout: go
	// build leaves a binary that is up to date as it is, so the phases
	// after the first (e2e-k8s, critest) link nothing.
	bins = filepath.Join(harness.RepoRoot(), ".cache", "e2e-bin")
	if err := os.MkdirAll(bins, 0o755); err != nil {
		return fail(err)
	}
	build := map[string]string{
		"virtlet-failpoints":        "github.com/virtlet/virtlet/cmd/virtlet", // the crash matrix's daemon
		"virtlet-flexvolume-driver": "github.com/virtlet/virtlet/cmd/virtlet-flexvolume-driver",
		"virtlet-installer":         "github.com/virtlet/virtlet/cmd/virtlet-installer",
		"virtlet-example-scratch":   "github.com/virtlet/virtlet/examples/scratch-volume",
		"virtlet-example-vfat":      "github.com/virtlet/virtlet/examples/vfat-datasource",
	}
	for k, v := range harness.ShippedPlugins {
		build[k] = v
	}
	build["virtlet-plugin-libvirt-failpoints"] = "github.com/virtlet/virtlet/cmd/virtlet-plugin-libvirt" // the pool's claim crashes
	err = harness.Build(bins, build)
	if err != nil {
		return fail(err)
	}
	if imgDir, err = os.MkdirTemp("", "virtlet-e2e-images-"); err != nil {
		return fail(err)
	}
	defer os.RemoveAll(imgDir)
	data, err := os.ReadFile(tiny)
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(imgDir, "tiny.qcow2"), data, 0o644); err != nil {
		return fail(err)
	}
	os.WriteFile(filepath.Join(imgDir, "page.html"), []byte("<html><body>not a disk</body></html>"), 0o644)
	if images, err = imageserver.Start(imgDir, "127.0.0.1:0", imgDir); err != nil {
		return fail(err)
	}
	defer images.Close()
	if translation, err = images.Translation(map[string]string{"tiny": "tiny.qcow2", "not-a-disk": "page.html"}); err != nil {
		return fail(err)
	}
	code := m.Run()
	// kube-proxy's nftables tables go with the suite that ran it.
	if left := harness.KubeProxyTables(); len(left) > 0 {
		fmt.Fprintln(os.Stderr, "e2e: kube-proxy's nftables tables left on the host:", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// parallel runs a test beside the suite's other parallel tests, in one of
// the slots (schedule_test.go; make check runs three at a time on two
// cores: a TCG guest keeps one core busy, and a test also waits),
// the longest first. Every test calls it but those that must have the
// node to themselves: TestLibvirtdKilled kills libvirtd, TestPluginChaos
// and TestConcurrentVMPods load both cores with 20 VMs,
// TestLibvirtdSharedByFew runs the crash matrix beside the hypervisor
// contracts only, and TestCPULimitBoundsTheVM measures how close a guest
// gets to its CPU limit; go runs those first, one at a time.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	slot(t)
}

// buildingBin is held by the parallel tests that run a make target
// building bin/ (make demo, make install): two at once would write the
// same files.
var buildingBin sync.Mutex

// holdBuildingBin holds buildingBin until the test ends.
func holdBuildingBin(t *testing.T) {
	buildingBin.Lock()
	t.Cleanup(buildingBin.Unlock)
}

// plugins returns the manifests of the shipped plugins.
func plugins() []harness.Plugin { return harness.Shipped(bins) }
