package libvirt

import (
	"reflect"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// What libvirt leaves out (NOWAIT while the monitor is busy, a guest
// without a balloon driver) stays unreported; the disk's host storage is
// its container's size, not the highest offset written.
func TestVMStatsReportsOnlyWhatLibvirtSet(t *testing.T) {
	spec := ports.VMSpec{ID: "id", Disks: []ports.Disk{{Name: "root"}}, NICs: []ports.NIC{{Name: "eth0"}}}
	at := time.Unix(5, 0)
	for _, tc := range []struct {
		name string
		in   libvirt.DomainStats
		want ports.VMStats
	}{{
		name: "monitor busy: CPU and traffic only",
		in: libvirt.DomainStats{Cpu: &libvirt.DomainStatsCPU{TimeSet: true, Time: 42}, Balloon: &libvirt.DomainStatsBalloon{},
			Block: []libvirt.DomainStatsBlock{{Name: "vda", RdBytesSet: true, RdBytes: 7}},
			Net:   []libvirt.DomainStatsNet{{Name: "tap0", RxBytesSet: true, RxBytes: 9}}},
		want: ports.VMStats{ID: "id", Timestamp: at, CPUNanos: 42, Disks: []ports.DiskStats{{Name: "root", ReadBytes: 7}},
			NICs: []ports.NICStats{{Name: "eth0", RxBytes: 9}}},
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
			if got := vmStats(spec, tc.in, at); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
