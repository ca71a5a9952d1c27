package hypervisor

import (
	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

func specToProto(s ports.VMSpec) *hypervisorv1.VMSpec {
	return &hypervisorv1.VMSpec{
		Id: s.ID, Name: s.Name, Uuid: s.UUID, SandboxId: s.SandboxID,
		PodName: s.PodName, PodNamespace: s.PodNamespace, PodUid: s.PodUID,
		Vcpus: int32(s.VCPUs), MaxVcpus: int32(s.MaxVCPUs), MinVcpus: int32(s.MinVCPUs), MemoryBytes: s.MemoryBytes, MaxMemoryBytes: s.MaxMemoryBytes, HugepageSizeBytes: s.HugepageSizeBytes,
		Cpu:   &hypervisorv1.CPUSpec{Model: s.CPU.Model, Setting: cpuSettingToProto(s.CPU.Setting)},
		Disks: base.DisksToProto(s.Disks), Filesystems: base.FilesystemsToProto(s.Filesystems), Nics: base.NICsToProto(s.NICs),
		ConsoleLogPath: s.ConsoleLogPath, RunAs: base.IdentityToProto(s.RunAs), Machine: s.Machine, Firmware: s.Firmware, SecureBoot: s.SecureBoot, HyperV: s.HyperV, NoMemorySharing: s.NoMemorySharing, CpuLimits: CPULimitsToProto(s.CPULimits),
		Clock: clockToProto(s.Clock), Watchdog: watchdogToProto(s.Watchdog), CpuSet: ints32(s.CPUSet), Restore: restoreToProto(s.Restore),
		Incoming: incomingToProto(s.Incoming),
	}
}

func restoreToProto(r *ports.VMRestore) *hypervisorv1.VMRestore {
	if r == nil {
		return nil
	}
	return &hypervisorv1.VMRestore{StateFile: r.StateFile, Disks: r.Disks}
}

func restoreFromProto(p *hypervisorv1.VMRestore) *ports.VMRestore {
	if p == nil {
		return nil
	}
	return &ports.VMRestore{StateFile: p.StateFile, Disks: p.Disks}
}

func specFromProto(p *hypervisorv1.VMSpec) ports.VMSpec {
	return ports.VMSpec{
		ID: p.Id, Name: p.Name, UUID: p.Uuid, SandboxID: p.SandboxId,
		PodName: p.PodName, PodNamespace: p.PodNamespace, PodUID: p.PodUid,
		VCPUs: int(p.Vcpus), MaxVCPUs: int(p.MaxVcpus), MinVCPUs: int(p.MinVcpus), MemoryBytes: p.MemoryBytes, MaxMemoryBytes: p.MaxMemoryBytes, HugepageSizeBytes: p.HugepageSizeBytes,
		CPU:   ports.CPUSpec{Model: p.GetCpu().GetModel(), Setting: cpuSettingFromProto(p.GetCpu().GetSetting())},
		Disks: base.DisksFromProto(p.Disks), Filesystems: base.FilesystemsFromProto(p.Filesystems), NICs: base.NICsFromProto(p.Nics),
		ConsoleLogPath: p.ConsoleLogPath, RunAs: base.IdentityFromProto(p.RunAs), Machine: p.Machine, Firmware: p.Firmware, SecureBoot: p.SecureBoot, HyperV: p.HyperV, NoMemorySharing: p.NoMemorySharing, CPULimits: CPULimitsFromProto(p.GetCpuLimits()),
		Clock: clockFromProto(p.GetClock()), Watchdog: watchdogFromProto(p.GetWatchdog()), CPUSet: ints(p.GetCpuSet()), Restore: restoreFromProto(p.GetRestore()),
		Incoming: incomingFromProto(p.GetIncoming()),
	}
}

func cpuSettingToProto(s *ports.CPUSetting) *hypervisorv1.CPUSetting {
	if s == nil {
		return nil
	}
	p := &hypervisorv1.CPUSetting{Mode: s.Mode, Match: s.Match, Check: s.Check, Migratable: s.Migratable, Vendor: s.Vendor}
	if m := s.Model; m != nil {
		p.Model = &hypervisorv1.CPUModel{Fallback: m.Fallback, VendorId: m.VendorID, Value: m.Value}
	}
	if t := s.Topology; t != nil {
		p.Topology = &hypervisorv1.CPUTopology{Sockets: int32(t.Sockets), Dies: int32(t.Dies), Cores: int32(t.Cores), Threads: int32(t.Threads)}
	}
	for _, f := range s.Features {
		p.Features = append(p.Features, &hypervisorv1.CPUFeature{Policy: f.Policy, Name: f.Name})
	}
	if c := s.Cache; c != nil {
		p.Cache = &hypervisorv1.CPUCache{Level: int32(c.Level), Mode: c.Mode}
	}
	if n := s.Numa; n != nil {
		p.HasNuma = true
		for _, c := range n.Cells {
			cell := &hypervisorv1.CPUNumaCell{Cpus: c.CPUs, Memory: c.Memory, Unit: c.Unit}
			if c.ID != nil {
				id := int32(*c.ID)
				cell.Id = &id
			}
			p.NumaCells = append(p.NumaCells, cell)
		}
	}
	return p
}

func cpuSettingFromProto(p *hypervisorv1.CPUSetting) *ports.CPUSetting {
	if p == nil {
		return nil
	}
	s := &ports.CPUSetting{Mode: p.Mode, Match: p.Match, Check: p.Check, Migratable: p.Migratable, Vendor: p.Vendor}
	if m := p.Model; m != nil {
		s.Model = &ports.CPUSettingModel{Fallback: m.Fallback, VendorID: m.VendorId, Value: m.Value}
	}
	if t := p.Topology; t != nil {
		s.Topology = &ports.CPUTopology{Sockets: int(t.Sockets), Dies: int(t.Dies), Cores: int(t.Cores), Threads: int(t.Threads)}
	}
	for _, f := range p.Features {
		s.Features = append(s.Features, ports.CPUFeature{Policy: f.Policy, Name: f.Name})
	}
	if c := p.Cache; c != nil {
		s.Cache = &ports.CPUCache{Level: int(c.Level), Mode: c.Mode}
	}
	if p.HasNuma {
		s.Numa = &ports.CPUNuma{}
		for _, c := range p.NumaCells {
			cell := ports.CPUNumaCell{CPUs: c.Cpus, Memory: c.Memory, Unit: c.Unit}
			if c.Id != nil {
				id := int(*c.Id)
				cell.ID = &id
			}
			s.Numa.Cells = append(s.Numa.Cells, cell)
		}
	}
	return s
}

func statusToProto(s ports.VMStatus) *hypervisorv1.VMStatus {
	return &hypervisorv1.VMStatus{
		Id: s.ID, State: string(s.State), StartedAt: base.Nanos(s.StartedAt), FinishedAt: base.Nanos(s.FinishedAt),
		ExitCode: s.ExitCode, Reason: s.Reason, Message: s.Message, Name: s.Name, Uuid: s.UUID, Prelaunched: s.Prelaunched,
	}
}

func statusFromProto(p *hypervisorv1.VMStatus) ports.VMStatus {
	return ports.VMStatus{
		ID: p.Id, State: ports.VMState(p.State), StartedAt: base.Time(p.StartedAt), FinishedAt: base.Time(p.FinishedAt),
		ExitCode: p.ExitCode, Reason: p.Reason, Message: p.Message, Name: p.Name, UUID: p.Uuid, Prelaunched: p.Prelaunched,
	}
}

func clockToProto(c ports.ClockSpec) *hypervisorv1.ClockSpec {
	p := &hypervisorv1.ClockSpec{Offset: c.Offset, Timezone: c.Timezone, AdjustmentSeconds: c.AdjustmentSeconds}
	for _, t := range c.Timers {
		p.Timers = append(p.Timers, &hypervisorv1.ClockTimer{Name: t.Name, TickPolicy: t.TickPolicy, Present: t.Present})
	}
	return p
}

func clockFromProto(p *hypervisorv1.ClockSpec) ports.ClockSpec {
	c := ports.ClockSpec{Offset: p.GetOffset(), Timezone: p.GetTimezone(), AdjustmentSeconds: p.GetAdjustmentSeconds()}
	for _, t := range p.GetTimers() {
		c.Timers = append(c.Timers, ports.ClockTimer{Name: t.GetName(), TickPolicy: t.GetTickPolicy(), Present: t.GetPresent()})
	}
	return c
}

func watchdogToProto(w *ports.Watchdog) *hypervisorv1.Watchdog {
	if w == nil {
		return nil
	}
	return &hypervisorv1.Watchdog{Model: w.Model, Action: w.Action}
}

func watchdogFromProto(p *hypervisorv1.Watchdog) *ports.Watchdog {
	if p == nil {
		return nil
	}
	return &ports.Watchdog{Model: p.Model, Action: p.Action}
}

func ints32(in []int) []int32 {
	var out []int32
	for _, v := range in {
		out = append(out, int32(v))
	}
	return out
}

func ints(in []int32) []int {
	var out []int
	for _, v := range in {
		out = append(out, int(v))
	}
	return out
}

// CPULimitsToProto and CPULimitsFromProto convert a VM's CPU limits.
func CPULimitsToProto(l ports.CPULimits) *hypervisorv1.CPULimits {
	if l == (ports.CPULimits{}) {
		return nil
	}
	return &hypervisorv1.CPULimits{Shares: l.Shares, Period: l.Period, Quota: l.Quota}
}

func CPULimitsFromProto(p *hypervisorv1.CPULimits) ports.CPULimits {
	return ports.CPULimits{Shares: p.GetShares(), Period: p.GetPeriod(), Quota: p.GetQuota()}
}
