package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// Scrape-time collectors: each reads its source when Prometheus asks, so
// nothing runs between scrapes (no goroutine per VM or plugin).

var (
	sandboxesDesc = prometheus.NewDesc(namespace+"_sandboxes",
		"VM pods (CRI pod sandboxes) by state: pending (RunPodSandbox in progress), ready, notready.", []string{"state"}, nil)
	containersDesc = prometheus.NewDesc(namespace+"_containers",
		"VMs (CRI containers) by state: creating (CreateContainer in progress), created, running, exited, unknown.", []string{"state"}, nil)
	haltedDesc = prometheus.NewDesc(namespace+"_vms_halted",
		"Running containers whose VM is halted (virtletctl stop): counted as running containers too.", nil, nil)
)

// recordsCollector counts the core's records by state.
type recordsCollector struct{ rt Runtime }

func (c *recordsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- containersDesc
	ch <- haltedDesc
}

func (c *recordsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.rt.Counts()
	for _, s := range core.SandboxStates {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts.Sandboxes[s]), string(s))
	}
	for _, s := range core.ContainerStates {
		ch <- prometheus.MustNewConstMetric(containersDesc, prometheus.GaugeValue, float64(counts.Containers[s]), string(s))
	}
	ch <- prometheus.MustNewConstMetric(haltedDesc, prometheus.GaugeValue, float64(counts.HaltedVMs))
}

var (
	pluginUpDesc = prometheus.NewDesc(namespace+"_plugin_up",
		"1 when the plugin process runs and serves, 0 while it starts or restarts.", []string{"plugin", "kind"}, nil)
	pluginRestartsDesc = prometheus.NewDesc(namespace+"_plugin_restarts_total",
		"Restarts of the plugin process since the daemon started.", []string{"plugin", "kind"}, nil)
	pluginCallsDesc = prometheus.NewDesc(namespace+"_plugin_calls_total",
		"RPCs the daemon made to the plugin since it started.", []string{"plugin", "kind"}, nil)
)

// pluginsCollector reports the plugin host's supervisors.
type pluginsCollector struct{ plugins func() []Plugin }

func (c *pluginsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pluginUpDesc
	ch <- pluginRestartsDesc
	ch <- pluginCallsDesc
}

func (c *pluginsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.plugins() {
		up := 0.0
		if p.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(pluginUpDesc, prometheus.GaugeValue, up, p.Name, p.Kind)
		ch <- prometheus.MustNewConstMetric(pluginRestartsDesc, prometheus.CounterValue, float64(p.Restarts), p.Name, p.Kind)
		ch <- prometheus.MustNewConstMetric(pluginCallsDesc, prometheus.CounterValue, float64(p.Calls), p.Name, p.Kind)
	}
}

var (
	vmLabels   = []string{"namespace", "pod", "container", "container_id"}
	vmCPUDesc  = prometheus.NewDesc(namespace+"_vm_cpu_seconds_total", "CPU time the VM used on the host.", vmLabels, nil)
	vmMemDesc  = prometheus.NewDesc(namespace+"_vm_memory_bytes", "Memory the VM uses: what the guest uses when its balloon driver reports it, else the host memory the VM holds.", vmLabels, nil)
	vmWSDesc   = prometheus.NewDesc(namespace+"_vm_memory_working_set_bytes", "The VM's memory in use less what the guest can drop (caches), as kubelet counts it.", vmLabels, nil)
	vmStatsOK  = prometheus.NewDesc(namespace+"_vm_stats_success", "1 when the hypervisor answered this scrape's query of the VMs' usage, else 0 (the vm_ metrics are then missing).", nil, nil)
	vmStatsAll = []*prometheus.Desc{vmCPUDesc, vmMemDesc, vmWSDesc, vmStatsOK}
)

// statsCollector asks the core for the running VMs' usage (one query of
// the hypervisor per scrape, bounded). VMs the hypervisor does not report
// are left out; a figure it does not know is left out, never zero.
type statsCollector struct {
	rt      Runtime
	timeout time.Duration
	log     logrus.FieldLogger

	mu      sync.Mutex
	failing bool // the last query failed: log changes, not every scrape
}

func newStatsCollector(rt Runtime, timeout time.Duration, log logrus.FieldLogger) *statsCollector {
	return &statsCollector{rt: rt, timeout: timeout, log: log}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range vmStatsAll {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	stats, err := c.rt.ListContainerStats(ctx, core.ContainerFilter{})
	c.note(err)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(vmStatsOK, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(vmStatsOK, prometheus.GaugeValue, 1)
	for _, s := range stats {
		if s.Usage == nil {
			continue
		}
		ct := s.Container
		labels := []string{ct.Spec.PodNamespace, ct.Spec.PodName, ct.Name, ct.ID}
		ch <- prometheus.MustNewConstMetric(vmCPUDesc, prometheus.CounterValue, float64(s.Usage.CPUNanos)/1e9, labels...)
		if s.Usage.MemoryKnown {
			ch <- prometheus.MustNewConstMetric(vmMemDesc, prometheus.GaugeValue, float64(s.Usage.MemoryBytes), labels...)
			ch <- prometheus.MustNewConstMetric(vmWSDesc, prometheus.GaugeValue, float64(s.Usage.WorkingSetBytes), labels...)
		}
	}
}

// note logs when the stats query starts or stops failing.
func (c *statsCollector) note(err error) {
	c.mu.Lock()
	was := c.failing
	c.failing = err != nil
	c.mu.Unlock()
	switch {
	case err != nil && !was && errors.Is(err, ports.ErrUnimplemented):
		c.log.WithError(err).Info("metrics: the hypervisor reports no VM stats; the vm_ metrics stay empty")
	case err != nil && !was:
		c.log.WithError(err).Warn("metrics: VM stats failed; the vm_ metrics are missing until they answer again")
	case err == nil && was:
		c.log.Info("metrics: VM stats answer again")
	}
}
