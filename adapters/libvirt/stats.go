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
	wanted := map[string]*record{} // by lower-case UUID
	h.mu.Lock()
	for _, id := range ids {
		if r := h.records[id]; r != nil {
			wanted[strings.ToLower(r.Spec.UUID)] = r
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
		r := wanted[strings.ToLower(uuid)]
		ds.Domain.Free()
		if err != nil || r == nil {
			continue
		}
		out = append(out, vmStats(r.Spec, ds, now))
	}
	return out, nil
}

// vmStats converts libvirt's figures (balloon in KiB) to the port's.
func vmStats(spec ports.VMSpec, ds libvirt.DomainStats, now time.Time) ports.VMStats {
	s := ports.VMStats{ID: spec.ID, Timestamp: now}
	if c := ds.Cpu; c != nil && c.TimeSet {
		s.CPUNanos = c.Time
	}
	if b := ds.Balloon; b != nil {
		s.Memory = ports.MemoryStats{CurrentBytes: b.Current << 10, RSSBytes: b.Rss << 10,
			GuestReported:  b.AvailableSet && b.UnusedSet,
			AvailableBytes: b.Available << 10, UnusedBytes: b.Unused << 10, CacheBytes: b.DiskCaches << 10,
			MinorFaults: b.MinorFault, MajorFaults: b.MajorFault}
	}
	for i, b := range ds.Block {
		name := b.Name
		if i < len(spec.Disks) {
			name = spec.Disks[i].Name
		}
		s.Disks = append(s.Disks, ports.DiskStats{Name: name, ReadBytes: b.RdBytes, WriteBytes: b.WrBytes,
			ReadOps: b.RdReqs, WriteOps: b.WrReqs, AllocationBytes: b.Allocation, CapacityBytes: b.Capacity})
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
