package cri

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
)

// CRI metrics: with PodAndContainerStatsFromCRI on, kubelet's
// /metrics/cadvisor is made of them alone (no cAdvisor), so a VM pod's
// usage reaches Prometheus only through these two calls. The names are
// cAdvisor's. Values are whole numbers (CRI's metric value is an integer):
// CPU time in whole seconds, as containerd reports it.
//
// The label keys are chosen so that a mixed node's container pods fit
// them too: containerd 2.2 sends its container metrics with the values
// (container, pod, namespace, id) and its pod network metrics with (pod,
// namespace, id, interface), and kubelet keeps one descriptor per name
// (the router offers Virtlet's first).
var (
	containerLabels = []string{"container", "pod", "namespace", "id"}
	networkLabels   = []string{"pod", "namespace", "id", "interface"}
	diskLabels      = append(append([]string{}, containerLabels...), "device")
)

type metricDesc struct {
	name, help string
	counter    bool
	labels     []string
}

var metricDescs = []metricDesc{
	{"container_cpu_usage_seconds_total", "Cumulative CPU time consumed in seconds (a VM: its QEMU's on the host).", true, containerLabels},
	{"container_memory_working_set_bytes", "Current working set in bytes (a VM: the guest's memory in use less caches; the pod, container=\"\": its QEMU's resident memory).", false, containerLabels},
	{"container_memory_usage_bytes", "Current memory usage in bytes (a VM: the guest's memory in use; the pod: its QEMU's resident memory).", false, containerLabels},
	{"container_memory_rss", "Size of RSS in bytes (a VM: its QEMU's resident memory on the host).", false, containerLabels},
	{"container_start_time_seconds", "Start time of the container since unix epoch in seconds.", false, containerLabels},
	{"container_fs_reads_bytes_total", "Cumulative count of bytes read (a VM: by the guest, per disk).", true, diskLabels},
	{"container_fs_writes_bytes_total", "Cumulative count of bytes written (a VM: by the guest, per disk).", true, diskLabels},
	{"container_fs_reads_total", "Cumulative count of reads completed (a VM: per disk).", true, diskLabels},
	{"container_fs_writes_total", "Cumulative count of writes completed (a VM: per disk).", true, diskLabels},
	{"container_network_receive_bytes_total", "Cumulative count of bytes received.", true, networkLabels},
	{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted.", true, networkLabels},
	{"container_network_receive_packets_total", "Cumulative count of packets received.", true, networkLabels},
	{"container_network_transmit_packets_total", "Cumulative count of packets transmitted.", true, networkLabels},
	{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving.", true, networkLabels},
	{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting.", true, networkLabels},
}

var metricTypes = func() map[string]runtimeapi.MetricType {
	m := map[string]runtimeapi.MetricType{}
	for _, d := range metricDescs {
		m[d.name] = runtimeapi.MetricType_GAUGE
		if d.counter {
			m[d.name] = runtimeapi.MetricType_COUNTER
		}
	}
	return m
}()

// ListMetricDescriptors lists the metrics ListPodSandboxMetrics reports.
func (s *Server) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	resp := &runtimeapi.ListMetricDescriptorsResponse{}
	for _, d := range metricDescs {
		resp.Descriptors = append(resp.Descriptors, &runtimeapi.MetricDescriptor{Name: d.name, Help: d.help, LabelKeys: d.labels})
	}
	return resp, nil
}

// ListPodSandboxMetrics reports every VM pod's usage in cAdvisor's terms:
// the pod's own figures (container="", the node's cost: QEMU's CPU and
// resident memory; its network, per interface) and its container's (the
// guest's view of memory, its disks). A pod whose VM does not run has no
// figures.
func (s *Server) ListPodSandboxMetrics(ctx context.Context, _ *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	list, err := s.rt.ListSandboxStats(ctx, core.SandboxFilter{})
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListPodSandboxMetricsResponse{}
	for _, st := range list {
		if m := podMetrics(st); m != nil {
			resp.PodMetrics = append(resp.PodMetrics, m)
		}
	}
	return resp, nil
}

func podMetrics(st core.SandboxStats) *runtimeapi.PodSandboxMetrics {
	sb := st.Sandbox
	out := &runtimeapi.PodSandboxMetrics{PodSandboxId: sb.ID}
	for _, cs := range st.Containers {
		u := cs.Usage
		if u == nil {
			continue
		}
		ts := u.Timestamp.UnixNano()
		metric := func(name string, v uint64, labels ...string) *runtimeapi.Metric {
			return &runtimeapi.Metric{Name: name, Timestamp: ts, MetricType: metricTypes[name], LabelValues: labels, Value: u64(v)}
		}
		pod := []string{"", sb.Name, sb.Namespace, sb.ID}
		out.Metrics = append(out.Metrics, metric("container_cpu_usage_seconds_total", u.CPUNanos/1e9, pod...))
		if u.MemoryKnown {
			out.Metrics = append(out.Metrics,
				metric("container_memory_working_set_bytes", u.RSSBytes, pod...),
				metric("container_memory_usage_bytes", u.RSSBytes, pod...),
				metric("container_memory_rss", u.RSSBytes, pod...))
		}
		for _, n := range u.NICs {
			l := []string{sb.Name, sb.Namespace, sb.ID, n.Name}
			out.Metrics = append(out.Metrics,
				metric("container_network_receive_bytes_total", n.RxBytes, l...),
				metric("container_network_transmit_bytes_total", n.TxBytes, l...),
				metric("container_network_receive_packets_total", n.RxPackets, l...),
				metric("container_network_transmit_packets_total", n.TxPackets, l...),
				metric("container_network_receive_errors_total", n.RxErrors, l...),
				metric("container_network_transmit_errors_total", n.TxErrors, l...))
		}
		c := cs.Container
		l := []string{c.Name, sb.Name, sb.Namespace, c.ID}
		cm := &runtimeapi.ContainerMetrics{ContainerId: c.ID}
		cm.Metrics = append(cm.Metrics, metric("container_cpu_usage_seconds_total", u.CPUNanos/1e9, l...))
		if !c.StartedAt.IsZero() {
			cm.Metrics = append(cm.Metrics, metric("container_start_time_seconds", uint64(c.StartedAt.Unix()), l...))
		}
		if u.MemoryKnown {
			cm.Metrics = append(cm.Metrics,
				metric("container_memory_working_set_bytes", u.WorkingSetBytes, l...),
				metric("container_memory_usage_bytes", u.MemoryBytes, l...),
				metric("container_memory_rss", u.RSSBytes, l...))
		}
		for _, d := range u.Disks {
			dl := append(append([]string{}, l...), d.Name)
			cm.Metrics = append(cm.Metrics,
				metric("container_fs_reads_bytes_total", d.ReadBytes, dl...),
				metric("container_fs_writes_bytes_total", d.WriteBytes, dl...),
				metric("container_fs_reads_total", d.ReadOps, dl...),
				metric("container_fs_writes_total", d.WriteOps, dl...))
		}
		out.ContainerMetrics = append(out.ContainerMetrics, cm)
	}
	if len(out.Metrics) == 0 && len(out.ContainerMetrics) == 0 {
		return nil
	}
	return out
}
