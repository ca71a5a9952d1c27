package cri

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// promMetrics turns CRI metrics into Prometheus's as kubelet's CRI
// collector does: a metric whose labels do not fit its descriptor is an
// error there, and lost.
func promMetrics(t *testing.T, descs []*runtimeapi.MetricDescriptor, pods []*runtimeapi.PodSandboxMetrics) map[string]float64 {
	t.Helper()
	byName := map[string]*prometheus.Desc{}
	for _, d := range descs {
		byName[d.Name] = prometheus.NewDesc(d.Name, d.Help, d.LabelKeys, nil)
	}
	keys := map[string][]string{}
	for _, d := range descs {
		keys[d.Name] = d.LabelKeys
	}
	out := map[string]float64{}
	add := func(m *runtimeapi.Metric) {
		desc, ok := byName[m.Name]
		if !ok {
			t.Errorf("%s: no descriptor", m.Name)
			return
		}
		typ := prometheus.GaugeValue
		if m.MetricType == runtimeapi.MetricType_COUNTER {
			typ = prometheus.CounterValue
		}
		if _, err := prometheus.NewConstMetric(desc, typ, float64(m.Value.GetValue()), m.LabelValues...); err != nil {
			t.Errorf("%s%v: %v", m.Name, m.LabelValues, err)
			return
		}
		var l []string
		for i, k := range keys[m.Name] {
			l = append(l, k+"="+m.LabelValues[i])
		}
		out[m.Name+"{"+strings.Join(l, ",")+"}"] = float64(m.Value.GetValue())
	}
	for _, p := range pods {
		for _, m := range p.Metrics {
			add(m)
		}
		for _, c := range p.ContainerMetrics {
			for _, m := range c.Metrics {
				add(m)
			}
		}
	}
	return out
}

// A running VM pod's usage in cAdvisor's names and labels: the pod's own
// (container="") is the node's cost, its container's the guest's view;
// every metric fits its descriptor. A pod whose VM does not run has none.
func TestPodSandboxMetrics(t *testing.T) {
	sb := &core.Sandbox{ID: "sb1", Name: "vm", Namespace: "ns"}
	usage := &core.Usage{Timestamp: time.Unix(100, 0), CPUNanos: 7_900_000_000, MemoryKnown: true, MemoryBytes: 120 << 20,
		WorkingSetBytes: 100 << 20, RSSBytes: 300 << 20,
		Disks: []ports.DiskStats{{Name: "root", ReadBytes: 4096, WriteBytes: 512, ReadOps: 2, WriteOps: 1}},
		NICs:  []ports.NICStats{{Name: "eth0", RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20}}}
	running := core.SandboxStats{Sandbox: sb, Containers: []core.ContainerStats{{
		Container: &core.Container{ID: "c1", SandboxID: "sb1", Name: "vm", StartedAt: time.Unix(50, 0)}, Usage: usage}}}
	stopped := core.SandboxStats{Sandbox: &core.Sandbox{ID: "sb2", Name: "off", Namespace: "ns"},
		Containers: []core.ContainerStats{{Container: &core.Container{ID: "c2", SandboxID: "sb2", Name: "off"}}}}
	if m := podMetrics(stopped); m != nil {
		t.Errorf("a stopped VM's pod has metrics: %v", m)
	}
	descs, _ := (&Server{}).ListMetricDescriptors(context.Background(), nil)
	got := promMetrics(t, descs.Descriptors, []*runtimeapi.PodSandboxMetrics{podMetrics(running)})
	for k, want := range map[string]float64{
		`container_cpu_usage_seconds_total{container=,pod=vm,namespace=ns,id=sb1}`:            7,
		`container_memory_working_set_bytes{container=,pod=vm,namespace=ns,id=sb1}`:           300 << 20,
		`container_cpu_usage_seconds_total{container=vm,pod=vm,namespace=ns,id=c1}`:           7,
		`container_memory_working_set_bytes{container=vm,pod=vm,namespace=ns,id=c1}`:          100 << 20,
		`container_memory_rss{container=vm,pod=vm,namespace=ns,id=c1}`:                        300 << 20,
		`container_start_time_seconds{container=vm,pod=vm,namespace=ns,id=c1}`:                50,
		`container_fs_reads_bytes_total{container=vm,pod=vm,namespace=ns,id=c1,device=root}`:  4096,
		`container_network_receive_bytes_total{pod=vm,namespace=ns,id=sb1,interface=eth0}`:    1000,
		`container_network_transmit_packets_total{pod=vm,namespace=ns,id=sb1,interface=eth0}`: 20,
	} {
		if v, ok := got[k]; !ok || v != want {
			var all []string
			for k := range got {
				all = append(all, k)
			}
			sort.Strings(all)
			t.Errorf("%s = %v (%v), want %v; have:\n%s", k, v, ok, want, strings.Join(all, "\n"))
		}
	}

	// containerd 2.2's metrics on a mixed node fit Virtlet's descriptors:
	// its container metrics carry (container, pod, namespace, id), its pod
	// network metrics (pod, namespace, id, interface).
	containerd := &runtimeapi.PodSandboxMetrics{PodSandboxId: "ctr-sb",
		Metrics: []*runtimeapi.Metric{{Name: "container_network_receive_bytes_total", MetricType: runtimeapi.MetricType_COUNTER,
			LabelValues: []string{"web", "ns", "ctr-sb", "eth0"}, Value: u64(5)}},
		ContainerMetrics: []*runtimeapi.ContainerMetrics{{ContainerId: "ctr", Metrics: []*runtimeapi.Metric{
			{Name: "container_cpu_usage_seconds_total", MetricType: runtimeapi.MetricType_COUNTER,
				LabelValues: []string{"nginx", "web", "ns", "ctr-sb"}, Value: u64(3)}}}}}
	got = promMetrics(t, descs.Descriptors, []*runtimeapi.PodSandboxMetrics{containerd})
	if fmt.Sprint(len(got)) != "2" {
		t.Errorf("containerd's metrics: %v", got)
	}
}
