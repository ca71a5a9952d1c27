// Package streaming is the CRI streaming server: kubelet (or crictl) gets
// a single-use URL from Exec, Attach or PortForward and connects to it;
// kubelet's own streaming library (SPDY and WebSocket, tokens that expire
// after a minute and are consumed by their first use) serves it, and this
// package connects the streams to the core. Exec commands that are
// Virtlet's own (virtletctl's) are served here too (tools.go).
package streaming

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletstreaming "k8s.io/kubelet/pkg/cri/streaming"
	utilexec "k8s.io/utils/exec"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core"
)

// DefaultAddress is where the server listens unless told otherwise: a
// free port on loopback, as containerd does. kubelet, on the same node,
// proxies the streams.
const DefaultAddress = "127.0.0.1:0"

// Server serves the streams of Exec, Attach and PortForward.
type Server struct {
	lib      kubeletstreaming.Server
	sessions *runtime
	listener net.Listener
	conns    *conns
	http     *http.Server
	log      logrus.FieldLogger
}

// Listen opens the streaming server's port. The server speaks plain HTTP
// (its single-use tokens are the only credential), so it listens on
// loopback only.
func Listen(address string, rt *core.Runtime, tools *Tools, log logrus.FieldLogger) (*Server, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("streaming address %q: %w (want host:port, e.g. %s)", address, err, DefaultAddress)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("streaming address %q: the streaming server serves plain HTTP and must listen on a loopback address (127.0.0.1, ::1 or localhost); kubelet on the same node proxies it", address)
	}
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("streaming server: listen on %s: %w", address, err)
	}
	cfg := kubeletstreaming.DefaultConfig
	cfg.Addr = l.Addr().String()
	cfg.BaseURL = &url.URL{Scheme: "http", Host: l.Addr().String()}
	sessions := &runtime{rt: rt, tools: tools, log: log, maxExec: cfg.StreamIdleTimeout}
	lib, err := kubeletstreaming.NewServer(cfg, sessions)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("streaming server: %w", err)
	}
	set := &conns{open: map[*clientConn]struct{}{}}
	return &Server{lib: lib, sessions: sessions, listener: &trackingListener{Listener: l, set: set}, conns: set, log: log,
		http: &http.Server{Handler: lib, ReadHeaderTimeout: 30 * time.Second, ConnContext: withConn}}, nil
}

// Session kinds, as a SessionObserver hears them.
const (
	SessionExec        = "exec"         // a command in the guest
	SessionTool        = "virtletctl"   // one of Virtlet's own commands (vmtools)
	SessionAttach      = "attach"       // the serial console
	SessionPortForward = "port_forward" // one forwarded connection
)

// SessionObserver hears of each session as it begins, and of its end
// through the function it returns (with the session's error, nil when it
// ended well).
type SessionObserver func(kind string) (ended func(err error))

// WithSessionObserver makes the server report every session to o. Call it
// before Serve.
func (s *Server) WithSessionObserver(o SessionObserver) *Server {
	s.sessions.observe = o
	return s
}

// Address is where the server listens.
func (s *Server) Address() string { return s.listener.Addr().String() }

// Serve serves until ctx ends, then closes every stream: the listener,
// idle connections (http.Server.Close) and the connections the streaming
// library hijacked (which http.Server.Close leaves open), ending their
// sessions.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.listener) }()
	select {
	case err := <-errc:
		s.conns.closeAll()
		return err
	case <-ctx.Done():
		s.http.Close()
		s.conns.closeAll()
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

func (s *Server) GetExec(req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return s.lib.GetExec(req)
}

func (s *Server) GetAttach(req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return s.lib.GetAttach(req)
}

func (s *Server) GetPortForward(req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return s.lib.GetPortForward(req)
}

// runtime connects the library's streams to the core.
//
// Every session ends when its client's connection does (sessionContext).
type runtime struct {
	rt    *core.Runtime
	tools *Tools
	log   logrus.FieldLogger
	// maxExec bounds a guest command run by a streaming exec: the
	// library's idle timeout, after which it would close the connection
	// anyway (the guest agent sends no output before the command ends).
	maxExec time.Duration
	observe SessionObserver // nil: none
}

// session reports a session's beginning; call the result with its end.
func (r *runtime) session(kind string) func(err error) {
	if r.observe == nil {
		return func(error) {}
	}
	return r.observe(kind)
}

func (r *runtime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	go drain(resize)
	ctx, cancel := sessionContext(ctx)
	defer cancel()
	kind := SessionExec
	if vmtools.IsCommand(cmd) {
		kind = SessionTool
	}
	ended := r.session(kind)
	var code int32
	var err error
	defer func() { ended(err) }()
	if kind == SessionTool {
		code, err = r.tools.Run(ctx, containerID, cmd, in, writer(out), writer(errw))
	} else {
		limited, stop := context.WithTimeout(ctx, r.maxExec)
		defer stop()
		code, err = r.rt.Exec(limited, containerID, cmd, core.ExecStreams{Stdin: in, Stdout: writer(out), Stderr: writer(errw), TTY: tty})
		if err != nil && ctx.Err() == nil && errors.Is(limited.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("a streaming exec runs at most %s (the streaming server's idle timeout; the guest agent returns output only at the end): "+
				"the guest command was stopped: %w", r.maxExec, err)
		}
	}
	if err != nil {
		return err
	}
	if code != 0 {
		// The library reports this to the client as the exit code (the
		// session itself went well).
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: int(code)}
	}
	return nil
}

// Attach: a serial console has no window size, so resizes are dropped.
func (r *runtime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	go drain(resize)
	ctx, cancel := sessionContext(ctx)
	defer cancel()
	ended := r.session(SessionAttach)
	err := r.rt.Attach(ctx, containerID, in, writer(out))
	ended(err)
	return err
}

func (r *runtime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	ctx, cancel := sessionContext(ctx)
	defer cancel()
	ended := r.session(SessionPortForward)
	err := r.rt.PortForward(ctx, podSandboxID, port, stream)
	ended(err)
	return err
}

// drain drops terminal resizes (nil without a terminal: nothing to do)
// until the stream closes them.
func drain(resize <-chan remotecommand.TerminalSize) {
	if resize == nil {
		return
	}
	for range resize {
	}
}

// writer turns a missing stream into nil (not a nil *T in an interface).
func writer(w io.WriteCloser) io.Writer {
	if w == nil {
		return nil
	}
	return w
}
