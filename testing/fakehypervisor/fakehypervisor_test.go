package fakehypervisor_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/hypervisor"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/hypervisortest"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
)

func spec(t *testing.T, id string) ports.VMSpec {
	return ports.VMSpec{ID: id, Name: "vm-" + id[len(id)-12:], VCPUs: 1, MemoryBytes: 64 << 20,
		ConsoleLogPath: filepath.Join(t.TempDir(), "console.log"),
		Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusSCSI, Boot: true,
			Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"}, Overlay: &ports.DiskOverlay{BasePath: "/img", BaseFormat: "qcow2"}}}}
}

func TestContractInProcess(t *testing.T) {
	hypervisortest.Run(t, hypervisortest.Env{Hypervisor: fakehypervisor.New(), NewSpec: spec, StopTimeout: time.Second, GuestAgent: true})
}

// The same contract through the plugin shims over real gRPC: what the
// daemon sees of a hypervisor plugin.
func TestContractOverGRPC(t *testing.T) {
	fake := fakehypervisor.New()
	client := hypervisor.NewClient(sdktest.Conn(t, fake))
	hypervisortest.Run(t, hypervisortest.Env{
		Hypervisor: struct {
			*hypervisor.Client
			specs
		}{client, specs{fake}},
		NewSpec: spec, StopTimeout: time.Second, GuestAgent: true,
	})
}

// spec exposes the fake's stored specs next to the gRPC client, so the
// contract can check that a spec crosses the wire unchanged.
type specs struct{ fake *fakehypervisor.Hypervisor }

func (s specs) Spec(id string) (ports.VMSpec, bool) { return s.fake.Spec(id) }
