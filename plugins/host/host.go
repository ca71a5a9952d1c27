// Package host runs the daemon's plugins: one supervised go-plugin process
// per manifest, each exposed to the core as the port it serves.
package host

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/hypervisor"
	"github.com/virtlet/virtlet/plugins/image"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/plugins/network"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
)

// Options tune the host.
type Options struct {
	// StateDir holds one private directory per plugin.
	StateDir string
	Log      logrus.FieldLogger
	// InitialBackoff and MaxBackoff bound the delay before restarting a
	// plugin that exited; it doubles after each quick failure.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// StartTimeout bounds a plugin's start-up handshake.
	StartTimeout time.Duration
	// SocketDir holds a private directory per plugin process for its
	// socket (default: .sockets in StateDir, see socketsDir). Unix socket
	// paths are short: keep it so.
	SocketDir string
}

// socketsDir prepares the directory under the plugins' state directory
// that holds a directory per plugin process for its socket, and removes
// what a previous daemon left there: a daemon killed by SIGKILL cannot
// remove its plugins' sockets (the plugins die with it), and one daemon
// owns a state directory. A state directory too deep for a socket path
// (108 bytes on Linux, 104 elsewhere: the smaller is kept) gives "":
// $TMPDIR then, as before.
func socketsDir(stateDir string) (string, error) {
	dir := filepath.Join(stateDir, ".sockets")
	// <dir>/<process dir>/<go-plugin's socket>: "/" + 10 digits + "/plugin" + 10 digits.
	if len(dir)+len("/1234567890/plugin1234567890") >= 104 {
		return "", nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("remove the previous daemon's plugin sockets: %w", err)
	}
	// The plugins' parent directory stays traversable (see launch): QEMU
	// opens files below the hypervisor plugin's.
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return "", fmt.Errorf("create plugin state directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("create the plugin socket directory: %w", err)
	}
	return dir, nil
}

// Host owns the plugin processes.
type Host struct {
	sups []*Supervisor
	log  logrus.FieldLogger
}

// Start launches every plugin of ms and checks that together they make a
// consistent set. Any failure stops the plugins already started and is
// returned naming the manifest file.
func Start(ctx context.Context, ms []manifest.Manifest, opts Options) (*Host, error) {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = time.Minute
	}
	if opts.SocketDir == "" && opts.StateDir != "" {
		dir, err := socketsDir(opts.StateDir)
		if err != nil {
			return nil, err
		}
		opts.SocketDir = dir
	}
	h := &Host{log: opts.Log}
	for _, m := range ms {
		s := newSupervisor(m, opts)
		if err := s.launch(ctx); err != nil {
			h.Shutdown()
			return nil, fmt.Errorf("plugin %s (%s): %w", m.Name, m.File, err)
		}
		h.sups = append(h.sups, s)
	}
	if err := h.checkHandles(); err != nil {
		h.Shutdown()
		return nil, err
	}
	for _, s := range h.sups {
		s.startWatching()
	}
	return h, nil
}

// checkHandles refuses two plugins of one kind handling the same thing, as
// reported by the plugins themselves (manifests may omit handles).
func (h *Host) checkHandles() error {
	seen := map[string]*Supervisor{}
	for _, s := range h.sups {
		for i, handle := range s.Handles() {
			key := string(s.m.Kind) + "/" + handle
			if prev, ok := seen[key]; ok {
				return &manifest.Error{File: s.m.File, Field: fmt.Sprintf("handles[%d]", i),
					Reason: fmt.Sprintf("%s %q is already handled by plugin %s (%s)", s.m.Kind, handle, prev.m.Name, prev.m.File)}
			}
			seen[key] = s
		}
	}
	return nil
}

func (h *Host) ofKind(k ports.PluginKind) []*Supervisor {
	var out []*Supervisor
	for _, s := range h.sups {
		if s.m.Kind == k {
			out = append(out, s)
		}
	}
	return out
}

// Hypervisor returns the hypervisor plugin's port, nil if there is none.
func (h *Host) Hypervisor() ports.Hypervisor {
	if s := h.ofKind(ports.KindHypervisor); len(s) > 0 {
		return hypervisor.NewClient(s[0])
	}
	return nil
}

// Network returns the network plugin's port, nil if there is none.
func (h *Host) Network() ports.Network {
	if s := h.ofKind(ports.KindNetwork); len(s) > 0 {
		return network.NewClient(s[0])
	}
	return nil
}

// ImageSources maps URL schemes / transports to image plugins.
func (h *Host) ImageSources() map[string]ports.ImageSource {
	out := map[string]ports.ImageSource{}
	for _, s := range h.ofKind(ports.KindImage) {
		c := image.NewClient(s)
		for _, handle := range s.Handles() {
			out[handle] = c
		}
	}
	return out
}

// Volumes maps volume types to volume plugins.
func (h *Host) Volumes() map[string]ports.Volumes {
	out := map[string]ports.Volumes{}
	for _, s := range h.ofKind(ports.KindVolume) {
		c := volume.NewClient(s)
		for _, handle := range s.Handles() {
			out[handle] = c
		}
	}
	return out
}

// Datasources maps datasource names to datasource plugins.
func (h *Host) Datasources() map[string]ports.Datasource {
	out := map[string]ports.Datasource{}
	for _, s := range h.ofKind(ports.KindDatasource) {
		c := datasource.NewClient(s)
		for _, handle := range s.Handles() {
			out[handle] = c
		}
	}
	return out
}

// Status reports every plugin, by name.
func (h *Host) Status() []PluginStatus {
	out := make([]PluginStatus, 0, len(h.sups))
	for _, s := range h.sups {
		out = append(out, s.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Supervisor returns the supervisor of the named plugin.
func (h *Host) Supervisor(name string) *Supervisor {
	for _, s := range h.sups {
		if s.m.Name == name {
			return s
		}
	}
	return nil
}

// Shutdown stops every plugin process and waits for them.
func (h *Host) Shutdown() {
	var wg sync.WaitGroup
	for _, s := range h.sups {
		wg.Add(1)
		go func(s *Supervisor) {
			defer wg.Done()
			s.Stop()
		}(s)
	}
	wg.Wait()
}

// hclogFor bridges go-plugin's logger (and the plugins' log lines it
// relays) into logrus, keeping levels and fields.
func hclogFor(log logrus.FieldLogger, plugin string, ring *logRing) hclog.Logger {
	l := hclog.NewInterceptLogger(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Trace})
	l.RegisterSink(logSink{log: log, plugin: plugin, ring: ring})
	return l
}

// outputLines logs what a plugin's Go code prints on os.Stdout or
// os.Stderr without the SDK's logger (go-plugin carries both over gRPC and
// would discard them): a warning per line, named after the stream.
type outputLines struct {
	sink   logSink
	stream string
	mu     sync.Mutex
	buf    []byte
}

func (w *outputLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < 16<<10 {
			return len(p), nil
		}
		if i < 0 {
			i = len(w.buf) // an endless line is cut
		}
		line := strings.TrimRight(string(w.buf[:i]), "\r")
		w.buf = w.buf[min(i+1, len(w.buf)):]
		if strings.TrimSpace(line) != "" {
			w.sink.Accept(w.stream, hclog.Warn, line)
		}
	}
}

type logSink struct {
	log    logrus.FieldLogger
	plugin string
	ring   *logRing // keeps recent lines for diagnostics
}

func (s logSink) Accept(name string, level hclog.Level, msg string, args ...interface{}) {
	fields := logrus.Fields{}
	if name != "" {
		fields["source"] = name
	}
	for i := 0; i+1 < len(args); i += 2 {
		key := fmt.Sprint(args[i])
		if key == "timestamp" {
			continue
		}
		fields[key] = args[i+1]
	}
	// A line the plugin wrote to stderr without the SDK's logger (a C
	// library, a crash) comes as a bare debug message from go-plugin's
	// logger named after the binary; it is worth a warning (go-plugin
	// itself raises a Go panic's lines to error).
	if level == hclog.Debug && len(args) == 0 && name != "" && !strings.HasPrefix(msg, "[DEBUG]") {
		level = hclog.Warn
		fields["stderr"] = true
	}
	if s.ring != nil {
		s.ring.add(LogEntry{Time: time.Now(), Plugin: s.plugin, Level: level.String(), Message: msg, Fields: stringFields(fields)})
	}
	e := s.log.WithFields(fields)
	switch level {
	case hclog.Trace:
		e.Trace(msg)
	case hclog.Debug:
		e.Debug(msg)
	case hclog.Info:
		e.Info(msg)
	case hclog.Warn:
		e.Warn(msg)
	default:
		e.Error(msg)
	}
}
