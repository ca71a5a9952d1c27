package e2e

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/hypervisortest"
	"github.com/virtlet/virtlet/testing/harness"
)

// The hypervisor contract, against the libvirt plugin as a process.
func TestLibvirtHypervisorContract(t *testing.T) {
	dir := harness.VMDir(t)
	h := libvirtPlugin(t, dir, "")
	hypervisortest.Run(t, hypervisortest.Env{
		Hypervisor: h.Hypervisor(),
		NewSpec: func(t *testing.T, id string) ports.VMSpec {
			return ports.VMSpec{ID: id, Name: fmt.Sprintf("virtlet-%s-contract", id[len(id)-12:]), UUID: uuid.NewString(),
				PodName: "contract", PodNamespace: "e2e", VCPUs: 1, MemoryBytes: 128 << 20,
				Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true,
					Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"}, Overlay: &ports.DiskOverlay{BasePath: tiny, BaseFormat: "qcow2"}}},
				ConsoleLogPath: filepath.Join(dir, "logs", id+".log")}
		},
		StopTimeout: 90 * time.Second,
		GuestAgent:  true, // the tiny guest runs qemu-guest-agent
	})
}

// The same contract for VMs claimed from the plugin's pool of pre-launched
// domains: the shape is learnt from a first VM (cold), whose pool domain
// the contract's VMs then claim, one after the other.
func TestLibvirtHypervisorContractPooled(t *testing.T) {
	dir := harness.VMDir(t)
	h := libvirtPlugin(t, dir, "{pool: {size: 1}}")
	hv := h.Hypervisor()
	newSpec := func(t *testing.T, id string) ports.VMSpec {
		return ports.VMSpec{ID: id, Name: fmt.Sprintf("virtlet-%s-contract", id[len(id)-12:]),
			PodName: "contract", PodNamespace: "e2e", VCPUs: 1, MemoryBytes: 128 << 20,
			Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true,
				Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"}, Overlay: &ports.DiskOverlay{BasePath: tiny, BaseFormat: "qcow2"}}},
			ConsoleLogPath: filepath.Join(dir, "logs", id+".log"), RunAs: &ports.ProcessIdentity{UID: 2000000500, GID: 2000000500}}
	}
	first := fmt.Sprintf("%064x", time.Now().UnixNano())
	if err := hv.Define(context.Background(), newSpec(t, first)); err != nil {
		t.Fatal(err)
	}
	if err := hv.Undefine(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitPool := func(t *testing.T) {
		harness.Eventually(t, time.Minute, "a pool domain launched", func() bool { return len(harness.PoolDomainsUsing(dir)) == 1 })
	}
	waitPool(t)
	hypervisortest.Run(t, hypervisortest.Env{
		Hypervisor: hv,
		NewSpec: func(t *testing.T, id string) ports.VMSpec {
			waitPool(t) // refilled after the previous claim
			return newSpec(t, id)
		},
		StopTimeout: 90 * time.Second,
		GuestAgent:  true,
		Pooled:      true,
	})
}

// libvirtPlugin runs the libvirt plugin as a process with this config.
func libvirtPlugin(t *testing.T, dir, config string) *host.Host {
	t.Helper()
	bin := filepath.Join(bins, "virtlet-plugin-libvirt")
	sum, _ := manifest.FileSHA256(bin)
	log := logrus.New()
	log.SetOutput(io.Discard)
	m := manifest.Manifest{Name: "libvirt", Kind: ports.KindHypervisor, Command: bin, SHA256: sum, File: "test"}
	if config != "" {
		js, err := yaml.YAMLToJSON([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		m.Config = js
	}
	h, err := host.Start(context.Background(), []manifest.Manifest{m}, host.Options{StateDir: filepath.Join(dir, "plugins"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	return h
}
