package core

import (
	"reflect"
	"testing"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Figures the hypervisor did not report stay unknown; the guest's own
// figures win over the host's when its balloon driver reports them.
func TestUsageOf(t *testing.T) {
	const mib = 1 << 20
	at := time.Unix(100, 0)
	host := ports.MemoryStats{HostReported: true, CurrentBytes: 512 * mib, RSSBytes: 300 * mib}
	guest := host
	guest.GuestReported, guest.AvailableBytes, guest.UnusedBytes, guest.CacheBytes = true, 480*mib, 200*mib, 80*mib
	root := ports.DiskStats{Name: "root", SizesReported: true, AllocationBytes: 40 * mib, CapacityBytes: 2048 * mib}
	for _, tc := range []struct {
		name string
		in   ports.VMStats
		want Usage
	}{{
		name: "nothing but CPU reported (a busy monitor)",
		in:   ports.VMStats{Timestamp: at, CPUNanos: 7, Disks: []ports.DiskStats{{Name: "root"}}},
		want: Usage{Timestamp: at, CPUNanos: 7, Disks: []ports.DiskStats{{Name: "root"}}},
	}, {
		name: "host figures only (no balloon driver in the guest)",
		in:   ports.VMStats{Timestamp: at, Memory: host},
		want: Usage{Timestamp: at, MemoryKnown: true, MemoryBytes: 300 * mib, WorkingSetBytes: 300 * mib,
			AvailableBytes: 212 * mib, RSSBytes: 300 * mib},
	}, {
		name: "the guest's figures",
		in:   ports.VMStats{Timestamp: at, Memory: guest},
		want: Usage{Timestamp: at, MemoryKnown: true, MemoryBytes: 280 * mib, WorkingSetBytes: 200 * mib,
			AvailableBytes: 312 * mib, RSSBytes: 300 * mib},
	}, {
		name: "guest figures without the host's are not used alone",
		in:   ports.VMStats{Timestamp: at, Memory: ports.MemoryStats{GuestReported: true, AvailableBytes: 480 * mib, UnusedBytes: 200 * mib}},
		want: Usage{Timestamp: at},
	}, {
		name: "faults and the root disk",
		in: ports.VMStats{Timestamp: at, Memory: ports.MemoryStats{FaultsReported: true, MinorFaults: 9, MajorFaults: 2},
			Disks: []ports.DiskStats{root, {Name: "vol-data", SizesReported: true, AllocationBytes: mib}}},
		want: Usage{Timestamp: at, FaultsKnown: true, MinorFaults: 9, MajorFaults: 2, RootDiskKnown: true, RootDiskBytes: 40 * mib,
			Disks: []ports.DiskStats{root, {Name: "vol-data", SizesReported: true, AllocationBytes: mib}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := usageOf(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("usageOf:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
