// Package metrics is the daemon's Prometheus endpoint. It implements the
// core's observer port (VM phases, image pulls) and the CRI and streaming
// servers' observers (calls, sessions) with client_golang, and reads the
// rest at scrape time: the records' states and the VMs' usage from the
// core, the plugins' states from the plugin host. The core never sees
// Prometheus; this package is the only one that does.
package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// Runtime is what the scrape-time collectors read from the core.
type Runtime interface {
	// Counts counts the records by state (memory only).
	Counts() core.Counts
	// ListContainerStats asks the hypervisor for the running VMs' usage.
	ListContainerStats(ctx context.Context, f core.ContainerFilter) ([]core.ContainerStats, error)
}

// Plugin is a supervised plugin as the metrics show it.
type Plugin struct {
	Name, Kind string
	Up         bool   // running and serving
	Restarts   int    // since the daemon started
	Calls      uint64 // RPCs the daemon made to it since it started
}

// Options tune the metrics.
type Options struct {
	// StatsTimeout bounds a scrape's query of the VMs' usage (default 5s).
	StatsTimeout time.Duration
	Log          logrus.FieldLogger
}

// Metrics holds the daemon's metrics.
type Metrics struct {
	reg  *prometheus.Registry
	opts Options

	criCalls       *prometheus.HistogramVec
	sessions       *prometheus.HistogramVec
	activeSessions *prometheus.GaugeVec
	phases         *prometheus.HistogramVec
	pullSeconds    *prometheus.HistogramVec
	pullBytes      *prometheus.CounterVec
	pullFailures   *prometheus.CounterVec
	// Live migrations away from this node: how long each took and how
	// long its guest was paused (KubeVirt exports no downtime).
	migrationSeconds  prometheus.Histogram
	migrationDowntime prometheus.Histogram
}

const namespace = "virtlet"

// New makes the metrics and registers them, with Go's and the process's,
// in a registry of their own. WithRuntime and WithPlugins add what is read
// at scrape time.
func New(opts Options) *Metrics {
	if opts.StatsTimeout <= 0 {
		opts.StatsTimeout = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	m := &Metrics{
		reg:  prometheus.NewRegistry(),
		opts: opts,
		// From a cached list (well under a millisecond) to a VM created
		// under TCG or a large pull (minutes).
		criCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "cri", Name: "request_duration_seconds",
			Help:    "CRI calls by method, by the gRPC code the caller got, and by the runtime that served them (virtlet, or forwarded on a mixed node).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"method", "code", "runtime"}),
		sessions: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "cri", Name: "stream_session_duration_seconds",
			Help:    "Streaming sessions (exec, virtletctl, attach, port_forward) that ended, by kind and result (ok or error).",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms to 43 min
		}, []string{"kind", "result"}),
		activeSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "cri", Name: "stream_sessions_active",
			Help: "Streaming sessions in progress, by kind.",
		}, []string{"kind"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "vm", Name: "phase_duration_seconds",
			Help:    "Steps of a VM pod's creation and start that succeeded, by phase (network, volumes, cloud_init, define or claim, write_files, start or resume).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"phase"}),
		pullSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "image", Name: "pull_duration_seconds",
			Help:    "Image pulls that succeeded (download and storing), by location scheme (https, docker, ...).",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}, []string{"scheme"}),
		pullBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "image", Name: "pull_bytes_total",
			Help: "Bytes of the images pulled, by location scheme.",
		}, []string{"scheme"}),
		migrationSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "migration", Name: "duration_seconds",
			Help:    "Live migrations of VMs away from this node that succeeded: from the offer's acceptance to the guest running on the receiving node.",
			Buckets: []float64{.5, 1, 2, 5, 10, 30, 60, 120, 300, 600},
		}),
		migrationDowntime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "migration", Name: "downtime_seconds",
			Help:    "How long the guest of each live migration away from this node was paused (libvirt's figure).",
			Buckets: []float64{.01, .025, .05, .1, .2, .3, .5, 1, 2, 5},
		}),
		pullFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "image", Name: "pull_failures_total",
			Help: "Image pulls that failed, by reason: " + reasons() + ".",
		}, []string{"reason"}),
	}
	for _, p := range ports.VMPhases {
		m.phases.WithLabelValues(string(p))
	}
	for _, f := range ports.PullFailures {
		m.pullFailures.WithLabelValues(string(f))
	}
	m.reg.MustRegister(m.criCalls, m.sessions, m.activeSessions, m.phases, m.pullSeconds, m.pullBytes, m.pullFailures,
		m.migrationSeconds, m.migrationDowntime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// WithRuntime adds the records by state and the VMs' usage, read from rt
// at each scrape. (The runtime reports to the metrics as its observer, so
// it is made after them.)
func (m *Metrics) WithRuntime(rt Runtime) *Metrics {
	m.reg.MustRegister(&recordsCollector{rt: rt}, newStatsCollector(rt, m.opts.StatsTimeout, m.opts.Log))
	return m
}

// WithPlugins adds the plugins' states, read from plugins at each scrape.
func (m *Metrics) WithPlugins(plugins func() []Plugin) *Metrics {
	m.reg.MustRegister(&pluginsCollector{plugins: plugins})
	return m
}

func reasons() string {
	s := ""
	for i, f := range ports.PullFailures {
		if i > 0 {
			s += ", "
		}
		s += string(f)
	}
	return s
}

// Registry is where the metrics are registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// CRICall implements cri.CallObserver.
func (m *Metrics) CRICall(method string, code codes.Code, forwarded bool, took time.Duration) {
	runtime := "virtlet"
	if forwarded {
		runtime = "forwarded"
	}
	m.criCalls.WithLabelValues(method, code.String(), runtime).Observe(took.Seconds())
}

// Session implements streaming.SessionObserver.
func (m *Metrics) Session(kind string) func(err error) {
	active := m.activeSessions.WithLabelValues(kind)
	active.Inc()
	start := time.Now()
	return func(err error) {
		active.Dec()
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.sessions.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
	}
}

// VMPhase implements ports.Observer.
func (m *Metrics) VMPhase(p ports.VMPhase, took time.Duration) {
	m.phases.WithLabelValues(string(p)).Observe(took.Seconds())
}

// ImagePull implements ports.Observer.
func (m *Metrics) ImagePull(p ports.ImagePull) {
	if p.Failure != "" {
		m.pullFailures.WithLabelValues(string(p.Failure)).Inc()
		return
	}
	m.pullSeconds.WithLabelValues(p.Scheme).Observe(p.Took.Seconds())
	m.pullBytes.WithLabelValues(p.Scheme).Add(float64(p.Bytes))
}

// Migration counts a live migration that moved a VM away from this node.
func (m *Metrics) Migration(st ports.MigrationStats) {
	m.migrationSeconds.Observe(st.Total.Seconds())
	m.migrationDowntime.Observe(st.Downtime.Seconds())
}

var (
	_ ports.Observer          = (*Metrics)(nil)
	_ ports.MigrationObserver = (*Metrics)(nil)
)
