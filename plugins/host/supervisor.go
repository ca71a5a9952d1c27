package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

// State is a plugin's lifecycle state.
type State string

const (
	Starting   State = "starting"
	Running    State = "running"
	Restarting State = "restarting"
	Stopped    State = "stopped"
)

// PluginStatus describes a supervised plugin.
type PluginStatus struct {
	Name      string           `json:"name"`
	Kind      ports.PluginKind `json:"kind"`
	Manifest  string           `json:"manifest"`
	State     State            `json:"state"`
	PID       int              `json:"pid,omitempty"`
	Version   string           `json:"version,omitempty"`
	Handles   []string         `json:"handles,omitempty"`
	Restarts  int              `json:"restarts"`
	LastError string           `json:"lastError,omitempty"`
	// Calls counts the RPCs the daemon made to the plugin since it
	// started (all its processes): what a VM start costs in plugin calls.
	Calls uint64 `json:"calls"`
}

// Supervisor runs one plugin process: it launches it (checksum verified,
// mutual TLS), checks what it says it is, configures it, and restarts it
// with backoff when it dies. It is the base.Conn of the plugin's client:
// while the plugin is down, calls fail at once with an error naming it.
type Supervisor struct {
	m    manifest.Manifest
	opts Options
	log  logrus.FieldLogger

	mu          sync.Mutex
	proc        *process
	conn        *grpc.ClientConn
	info        ports.PluginInfo
	handles     []string
	state       State
	pid         int
	restarts    int
	lastErr     string
	startedAt   time.Time
	nextAttempt time.Time

	logs logRing // recent log lines

	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	watching bool

	calls atomic.Uint64 // RPCs made to the plugin
}

// incompatibleRE reads go-plugin's refusal of a plugin that speaks no
// protocol version the daemon does.
var incompatibleRE = regexp.MustCompile(`incompatible API version with plugin\. Plugin version: (\d+), Client versions: (\[[\d ]*\])`)

func newSupervisor(m manifest.Manifest, opts Options) *Supervisor {
	return &Supervisor{
		m: m, opts: opts, state: Starting,
		log:  opts.Log.WithFields(logrus.Fields{"plugin": m.Name, "kind": m.Kind}),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// launch starts the plugin process and makes it ready to serve.
func (s *Supervisor) launch(ctx context.Context) error {
	// The plugins' parent directory is traversable (a hypervisor plugin
	// may open its own directory to QEMU); each plugin's is private.
	if err := os.MkdirAll(s.opts.StateDir, 0o711); err != nil {
		return fmt.Errorf("create plugin state directory: %w", err)
	}
	stateDir := filepath.Join(s.opts.StateDir, s.m.Name)
	if err := os.Mkdir(stateDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create plugin state directory: %w", err)
	}
	// A private TMPDIR, emptied before every launch: temporary files (the
	// ISO plugins stage cloud-init data there, secrets included) stay out
	// of the shared /tmp and do not outlive the process that made them.
	tmpDir := filepath.Join(stateDir, "tmp")
	if err := os.RemoveAll(tmpDir); err != nil {
		return fmt.Errorf("empty plugin temporary directory: %w", err)
	}
	if err := os.Mkdir(tmpDir, 0o700); err != nil {
		return fmt.Errorf("create plugin temporary directory: %w", err)
	}
	sum, err := hex.DecodeString(s.m.SHA256)
	if err != nil {
		return fmt.Errorf("sha256: %w", err)
	}
	cmd := exec.Command(s.m.Command, s.m.Args...)
	// The plugin dies with the daemon, even on SIGKILL: no orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// It gets its configuration from its manifest, not from the daemon's
	// environment (which may hold credentials, a kubeconfig path, proxy
	// settings): only what finding and running tools needs.
	cmd.Env = pluginEnv(tmpDir)
	// Its socket goes into a directory of this process's own, removed when
	// the process is done: a plugin that dies by SIGKILL cannot remove its
	// socket itself.
	pattern := "virtlet-plugin-" + s.m.Name + "-" // in $TMPDIR, shared
	if s.opts.SocketDir != "" {
		pattern = "" // in the daemon's own directory, where paths must stay short
	}
	sockDir, err := os.MkdirTemp(s.opts.SocketDir, pattern)
	if err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	cmd.Env = append(cmd.Env, plugin.EnvUnixSocketDir+"="+sockDir)
	// Not Managed: the supervisor kills every client it made (a dead
	// plugin's too), and go-plugin's list of managed clients only grows.
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  base.Handshake,
		VersionedPlugins: base.PluginSet(s.m.Kind, nil),
		Cmd:              cmd,
		SkipHostEnv:      true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		SecureConfig:     &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()},
		Logger:           hclogFor(s.log, s.m.Name, &s.logs),
		SyncStdout:       &outputLines{sink: logSink{log: s.log, plugin: s.m.Name, ring: &s.logs}, stream: "stdout"},
		SyncStderr:       &outputLines{sink: logSink{log: s.log, plugin: s.m.Name, ring: &s.logs}, stream: "stderr"},
		StartTimeout:     s.opts.StartTimeout,
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				s.calls.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				s.calls.Add(1)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	rpc, proc, err := startPinned(client, sockDir)
	fail := func(err error) error {
		proc.release()
		return err
	}
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return fail(fmt.Errorf("binary %s no longer matches the manifest's sha256", s.m.Command))
		}
		if m := incompatibleRE.FindStringSubmatch(err.Error()); m != nil {
			return fail(fmt.Errorf("%s speaks version %s of the %s plugin API, this daemon version %s: rebuild the plugin against this daemon's plugin SDK (plugins/sdk), "+
				"or run it with a daemon of its API version", s.m.Command, m[1], s.m.Kind, strings.Trim(m[2], "[]")))
		}
		return fail(fmt.Errorf("start %s: %w", s.m.Command, err))
	}
	raw, err := rpc.Dispense(string(s.m.Kind))
	if err != nil {
		return fail(fmt.Errorf("%s does not serve a %s plugin: %w", s.m.Command, s.m.Kind, err))
	}
	conn := raw.(*grpc.ClientConn)
	sc := base.StaticConn{Conn: conn, Plugin: s.m.Name, Kind: s.m.Kind}
	info, err := base.Info(ctx, sc)
	if err != nil {
		return fail(fmt.Errorf("ask for plugin info: %w", err))
	}
	if want := base.APIVersions[s.m.Kind]; info.APIVersion != want {
		return fail(fmt.Errorf("%s reports version %d of the %s plugin API, this daemon speaks %d", s.m.Command, info.APIVersion, s.m.Kind, want))
	}
	if info.Kind != s.m.Kind {
		return fail(fmt.Errorf("%s does not serve a %s plugin: the manifest says kind %s, the plugin says kind %s", s.m.Command, s.m.Kind, s.m.Kind, info.Kind))
	}
	handles, err := s.effectiveHandles(info)
	if err != nil {
		return fail(err)
	}
	if err := s.m.CheckConfig(info.ConfigSchema); err != nil {
		return fail(err)
	}
	if err := base.Configure(ctx, sc, ports.PluginConfig{Config: s.m.Config, StateDir: stateDir}); err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	s.mu.Lock()
	s.proc, s.conn, s.info, s.handles, s.pid = proc, conn, info, handles, pid
	if s.state == Restarting {
		// Counted with the state change, so no one sees the new
		// process running and the restart not yet counted.
		s.restarts++
	}
	s.state, s.startedAt = Running, time.Now()
	s.mu.Unlock()
	s.log.WithFields(logrus.Fields{"pid": pid, "version": info.Version, "handles": handles}).Info("plugin running")
	return nil
}

// effectiveHandles checks the manifest's handles against the plugin's and
// returns what the plugin is used for. They may not change across restarts.
func (s *Supervisor) effectiveHandles(info ports.PluginInfo) ([]string, error) {
	handles := info.Handles
	if len(s.m.Handles) > 0 {
		for i, h := range s.m.Handles {
			if !slices.Contains(info.Handles, h) {
				return nil, &manifest.Error{File: s.m.File, Field: fmt.Sprintf("handles[%d]", i),
					Reason: fmt.Sprintf("plugin %s does not handle %q (it handles %v)", info.Name, h, info.Handles)}
			}
		}
		handles = s.m.Handles
	}
	switch s.m.Kind {
	case ports.KindImage, ports.KindVolume, ports.KindDatasource:
		if len(handles) == 0 {
			return nil, fmt.Errorf("plugin %s handles nothing: a %s plugin must report what it handles", info.Name, s.m.Kind)
		}
	}
	s.mu.Lock()
	prev := s.handles
	s.mu.Unlock()
	if prev != nil && !slices.Equal(prev, handles) {
		return nil, fmt.Errorf("plugin now handles %v instead of %v; restart the daemon to change what a plugin handles", handles, prev)
	}
	return handles, nil
}

// startWatching begins supervision.
func (s *Supervisor) startWatching() {
	s.mu.Lock()
	s.watching = true
	s.mu.Unlock()
	go s.watch()
}

// watch restarts the plugin when its process exits, until Stop.
func (s *Supervisor) watch() {
	defer close(s.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	backoff := s.opts.InitialBackoff
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.kick:
		}
		s.mu.Lock()
		proc, running, ranFor := s.proc, s.state == Running, time.Since(s.startedAt)
		s.mu.Unlock()
		if !running || !proc.client.Exited() {
			continue
		}
		if ranFor > time.Minute {
			backoff = s.opts.InitialBackoff
		}
		s.mu.Lock()
		s.state, s.proc, s.conn, s.lastErr = Restarting, nil, nil, "the plugin process exited"
		s.mu.Unlock()
		s.log.WithField("ranFor", ranFor.Round(time.Millisecond)).Error("plugin process exited; restarting it")
		proc.release()
		for {
			s.mu.Lock()
			s.nextAttempt = time.Now().Add(backoff)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout+base.QuickCallTimeout)
			err := s.launch(ctx)
			cancel()
			backoff = min(backoff*2, s.opts.MaxBackoff)
			if err == nil {
				break
			}
			s.mu.Lock()
			s.lastErr = err.Error()
			s.mu.Unlock()
			s.log.WithError(err).WithField("retryIn", backoff).Error("restart plugin")
		}
	}
}

// GRPC implements base.Conn.
func (s *Supervisor) GRPC() (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case Running:
		return s.conn, nil
	case Restarting:
		wait := time.Until(s.nextAttempt).Round(time.Millisecond)
		reason := fmt.Sprintf("restarting after it exited (restart %d; next attempt in %s; last error: %s)", s.restarts+1, max(wait, 0), s.lastErr)
		return nil, &ports.UnavailableError{Plugin: s.m.Name, Kind: s.m.Kind, Reason: reason}
	case Stopped:
		return nil, &ports.UnavailableError{Plugin: s.m.Name, Kind: s.m.Kind, Reason: "stopped: the daemon is shutting down"}
	default:
		return nil, &ports.UnavailableError{Plugin: s.m.Name, Kind: s.m.Kind, Reason: "starting"}
	}
}

// Error implements base.Conn: a transport failure wakes the watcher and is
// reported as the plugin being unavailable.
func (s *Supervisor) Error(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok && (st.Code() == codes.Unavailable || st.Code() == codes.Canceled) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
		s.mu.Lock()
		exited := s.state == Restarting || s.proc != nil && s.proc.client.Exited()
		s.mu.Unlock()
		if exited {
			return &ports.UnavailableError{Plugin: s.m.Name, Kind: s.m.Kind, Reason: "its process exited during the call; it is being restarted"}
		}
	}
	return base.FromRPC(err, s.m.Name, s.m.Kind)
}

// Stop ends supervision and the plugin process.
func (s *Supervisor) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.mu.Lock()
	watching := s.watching
	s.mu.Unlock()
	if watching {
		<-s.done // a launch in progress is bounded by its start timeout
	}
	s.mu.Lock()
	proc := s.proc
	s.state, s.proc, s.conn = Stopped, nil, nil
	s.mu.Unlock()
	if proc != nil {
		proc.release()
	}
}

// Status reports the plugin's state.
func (s *Supervisor) Status() PluginStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := PluginStatus{Name: s.m.Name, Kind: s.m.Kind, Manifest: s.m.File, State: s.state, Version: s.info.Version,
		Handles: s.handles, Restarts: s.restarts, LastError: s.lastErr, Calls: s.calls.Load()}
	if s.state == Running {
		st.PID = s.pid
	}
	return st
}

// Handles returns what the plugin is used for.
func (s *Supervisor) Handles() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handles
}

// pluginEnv is a plugin process's environment: the daemon's PATH (plugins
// run qemu-img, mkfs and the like) or a standard one, its private TMPDIR,
// and nothing else (go-plugin adds its own variables).
func pluginEnv(tmpDir string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return []string{"PATH=" + path, "TMPDIR=" + tmpDir}
}
