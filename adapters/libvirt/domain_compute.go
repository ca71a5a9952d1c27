package libvirt

import (
	"os"
	"slices"
	"strconv"
	"strings"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setCompute sets the vCPUs (their count, the hot-pluggable layout of a VM
// that can change them), the CPU model and topology, and the pinning.
func setCompute(d *libvirtxml.Domain, in domainInput, _ pciSlots) error {
	s := in.Spec
	d.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: uint(s.VCPUs)}
	d.VCPUs = hotplugVCPUs(s)
	if d.VCPUs != nil {
		d.VCPU.Current, d.VCPU.Value = uint(s.VCPUs), uint(topVCPUs(s))
	}
	cpu, err := domainCPU(s.CPU)
	if err != nil {
		return err
	}
	d.CPU = cpu
	d.CPUTune = cpuTune(topVCPUs(s), s.CPUSet, in.HostCPUs)
	if l := s.CPULimits; l.Shares > 0 || l.Quota > 0 {
		if d.CPUTune == nil {
			d.CPUTune = &libvirtxml.DomainCPUTune{}
		}
		if l.Shares > 0 {
			d.CPUTune.Shares = &libvirtxml.DomainCPUTuneShares{Value: uint(l.Shares)}
		}
		if l.Quota > 0 {
			// The whole VM's limit, its vCPUs and QEMU's own threads
			// together, as a container's is.
			d.CPUTune.GlobalPeriod = &libvirtxml.DomainCPUTunePeriod{Value: uint64(cfsPeriod(l.Period))}
			d.CPUTune.GlobalQuota = &libvirtxml.DomainCPUTuneQuota{Value: l.Quota}
		}
	}
	return nil
}

// cfsPeriod is a CFS period, CFS's default when none is given.
func cfsPeriod(period int64) int64 {
	if period <= 0 {
		return 100_000
	}
	return period
}

// schedulerParams are libvirt's scheduler parameters for CPU limits: a
// limit of none is libvirt's -1 (no quota), shares of none the cgroup's
// default weight (the weight a VM created without shares has).
func schedulerParams(l ports.CPULimits) *libvirt.DomainSchedulerParameters {
	p := &libvirt.DomainSchedulerParameters{GlobalPeriodSet: true, GlobalPeriod: uint64(cfsPeriod(l.Period)), GlobalQuotaSet: true, GlobalQuota: -1,
		CpuSharesSet: true, CpuShares: defaultCPUShares()}
	if l.Quota > 0 {
		p.GlobalQuota = l.Quota
	}
	if l.Shares > 0 {
		p.CpuShares = l.Shares
	}
	return p
}

// defaultCPUShares is a cgroup's default CPU weight as libvirt's
// cpu_shares: cgroup v2's cpu.weight 100 (libvirt writes cpu_shares to it
// as is), cgroup v1's cpu.shares 1024.
func defaultCPUShares() uint64 {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return 100
	}
	return 1024
}

func domainCPU(c ports.CPUSpec) (*libvirtxml.DomainCPU, error) {
	if s := c.Setting; s != nil {
		cpu := &libvirtxml.DomainCPU{Mode: s.Mode, Match: s.Match, Check: s.Check, Migratable: s.Migratable, Vendor: s.Vendor}
		if m := s.Model; m != nil {
			cpu.Model = &libvirtxml.DomainCPUModel{Fallback: m.Fallback, VendorID: m.VendorID, Value: m.Value}
		}
		if t := s.Topology; t != nil {
			cpu.Topology = &libvirtxml.DomainCPUTopology{Sockets: t.Sockets, Dies: t.Dies, Cores: t.Cores, Threads: t.Threads}
		}
		for _, f := range s.Features {
			cpu.Features = append(cpu.Features, libvirtxml.DomainCPUFeature{Policy: f.Policy, Name: f.Name})
		}
		if ca := s.Cache; ca != nil {
			cpu.Cache = &libvirtxml.DomainCPUCache{Mode: ca.Mode}
			if ca.Level > 0 {
				cpu.Cache.Level = uint(ca.Level)
			}
		}
		if n := s.Numa; n != nil {
			cpu.Numa = &libvirtxml.DomainNuma{}
			for _, cell := range n.Cells {
				dc := libvirtxml.DomainCell{CPUs: cell.CPUs, Memory: uint(cell.Memory), Unit: cell.Unit}
				if cell.ID != nil {
					id := uint(*cell.ID)
					dc.ID = &id
				}
				cpu.Numa.Cell = append(cpu.Numa.Cell, dc)
			}
		}
		return cpu, nil
	}
	switch c.Model {
	case "":
		return nil, nil // the hypervisor's default CPU
	case "host-model":
		return &libvirtxml.DomainCPU{Mode: "host-model"}, nil
	default:
		return nil, &ports.InvalidError{Field: "CPU model", Value: c.Model, Allowed: `"" or "host-model"`}
	}
}

// topVCPUs is the most vCPUs the VM can have.
func topVCPUs(s ports.VMSpec) int { return max(s.VCPUs, s.MaxVCPUs) }

// hotplugVCPUs lays out the vCPUs of a VM that can change them while it
// runs (MaxVCPUs set; nil for one that cannot): the first MinVCPUs fixed,
// the rest up to VCPUs present and hot-pluggable (so that they can be
// unplugged again), the rest up to MaxVCPUs absent and hot-pluggable.
func hotplugVCPUs(s ports.VMSpec) *libvirtxml.DomainVCPUs {
	if s.MaxVCPUs == 0 {
		return nil
	}
	top, fixed := topVCPUs(s), max(s.MinVCPUs, 1)
	v := &libvirtxml.DomainVCPUs{}
	for i := 0; i < top; i++ {
		id := uint(i)
		c := libvirtxml.DomainVCPUsVCPU{Id: &id, Enabled: "no", Hotpluggable: "yes"}
		if i < s.VCPUs {
			c.Enabled = "yes"
			order := uint(i + 1)
			c.Order = &order
		}
		if i < fixed {
			c.Hotpluggable = "no"
		}
		v.VCPU = append(v.VCPU, c)
	}
	return v
}

// cpuTune pins the vCPUs to the container's CPUs, one each in order when
// there are exactly as many (kubelet's static CPU manager gives a
// Guaranteed pod as many as it has whole CPUs), else each to all of them, and keeps QEMU's emulator
// threads on the host's other CPUs (unpinned when there are none).
func cpuTune(vcpus int, set, host []int) *libvirtxml.DomainCPUTune {
	if len(set) == 0 {
		return nil
	}
	t := &libvirtxml.DomainCPUTune{}
	all := cpuList(set)
	for i := 0; i < vcpus; i++ {
		pin := all
		if len(set) == vcpus {
			pin = strconv.Itoa(set[i])
		}
		t.VCPUPin = append(t.VCPUPin, libvirtxml.DomainCPUTuneVCPUPin{VCPU: uint(i), CPUSet: pin})
	}
	var others []int
	for _, c := range host {
		if !slices.Contains(set, c) {
			others = append(others, c)
		}
	}
	if len(others) > 0 {
		t.EmulatorPin = &libvirtxml.DomainCPUTuneEmulatorPin{CPUSet: cpuList(others)}
	}
	return t
}

func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}
