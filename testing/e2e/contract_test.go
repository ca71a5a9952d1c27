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

	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/hypervisortest"
	"github.com/virtlet/virtlet/testing/harness"
)

// The hypervisor contract, against the libvirt plugin as a process.
func TestLibvirtHypervisorContract(t *testing.T) {
	dir := harness.VMDir(t)
	bin := filepath.Join(bins, "virtlet-plugin-libvirt")
	sum, _ := manifest.FileSHA256(bin)
	log := logrus.New()
	log.SetOutput(io.Discard)
	h, err := host.Start(context.Background(), []manifest.Manifest{{Name: "libvirt", Kind: ports.KindHypervisor, Command: bin, SHA256: sum, File: "test"}},
		host.Options{StateDir: filepath.Join(dir, "plugins"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Shutdown()
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
