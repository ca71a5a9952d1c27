package libvirt

import (
	"context"
	"strings"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// Stats asks libvirt once for the running domains' statistics (CPU,
// balloon, interfaces, block devices) and reports the VMs among ids. The
// balloon's guest figures appear once the guest's driver reports them
// (every balloonPeriod seconds); NICs and disks are named as in the VM's
// spec (the domain lists them in the spec's order).
func (h *Hypervisor) Stats(ctx context.Context, ids []string) ([]ports.VMStats, error) {
	conn, err := h.connection()
	if err != nil {
		return nil, err
	}
	// Copies, taken under the lock: SetMemory changes a record's spec.
	wanted := map[string]ports.VMSpec{} // by lower-case UUID
	h.mu.Lock()
	for _, id := range ids {
		if r := h.records[id]; r != nil {
			wanted[strings.ToLower(r.Spec.UUID)] = r.Spec
		}
	}
	h.mu.Unlock()
	if len(wanted) == 0 {
		return nil, nil
	}
	types := libvirt.DOMAIN_STATS_CPU_TOTAL | libvirt.DOMAIN_STATS_BALLOON | libvirt.DOMAIN_STATS_INTERFACE | libvirt.DOMAIN_STATS_BLOCK
	all, err := conn.GetAllDomainStats(nil, types, libvirt.CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE|libvirt.CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT)
	if err != nil {
		return nil, libvirtError("domain stats", err)
	}
	now := time.Now()
	var out []ports.VMStats
	for _, ds := range all {
		uuid, err := ds.Domain.GetUUIDString()
		spec, ok := wanted[strings.ToLower(uuid)]
		ds.Domain.Free()
		if err != nil || !ok {
			continue
		}
		out = append(out, vmStats(spec, ds, now))
	}
	return out, nil
}

// vmStats converts libvirt's figures (balloon in KiB) to the port's. A
// figure libvirt did not report is left unknown, never zero: with NOWAIT
// it skips what needs the VM's monitor while that is busy, and the
// guest's figures need its balloon driver.
func vmStats(spec ports.VMSpec, ds libvirt.DomainStats, now time.Time) ports.VMStats {
	s := ports.VMStats{ID: spec.ID, Timestamp: now}
	if c := ds.Cpu; c != nil && c.TimeSet {
		s.CPUNanos = c.Time
	}
	if b := ds.Balloon; b != nil {
		m := &s.Memory
		if b.CurrentSet && b.RssSet {
			m.HostReported, m.CurrentBytes, m.RSSBytes = true, b.Current<<10, b.Rss<<10
		}
		if b.AvailableSet && b.UnusedSet {
			m.GuestReported, m.AvailableBytes, m.UnusedBytes = true, b.Available<<10, b.Unused<<10
			if b.DiskCachesSet {
				m.CacheBytes = b.DiskCaches << 10
			}
		}
		if b.MinorFaultSet && b.MajorFaultSet {
			m.FaultsReported, m.MinorFaults, m.MajorFaults = true, b.MinorFault, b.MajorFault
		}
	}
	for i, b := range ds.Block {
		name := b.Name
		if i < len(spec.Disks) {
			name = spec.Disks[i].Name
		}
		d := ports.DiskStats{Name: name, ReadBytes: b.RdBytes, WriteBytes: b.WrBytes, ReadOps: b.RdReqs, WriteOps: b.WrReqs}
		// The host storage a disk takes is its container's size
		// (physical: the image file, the block device); allocation is
		// only the highest offset the guest wrote.
		if b.CapacitySet && (b.PhysicalSet || b.AllocationSet) {
			d.SizesReported, d.CapacityBytes = true, b.Capacity
			d.AllocationBytes = b.Allocation
			if b.PhysicalSet {
				d.AllocationBytes = b.Physical
			}
		}
		s.Disks = append(s.Disks, d)
	}
	for i, n := range ds.Net {
		name := n.Name
		if i < len(spec.NICs) {
			name = spec.NICs[i].Name
		}
		s.NICs = append(s.NICs, ports.NICStats{Name: name, RxBytes: n.RxBytes, TxBytes: n.TxBytes,
			RxErrors: n.RxErrs, TxErrors: n.TxErrs, RxPackets: n.RxPkts, TxPackets: n.TxPkts})
	}
	return s
}

var _ ports.StatsReporter = (*Hypervisor)(nil)
