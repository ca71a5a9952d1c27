package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// statsService reports the VMs' resource usage from the hypervisor.
type statsService struct {
	*shared
	pods         *sandboxService
	vms          *vmService
	fsMu         sync.Mutex
	fsMountpoint string // the image store's file system, once found
}

// Usage is a VM's resource usage in the terms kubelet uses for containers.
// The *Known flags say which figures the hypervisor reported: an unknown
// figure is left out of the CRI answer, never reported as zero.
type Usage struct {
	Timestamp time.Time
	// CPUNanos is cumulative CPU time (kubelet derives rates from it).
	CPUNanos uint64
	// MemoryKnown: the four below are known.
	MemoryKnown bool
	// MemoryBytes is memory in use: what the guest uses when its balloon
	// driver reports it, else the host memory the VM holds.
	MemoryBytes uint64
	// WorkingSetBytes is memory in use less what the guest can drop
	// (caches); kubelet evicts and kubectl top reports by it.
	WorkingSetBytes uint64
	// AvailableBytes is the VM's memory less the working set.
	AvailableBytes uint64
	// RSSBytes is the host memory the VM holds.
	RSSBytes uint64
	// FaultsKnown: the guest reported its page faults.
	FaultsKnown              bool
	MinorFaults, MajorFaults uint64
	// RootDiskKnown: RootDiskBytes is known.
	RootDiskKnown bool
	// RootDiskBytes is the host storage the VM's writable root disk takes.
	RootDiskBytes uint64
	Disks         []ports.DiskStats
	NICs          []ports.NICStats
}

// usageOf derives kubelet's figures from the hypervisor's.
func usageOf(s ports.VMStats) Usage {
	m := s.Memory
	u := Usage{Timestamp: s.Timestamp, CPUNanos: s.CPUNanos, Disks: s.Disks, NICs: s.NICs}
	if u.Timestamp.IsZero() {
		u.Timestamp = time.Now()
	}
	if m.FaultsReported {
		u.FaultsKnown, u.MinorFaults, u.MajorFaults = true, m.MinorFaults, m.MajorFaults
	}
	if m.HostReported {
		u.MemoryKnown, u.RSSBytes = true, m.RSSBytes
		if m.GuestReported && m.AvailableBytes >= m.UnusedBytes {
			u.MemoryBytes = m.AvailableBytes - m.UnusedBytes
			u.WorkingSetBytes = u.MemoryBytes
			if m.CacheBytes <= u.WorkingSetBytes {
				u.WorkingSetBytes -= m.CacheBytes
			}
		} else {
			u.MemoryBytes, u.WorkingSetBytes = m.RSSBytes, m.RSSBytes
		}
		if m.CurrentBytes > u.WorkingSetBytes {
			u.AvailableBytes = m.CurrentBytes - u.WorkingSetBytes
		}
	}
	for _, d := range s.Disks {
		if d.Name == "root" && d.SizesReported {
			u.RootDiskKnown, u.RootDiskBytes = true, d.AllocationBytes
		}
	}
	return u
}

// ContainerStats is a container's usage; Usage is nil when its VM does
// not run.
type ContainerStats struct {
	Container *Container
	Usage     *Usage
	// WritableLayerFS is the filesystem the VM's writable disk lives on
	// (the image store's).
	WritableLayerFS string
}

// SandboxStats is a VM pod's usage: its VM's (the pod has one).
type SandboxStats struct {
	Sandbox    *Sandbox
	Containers []ContainerStats
}

// ContainerStats reports one container.
func (r *statsService) ContainerStats(ctx context.Context, id string) (ContainerStats, error) {
	c, err := r.vms.ContainerStatus(ctx, id)
	if err != nil {
		return ContainerStats{}, err
	}
	out, err := r.usage(ctx, []*Container{&c})
	if err != nil {
		return ContainerStats{}, err
	}
	return out[0], nil
}

// ListContainerStats reports the running containers matching f with one
// query of the hypervisor.
func (r *statsService) ListContainerStats(ctx context.Context, f ContainerFilter) ([]ContainerStats, error) {
	f.State = ContainerRunning
	return r.usage(ctx, r.vms.ListContainers(f))
}

// SandboxStats reports one VM pod.
func (r *statsService) SandboxStats(ctx context.Context, id string) (SandboxStats, error) {
	sb, err := r.pods.SandboxStatus(ctx, id)
	if err != nil {
		return SandboxStats{}, err
	}
	out, err := r.sandboxUsage(ctx, []*Sandbox{&sb})
	if err != nil {
		return SandboxStats{}, err
	}
	return out[0], nil
}

// ListSandboxStats reports the VM pods matching f with one query of the
// hypervisor.
func (r *statsService) ListSandboxStats(ctx context.Context, f SandboxFilter) ([]SandboxStats, error) {
	return r.sandboxUsage(ctx, r.pods.ListSandboxes(f))
}

func (r *statsService) sandboxUsage(ctx context.Context, sandboxes []*Sandbox) ([]SandboxStats, error) {
	var all []*Container
	owner := map[string]int{}
	for i, sb := range sandboxes {
		for _, c := range r.containersOf(sb.ID) {
			if c.State == ContainerRunning {
				owner[c.ID] = i
				all = append(all, c)
			}
		}
	}
	cs, err := r.usage(ctx, all)
	if err != nil {
		return nil, err
	}
	out := make([]SandboxStats, len(sandboxes))
	for i, sb := range sandboxes {
		out[i].Sandbox = sb
	}
	for _, s := range cs {
		i := owner[s.Container.ID]
		out[i].Containers = append(out[i].Containers, s)
	}
	return out, nil
}

// usage asks the hypervisor once for the running VMs among cs.
func (r *statsService) usage(ctx context.Context, cs []*Container) ([]ContainerStats, error) {
	out := make([]ContainerStats, len(cs))
	var ids []string
	for i, c := range cs {
		out[i].Container = c
		if c.State == ContainerRunning && !c.Halted() {
			ids = append(ids, c.ID)
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	sr, ok := r.deps.Hypervisor.(ports.StatsReporter)
	if !ok {
		return nil, fmt.Errorf("VM stats: the hypervisor plugin reports no stats: %w", ports.ErrUnimplemented)
	}
	stats, err := sr.Stats(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("VM stats: %w", err)
	}
	byID := make(map[string]ports.VMStats, len(stats))
	for _, s := range stats {
		byID[s.ID] = s
	}
	fs := r.writableLayerFS(ctx)
	for i := range out {
		out[i].WritableLayerFS = fs
		if s, ok := byID[out[i].Container.ID]; ok {
			u := usageOf(s)
			u.CPUNanos += out[i].Container.CPUNanosBefore // earlier boots (halts)
			out[i].Usage = &u
		}
	}
	return out, nil
}

// writableLayerFS names the filesystem of the VMs' writable disks: the
// image store's, where kubelet already accounts image usage (ImageFsInfo).
// It is looked up until found once, then remembered.
func (r *statsService) writableLayerFS(ctx context.Context) string {
	r.fsMu.Lock()
	defer r.fsMu.Unlock()
	if r.fsMountpoint == "" {
		if u, err := r.deps.ImageFiles.Usage(ctx); err == nil {
			r.fsMountpoint = u.Mountpoint
		}
	}
	return r.fsMountpoint
}
