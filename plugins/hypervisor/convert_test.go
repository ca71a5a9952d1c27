package hypervisor

import (
	"reflect"
	"testing"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Every field of a VM spec crosses the plugin boundary: a field the
// conversion forgets is silently lost in the hypervisor plugin (as the
// hugepage size once was).
func TestSpecCrossesThePluginBoundary(t *testing.T) {
	spec := ports.VMSpec{
		ID: "id", Name: "virtlet-id-pod", UUID: "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d", SandboxID: "sb",
		PodName: "pod", PodNamespace: "ns", PodUID: "uid",
		VCPUs: 2, MaxVCPUs: 4, MinVCPUs: 1, MemoryBytes: 128 << 20, MaxMemoryBytes: 256 << 20, HugepageSizeBytes: 2 << 20,
		CPU:    ports.CPUSpec{Model: "host-model", Setting: &ports.CPUSetting{Mode: "custom", Model: &ports.CPUSettingModel{Value: "qemu64"}}},
		CPUSet: []int{1, 3}, Machine: "q35", Firmware: ports.FirmwareUEFI, SecureBoot: true, HyperV: true, NoMemorySharing: true, CPULimits: ports.CPULimits{Shares: 512, Period: 100000, Quota: 50000},
		Clock:    ports.ClockSpec{Offset: "variable", AdjustmentSeconds: 7200, Timers: []ports.ClockTimer{{Name: "rtc", TickPolicy: "catchup"}}},
		Watchdog: &ports.Watchdog{Model: "i6300esb", Action: "poweroff"},
		Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Serial: "root",
			Overlay: &ports.DiskOverlay{BasePath: "/var/lib/virtlet/images/sha256/ab", BaseFormat: "qcow2", SizeBytes: 1 << 30, KeepFreeBytes: 1 << 29}}},
		Filesystems:    []ports.Filesystem{{Source: "/srv/share", Tag: "share", AccessMode: "mapped"}},
		NICs:           []ports.NIC{{Name: "eth0", MAC: "52:54:00:a1:b2:c3"}},
		ConsoleLogPath: "/var/log/pods/x/0.log",
		RunAs:          &ports.ProcessIdentity{UID: 2000000000, GID: 2000000000},
		Incoming:       &ports.VMIncoming{Name: "virtlet-0123456789ab-vm", UUID: "9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d"},
		Restore:        &ports.VMRestore{StateFile: "/var/lib/virtlet/restore/x/checkpoint/memory.save", Disks: map[string]string{"root": "/var/lib/virtlet/restore/x/disks/root.qcow2"}},
	}
	everyFieldSet(t, spec)
	if got := specFromProto(specToProto(spec)); !reflect.DeepEqual(got, spec) {
		t.Errorf("after the plugin boundary:\n%+v\nwant\n%+v", got, spec)
	}
}

func TestStatusCrossesThePluginBoundary(t *testing.T) {
	st := ports.VMStatus{ID: "id", State: ports.VMStopped, StartedAt: time.Unix(10, 20).UTC(), FinishedAt: time.Unix(30, 40).UTC(),
		ExitCode: 137, Reason: "Killed", Message: "forced off", Name: "virtlet-pool-ab12cd-3", UUID: "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d",
		Prelaunched: true}
	everyFieldSet(t, st)
	if got := statusFromProto(statusToProto(st)); !reflect.DeepEqual(got, st) {
		t.Errorf("after the plugin boundary:\n%+v\nwant\n%+v", got, st)
	}
}

// everyFieldSet fails the test when the fixture leaves a field of its
// struct empty: a field the conversion forgets would go unnoticed.
func everyFieldSet(t *testing.T, fixture interface{}) {
	t.Helper()
	v := reflect.ValueOf(fixture)
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			t.Fatalf("the fixture leaves %s.%s empty: set it, so that its conversion is checked", v.Type().Name(), v.Type().Field(i).Name)
		}
	}
}
