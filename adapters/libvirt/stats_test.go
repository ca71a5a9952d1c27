package libvirt

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// What libvirt leaves out (NOWAIT while the monitor is busy, a guest
// without a balloon driver) stays unreported; the disk's host storage is
// its container's size, not the highest offset written.
func TestVMStatsReportsOnlyWhatLibvirtSet(t *testing.T) {
	spec := ports.VMSpec{ID: "id", Name: "virtlet-x-vm", Disks: []ports.Disk{{Name: "root"}}, NICs: []ports.NIC{{Name: "eth0"}}}
	at := time.Unix(5, 0)
	for _, tc := range []struct {
		name string
		in   libvirt.DomainStats
		want ports.VMStats
	}{{
		name: "monitor busy, no QEMU found: CPU and traffic only",
		in: libvirt.DomainStats{Cpu: &libvirt.DomainStatsCPU{TimeSet: true, Time: 42}, Balloon: &libvirt.DomainStatsBalloon{CurrentSet: true, Current: 1024},
			Block: []libvirt.DomainStatsBlock{{Name: "vda", RdBytesSet: true, RdBytes: 7}},
			Net:   []libvirt.DomainStatsNet{{Name: "tap0", RxBytesSet: true, RxBytes: 9}}},
		want: ports.VMStats{ID: "id", Timestamp: at, CPUNanos: 42, Disks: []ports.DiskStats{{Name: "root", ReadBytes: 7}},
			NICs: []ports.NICStats{{Name: "eth0", RxBytes: 9}}},
	}, {
		name: "monitor busy: QEMU's resident memory from /proc",
		in:   libvirt.DomainStats{Balloon: &libvirt.DomainStatsBalloon{CurrentSet: true, Current: 1024}},
		want: ports.VMStats{ID: "id", Timestamp: at, Memory: ports.MemoryStats{HostReported: true, CurrentBytes: 1 << 20, RSSBytes: 300 << 10}},
	}, {
		name: "host figures, no guest driver",
		in: libvirt.DomainStats{Balloon: &libvirt.DomainStatsBalloon{CurrentSet: true, Current: 1024, RssSet: true, Rss: 512},
			Block: []libvirt.DomainStatsBlock{{Name: "vda", CapacitySet: true, Capacity: 1 << 30, AllocationSet: true, Allocation: 3 << 20, PhysicalSet: true, Physical: 5 << 20}}},
		want: ports.VMStats{ID: "id", Timestamp: at, Memory: ports.MemoryStats{HostReported: true, CurrentBytes: 1 << 20, RSSBytes: 512 << 10},
			Disks: []ports.DiskStats{{Name: "root", SizesReported: true, AllocationBytes: 5 << 20, CapacityBytes: 1 << 30}}},
	}, {
		name: "the guest's figures",
		in: libvirt.DomainStats{Balloon: &libvirt.DomainStatsBalloon{CurrentSet: true, Current: 1024, RssSet: true, Rss: 512,
			AvailableSet: true, Available: 1000, UnusedSet: true, Unused: 600, DiskCachesSet: true, DiskCaches: 100,
			MinorFaultSet: true, MinorFault: 3, MajorFaultSet: true, MajorFault: 1}},
		want: ports.VMStats{ID: "id", Timestamp: at, Memory: ports.MemoryStats{HostReported: true, CurrentBytes: 1 << 20, RSSBytes: 512 << 10,
			GuestReported: true, AvailableBytes: 1000 << 10, UnusedBytes: 600 << 10, CacheBytes: 100 << 10,
			FaultsReported: true, MinorFaults: 3, MajorFaults: 1}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			// QEMU found by its pid file in the case that asks for it.
			rss := func(domain string) (uint64, bool) {
				return 300 << 10, domain == spec.Name && strings.Contains(tc.name, "from /proc")
			}
			if got := vmStats(spec, tc.in, at, rss); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// hostRSS finds a domain's QEMU by its pid file and its -name argument,
// and refuses a pid file whose process is another's.
func TestHostRSSReadsTheDomainsProcess(t *testing.T) {
	dir := t.TempDir()
	old := qemuRunDir
	qemuRunDir = dir
	t.Cleanup(func() { qemuRunDir = old })
	// A process whose arguments name the domain as QEMU's -name does.
	cmd := exec.Command("sh", "-c", "sleep 60; true", "guest=virtlet-x-vm,debug-threads=on")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := []byte(strconv.Itoa(cmd.Process.Pid) + "\n")
	os.WriteFile(filepath.Join(dir, "virtlet-x-vm.pid"), pid, 0o644)
	os.WriteFile(filepath.Join(dir, "virtlet-other.pid"), pid, 0o644)
	if rss, ok := hostRSS("virtlet-x-vm"); !ok || rss == 0 {
		t.Errorf("the domain's process: %d, %v", rss, ok)
	}
	for _, domain := range []string{"virtlet-other", "virtlet-x", "virtlet-missing"} {
		if rss, ok := hostRSS(domain); ok {
			t.Errorf("%s: %d from a process that is not its QEMU", domain, rss)
		}
	}
}
