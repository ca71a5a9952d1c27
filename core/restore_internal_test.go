package core

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

func TestCheckRestoreRefusesByName(t *testing.T) {
	from := ports.VMSpec{VCPUs: 1, MemoryBytes: 128 << 20, MaxMemoryBytes: 128 << 20, NICs: []ports.NIC{{MAC: "02:00:00:00:00:01"}}}
	for _, tc := range []struct {
		name   string
		change func(s *ports.VMSpec)
		from   func(s *ports.VMSpec)
		want   string
	}{
		{name: "the same VM"},
		{name: "memory", change: func(s *ports.VMSpec) { s.MemoryBytes, s.MaxMemoryBytes = 256<<20, 256<<20 }, want: `resources.limits.memory (the VM's memory): invalid value "256 MiB"`},
		{name: "vCPUs", change: func(s *ports.VMSpec) { s.VCPUs = 2 }, want: "VirtletVCPUCount"},
		{name: "machine", change: func(s *ports.VMSpec) { s.Machine = "q35" }, want: `VirtletMachineType: invalid value "q35"`},
		{name: "firmware", change: func(s *ports.VMSpec) { s.Firmware = ports.FirmwareUEFI }, want: "VirtletFirmware"},
		{name: "interfaces", change: func(s *ports.VMSpec) { s.NICs = nil }, want: "the pod's network interfaces"},
		{name: "hugepages", change: func(s *ports.VMSpec) { s.HugepageSizeBytes = 2 << 20 }, from: func(s *ports.VMSpec) { s.HugepageSizeBytes = 2 << 20 }, want: "hugepages"},
		{name: "pinned CPUs", change: func(s *ports.VMSpec) { s.CPUSet = []int{1} }, want: "pinned CPUs"},
		{name: "9p", from: func(s *ports.VMSpec) { s.Filesystems = []ports.Filesystem{{Tag: "x"}} }, want: "9p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, cp := from, from
			spec.NICs, cp.NICs = append([]ports.NIC{}, from.NICs...), append([]ports.NIC{}, from.NICs...)
			if tc.change != nil {
				tc.change(&spec)
			}
			if tc.from != nil {
				tc.from(&cp)
			}
			err := checkRestore("virtlet.cloud/cp", spec, cp)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var invalid *ports.InvalidError
			if !errors.As(err, &invalid) && !errors.Is(err, ports.ErrFailedPrecondition) {
				t.Errorf("%v is neither an invalid argument nor a failed precondition", err)
			}
		})
	}
}

func TestCheckRestoredDisks(t *testing.T) {
	cp := ports.VMCheckpoint{Disks: []ports.CheckpointDisk{{Name: "root"}}, Skipped: []ports.CheckpointDisk{{Name: "cloud-init"}}}
	same := ports.VMSpec{Disks: []ports.Disk{{Name: "cloud-init"}, {Name: "root"}}}
	if err := checkRestoredDisks("cp", same, cp); err != nil {
		t.Fatal(err)
	}
	more := ports.VMSpec{Disks: []ports.Disk{{Name: "root"}, {Name: "vol-data"}, {Name: "cloud-init"}}}
	if err := checkRestoredDisks("cp", more, cp); err == nil || !strings.Contains(err.Error(), "the disks cloud-init, root, vol-data, the checkpointed VM had cloud-init, root") {
		t.Fatalf("a VM with a disk more: %v", err)
	}
}
