package libvirt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	conn, err := h.conn.current()
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
		out = append(out, vmStats(spec, ds, now, hostRSS))
	}
	return out, nil
}

// vmStats converts libvirt's figures (balloon in KiB) to the port's. A
// figure libvirt did not report is left unknown, never zero: with NOWAIT
// it skips what needs the VM's monitor while that is busy, and the
// guest's figures need its balloon driver. The host's figure, QEMU's
// resident memory, is then read from /proc as libvirt reads it (rss): a
// busy monitor is usual right after a start on a loaded node, and a VM
// without its memory would be one kubelet (and critest's container stats)
// sees none for.
func vmStats(spec ports.VMSpec, ds libvirt.DomainStats, now time.Time, rss func(domain string) (uint64, bool)) ports.VMStats {
	s := ports.VMStats{ID: spec.ID, Timestamp: now}
	if c := ds.Cpu; c != nil && c.TimeSet {
		s.CPUNanos = c.Time
	}
	if b := ds.Balloon; b != nil {
		m := &s.Memory
		if b.CurrentSet && b.RssSet {
			m.HostReported, m.CurrentBytes, m.RSSBytes = true, b.Current<<10, b.Rss<<10
		} else if b.CurrentSet {
			if bytes, ok := rss(spec.Name); ok {
				m.HostReported, m.CurrentBytes, m.RSSBytes = true, b.Current<<10, bytes
			}
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

// qemuRunDir is where the system libvirtd keeps each running domain's
// QEMU pid file, <domain>.pid.
var qemuRunDir = "/run/libvirt/qemu"

// hostRSS reads the resident memory of a running domain's QEMU from
// /proc (statm), after checking that the pid file's process is that
// domain's QEMU (-name guest=<domain>,...).
func hostRSS(domain string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(qemuRunDir, domain+".pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !slices.ContainsFunc(strings.Split(string(cmdline), "\x00"), func(arg string) bool {
		return arg == "guest="+domain || strings.HasPrefix(arg, "guest="+domain+",")
	}) {
		return 0, false
	}
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(statm))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * uint64(os.Getpagesize()), true
}
