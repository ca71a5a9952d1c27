package core_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
)

// runningVM makes a pod with a running VM and returns sandbox and
// container IDs.
func (e *env) runningVM(t *testing.T, name string) (string, string) {
	t.Helper()
	sb := e.runPod(t, name, nil)
	id := e.createVM(t, sb)
	if err := e.rt.StartContainer(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	return sb, id
}

// syncBuffer is a viewer's screen.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAttachSharesTheConsoleAndDetachesOnCtrlBracket(t *testing.T) {
	e := newEnv(t)
	_, id := e.runningVM(t, "att")
	ctx := context.Background()
	type session struct {
		in     *io.PipeWriter
		screen *syncBuffer
		done   chan error
	}
	attach := func() session {
		r, w := io.Pipe()
		s := session{in: w, screen: &syncBuffer{}, done: make(chan error, 1)}
		go func() { s.done <- e.rt.Attach(ctx, id, r, s.screen) }()
		return s
	}
	one, two := attach(), attach()
	eventually(t, "two viewers", func() bool { return e.hv.ConsoleViewers(id) == 2 })
	io.WriteString(one.in, "uname\r")
	for _, s := range []session{one, two} {
		eventually(t, "the answer on both screens", func() bool { return strings.Contains(s.screen.String(), "fake-vm: you typed uname") })
	}
	// Ctrl-] detaches the first viewer: what follows it is not sent.
	io.WriteString(one.in, "ls\x1dreboot\r")
	select {
	case err := <-one.done:
		if err != nil {
			t.Fatalf("detach: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Ctrl-] did not detach")
	}
	eventually(t, "one viewer left", func() bool { return e.hv.ConsoleViewers(id) == 1 })
	io.WriteString(two.in, "\r")
	eventually(t, "the second viewer still works", func() bool { return strings.Contains(two.screen.String(), "fake-vm: you typed ls") })
	if strings.Contains(two.screen.String(), "reboot") {
		t.Error("input after Ctrl-] reached the console")
	}
	if c, _ := e.rt.ContainerStatus(ctx, id); c.State != core.ContainerRunning {
		t.Fatalf("the VM is %s after a detach", c.State)
	}
	// The VM stops: the remaining viewer's session ends.
	if err := e.rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-two.done:
		if err != nil {
			t.Fatalf("attach after the VM stopped: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived the VM")
	}
	err := e.rt.Attach(ctx, id, strings.NewReader(""), io.Discard)
	if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("attach to a stopped VM: %v", err)
	}
	if err := e.rt.CheckAttach(id); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("CheckAttach of a stopped VM: %v", err)
	}
}

func TestExecSync(t *testing.T) {
	e := newEnv(t)
	_, id := e.runningVM(t, "exec-pod")
	ctx := context.Background()
	tests := []struct {
		name       string
		cmd        []string
		timeout    time.Duration
		code       int32
		out, err   string
		wantErr    error
		errContain string
	}{
		{name: "hostname", cmd: []string{"hostname"}, out: "exec-pod\n"},
		{name: "exit code", cmd: []string{"sh", "-c", "exit 3"}, code: 3},
		{name: "stderr apart", cmd: []string{"sh", "-c", "echo oops >&2"}, err: "oops\n"},
		{name: "unknown program", cmd: []string{"nope"}, code: 127, err: "fake agent: nope: command not found\n"},
		{name: "empty", cmd: nil, wantErr: ports.ErrInvalidArgument, errContain: "cmd: the command is empty"},
		{name: "timeout", cmd: []string{"sleep", "60"}, timeout: 100 * time.Millisecond, wantErr: context.DeadlineExceeded,
			errContain: `"sleep" did not finish within 100ms; the guest process (pid`}, // no arguments: they may be secret
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			res, err := e.rt.ExecSync(ctx, id, tt.cmd, tt.timeout)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errContain) {
					t.Fatalf("err %v, want %v containing %q", err, tt.wantErr, tt.errContain)
				}
				if tt.timeout > 0 && time.Since(start) > tt.timeout+time.Second {
					t.Fatalf("took %s for a %s timeout", time.Since(start), tt.timeout)
				}
				return
			}
			if err != nil || res.ExitCode != tt.code || string(res.Stdout) != tt.out || string(res.Stderr) != tt.err {
				t.Fatalf("got %d %q %q %v, want %d %q %q", res.ExitCode, res.Stdout, res.Stderr, err, tt.code, tt.out, tt.err)
			}
		})
	}
}

func TestExecRefusals(t *testing.T) {
	e := newEnv(t)
	_, id := e.runningVM(t, "refusals")
	ctx := context.Background()
	_, err := e.rt.Exec(ctx, id, []string{"sh"}, core.ExecStreams{TTY: true})
	if !errors.Is(err, ports.ErrUnimplemented) || !strings.Contains(err.Error(), "virtletctl ssh") {
		t.Fatalf("exec -t: %v", err)
	}
	_, err = e.rt.Exec(ctx, id, []string{"cat"}, core.ExecStreams{Stdin: bytes.NewReader(make([]byte, core.MaxExecStdinBytes+1))})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "stdin") {
		t.Fatalf("too much stdin: %v", err)
	}
	var out bytes.Buffer
	code, err := e.rt.Exec(ctx, id, []string{"cat"}, core.ExecStreams{Stdin: strings.NewReader("hello\n"), Stdout: &out})
	if err != nil || code != 0 || out.String() != "hello\n" {
		t.Fatalf("exec cat: %d %q %v", code, out.String(), err)
	}
	e.hv.NoAgent = true
	start := time.Now()
	_, err = e.rt.ExecSync(ctx, id, []string{"true"}, time.Minute)
	if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), fakehypervisor.NoAgentError) || time.Since(start) > 15*time.Second {
		t.Fatalf("no agent: %v after %s", err, time.Since(start))
	}
}

// fakeDialer answers the addresses it knows; others are refused, as a
// closed port is.
type fakeDialer struct {
	mu     sync.Mutex
	dialed []string
	open   map[string]func(net.Conn)
}

type pipeConn struct{ net.Conn }

func (p pipeConn) CloseWrite() error { return nil }

func (d *fakeDialer) Dial(ctx context.Context, network, address string) (ports.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialed = append(d.dialed, address)
	serve, ok := d.open[address]
	if !ok {
		return nil, errors.New("dial tcp " + address + ": connect: connection refused")
	}
	client, server := net.Pipe()
	go serve(server)
	return pipeConn{client}, nil
}

// streamPipe is the client's stream of a port-forward.
type streamPipe struct {
	io.Reader
	io.Writer
}

func (streamPipe) Close() error { return nil }

func TestPortForward(t *testing.T) {
	e := newEnv(t)
	greet := func(c net.Conn) { io.WriteString(c, "SSH-2.0-fake\r\n"); c.Close() }
	d := &fakeDialer{open: map[string]func(net.Conn){"198.18.0.2:22": greet}}
	e.dialer = d
	e.start(t)
	sb, _ := e.runningVM(t, "pf")
	ctx := context.Background()
	var out bytes.Buffer
	if err := e.rt.PortForward(ctx, sb, 22, streamPipe{strings.NewReader(""), &out}); err != nil || out.String() != "SSH-2.0-fake\r\n" {
		t.Fatalf("port-forward to 22: %q %v", out.String(), err)
	}
	err := e.rt.PortForward(ctx, sb, 80, streamPipe{strings.NewReader(""), io.Discard})
	if err == nil || !strings.Contains(err.Error(), "failed to connect to port 80 of pod default/pf: IPv4: dial tcp 198.18.0.2:80: connect: connection refused") {
		t.Fatalf("closed port: %v", err)
	}
	if err := e.rt.PortForward(ctx, sb, 0, streamPipe{strings.NewReader(""), io.Discard}); !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("port 0: %v", err)
	}
	other := e.runPod(t, "pf-no-vm", nil)
	if err := e.rt.CheckPortForward(other); !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "VM is not running") {
		t.Fatalf("pod without a running VM: %v", err)
	}
}

func TestStatsAreOneQueryPerList(t *testing.T) {
	e := newEnv(t)
	e.runningVM(t, "s1")
	e.runningVM(t, "s2")
	stopped := e.runPod(t, "s3", nil)
	e.createVM(t, stopped) // created, never started: no usage
	ctx := context.Background()
	before := e.hv.StatsCalls()
	list, err := e.rt.ListContainerStats(ctx, core.ContainerFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("ListContainerStats: %d entries, %v", len(list), err)
	}
	if got := e.hv.StatsCalls() - before; got != 1 {
		t.Fatalf("%d hypervisor queries for one list", got)
	}
	for _, s := range list {
		u := s.Usage
		mem := uint64(256 << 20) // the fake's balloon: available 15/16, unused 1/2, caches 1/8
		if u == nil || u.MemoryBytes != mem-mem/16-mem/2 || u.WorkingSetBytes != u.MemoryBytes-mem/8 ||
			u.AvailableBytes != mem-u.WorkingSetBytes || u.RSSBytes != mem/2 || s.WritableLayerFS == "" {
			t.Fatalf("usage %+v", u)
		}
	}
	pods, err := e.rt.ListSandboxStats(ctx, core.SandboxFilter{})
	if err != nil || len(pods) != 3 || e.hv.StatsCalls()-before != 2 {
		t.Fatalf("ListSandboxStats: %d pods, %d queries, %v", len(pods), e.hv.StatsCalls()-before, err)
	}
	withVM := 0
	for _, p := range pods {
		if len(p.Containers) == 1 && p.Containers[0].Usage != nil && len(p.Containers[0].Usage.NICs) == 1 {
			withVM++
		}
	}
	if withVM != 2 {
		t.Fatalf("%d pods with a running VM's usage, want 2", withVM)
	}
}
