package cri

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
)

// Stats: each list is one query of the hypervisor plugin, which asks
// libvirt for all VMs at once. A VM's CPU time and memory are the
// container's; its NICs' traffic is the pod's network usage. CRI has no
// field for disk I/O: the VM's disks are in ContainerStatus's verbose info.

func (s *Server) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	st, err := s.rt.ContainerStats(ctx, req.ContainerId)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ContainerStatsResponse{Stats: containerStats(st)}, nil
}

func (s *Server) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	f := core.ContainerFilter{}
	if flt := req.GetFilter(); flt != nil {
		f.ID, f.SandboxID, f.LabelSelector = flt.Id, flt.PodSandboxId, flt.LabelSelector
	}
	list, err := s.rt.ListContainerStats(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListContainerStatsResponse{}
	for _, st := range list {
		resp.Stats = append(resp.Stats, containerStats(st))
	}
	return resp, nil
}

func (s *Server) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	st, err := s.rt.SandboxStats(ctx, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PodSandboxStatsResponse{Stats: sandboxStats(st)}, nil
}

func (s *Server) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	f := core.SandboxFilter{}
	if flt := req.GetFilter(); flt != nil {
		f.ID, f.LabelSelector = flt.Id, flt.LabelSelector
	}
	list, err := s.rt.ListSandboxStats(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListPodSandboxStatsResponse{}
	for _, st := range list {
		resp.Stats = append(resp.Stats, sandboxStats(st))
	}
	return resp, nil
}

func u64(v uint64) *runtimeapi.UInt64Value { return &runtimeapi.UInt64Value{Value: v} }

func containerStats(st core.ContainerStats) *runtimeapi.ContainerStats {
	c := st.Container
	out := &runtimeapi.ContainerStats{Attributes: &runtimeapi.ContainerAttributes{
		Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt}, Labels: c.Labels, Annotations: c.Annotations,
	}}
	u := st.Usage
	if u == nil {
		return out
	}
	ts := u.Timestamp.UnixNano()
	out.Cpu = &runtimeapi.CpuUsage{Timestamp: ts, UsageCoreNanoSeconds: u64(u.CPUNanos)}
	out.Memory = memoryUsage(u)
	if u.RootDiskKnown {
		// Inodes: the disk is one file on the host; the guest's inodes
		// are not the node's, so InodesUsed is left unset.
		out.WritableLayer = &runtimeapi.FilesystemUsage{Timestamp: ts, FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: st.WritableLayerFS},
			UsedBytes: u64(u.RootDiskBytes)}
	}
	return out
}

// memoryUsage is nil when the hypervisor did not report the VM's memory:
// kubelet then keeps its last figures rather than seeing zero.
func memoryUsage(u *core.Usage) *runtimeapi.MemoryUsage {
	if !u.MemoryKnown {
		return nil
	}
	m := &runtimeapi.MemoryUsage{Timestamp: u.Timestamp.UnixNano(), WorkingSetBytes: u64(u.WorkingSetBytes),
		AvailableBytes: u64(u.AvailableBytes), UsageBytes: u64(u.MemoryBytes), RssBytes: u64(u.RSSBytes)}
	if u.FaultsKnown {
		m.PageFaults, m.MajorPageFaults = u64(u.MinorFaults), u64(u.MajorFaults)
	}
	return m
}

// podMemoryUsage is a VM pod's memory as the node pays for it: the host
// memory its QEMU holds (the guest's touched memory, QEMU's own and the
// translation cache), which kubelet's summary API, kubectl top's pod
// figure and the eviction manager read for the pod (kubelet's
// PodAndContainerStatsFromCRI). The container's figures stay the guest's
// own view (memory in use less caches). Without a known RSS the pod's are
// the container's.
func podMemoryUsage(u *core.Usage) *runtimeapi.MemoryUsage {
	m := memoryUsage(u)
	if m == nil || u.RSSBytes == 0 {
		return m
	}
	return &runtimeapi.MemoryUsage{Timestamp: m.Timestamp, WorkingSetBytes: u64(u.RSSBytes), UsageBytes: u64(u.RSSBytes), RssBytes: u64(u.RSSBytes),
		PageFaults: m.PageFaults, MajorPageFaults: m.MajorPageFaults}
}

func sandboxStats(st core.SandboxStats) *runtimeapi.PodSandboxStats {
	sb := st.Sandbox
	out := &runtimeapi.PodSandboxStats{
		Attributes: &runtimeapi.PodSandboxAttributes{Id: sb.ID, Metadata: sandboxMetadata(sb), Labels: sb.Labels, Annotations: sb.Annotations},
		Linux:      &runtimeapi.LinuxPodSandboxStats{},
	}
	for _, cs := range st.Containers {
		out.Linux.Containers = append(out.Linux.Containers, containerStats(cs))
		u := cs.Usage
		if u == nil {
			continue
		}
		// A VM pod's usage is its VM's.
		ts := u.Timestamp.UnixNano()
		out.Linux.Cpu = &runtimeapi.CpuUsage{Timestamp: ts, UsageCoreNanoSeconds: u64(u.CPUNanos)}
		out.Linux.Memory = podMemoryUsage(u)
		net := &runtimeapi.NetworkUsage{Timestamp: ts}
		for _, n := range u.NICs {
			iface := &runtimeapi.NetworkInterfaceUsage{Name: n.Name, RxBytes: u64(n.RxBytes), RxErrors: u64(n.RxErrors),
				TxBytes: u64(n.TxBytes), TxErrors: u64(n.TxErrors)}
			if net.DefaultInterface == nil {
				net.DefaultInterface = iface
			}
			net.Interfaces = append(net.Interfaces, iface)
		}
		// Network usage without a default interface crashes kubelet
		// (1.36's addCRIPodNetworkStats dereferences it): a VM whose
		// figures have no NIC (one stopping, one without a pod network)
		// reports none.
		if net.DefaultInterface != nil {
			out.Linux.Network = net
		}
	}
	return out
}
