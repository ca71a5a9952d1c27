package cri

import (
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// A VM pod's memory is what its QEMU holds on the host; its container's
// is the guest's own view. Without a known RSS the pod reports the
// container's figures.
func TestPodMemoryIsTheHostsCost(t *testing.T) {
	usage := func(rss uint64) *core.Usage {
		return &core.Usage{Timestamp: time.Unix(100, 0), MemoryKnown: true, MemoryBytes: 120 << 20, WorkingSetBytes: 100 << 20,
			AvailableBytes: 412 << 20, RSSBytes: rss}
	}
	for _, tc := range []struct {
		name                string
		rss                 uint64
		podWorkingSet, podU uint64
	}{
		{"rss known", 300 << 20, 300 << 20, 300 << 20},
		{"rss unknown", 0, 100 << 20, 120 << 20},
	} {
		st := sandboxStats(core.SandboxStats{Sandbox: &core.Sandbox{ID: "sb"},
			Containers: []core.ContainerStats{{Container: &core.Container{ID: "c", SandboxID: "sb"}, Usage: usage(tc.rss)}}})
		pod, ctr := st.Linux.Memory, st.Linux.Containers[0].Memory
		if pod.WorkingSetBytes.GetValue() != tc.podWorkingSet || pod.UsageBytes.GetValue() != tc.podU {
			t.Errorf("%s: pod working set %d, usage %d; want %d, %d", tc.name, pod.WorkingSetBytes.GetValue(), pod.UsageBytes.GetValue(), tc.podWorkingSet, tc.podU)
		}
		if ctr.WorkingSetBytes.GetValue() != 100<<20 || ctr.AvailableBytes.GetValue() != 412<<20 {
			t.Errorf("%s: the container's memory is not the guest's view: %v", tc.name, ctr)
		}
	}
}

// Network usage goes out only with its default interface: kubelet 1.36
// dereferences it (addCRIPodNetworkStats), and a VM whose figures have no
// NIC (stopping, or without a pod network) crashed the node's kubelet.
func TestPodNetworkUsageAlwaysHasItsDefaultInterface(t *testing.T) {
	for _, tc := range []struct {
		name string
		nics []ports.NICStats
		want string
	}{
		{"no NIC", nil, ""},
		{"one NIC", []ports.NICStats{{Name: "eth0", RxBytes: 10}}, "eth0"},
	} {
		st := sandboxStats(core.SandboxStats{Sandbox: &core.Sandbox{ID: "sb"},
			Containers: []core.ContainerStats{{Container: &core.Container{ID: "c", SandboxID: "sb"}, Usage: &core.Usage{Timestamp: time.Unix(100, 0), NICs: tc.nics}}}})
		net := st.Linux.Network
		switch {
		case tc.want == "" && net != nil:
			t.Errorf("%s: network usage %v without a default interface", tc.name, net)
		case tc.want != "" && (net == nil || net.DefaultInterface == nil || net.DefaultInterface.Name != tc.want):
			t.Errorf("%s: network usage %v, want the default interface %s", tc.name, net, tc.want)
		}
	}
}
