package fakehypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// The fake's ways into a VM. A fake guest has:
//   - a serial console that echoes what viewers type and answers each
//     line with "fake-vm: you typed <line>";
//   - a guest agent that knows a few commands: hostname, echo, cat (stdin
//     to stdout), sleep N, sh -c 'exit N', sh -c 'echo X >&2', and refuses
//     others with exit code 127 (unless the hypervisor has NoAgent);
//   - stats that grow with the time it has run;
//   - a VNC display that greets with the RFB banner.

// NoAgentError is what GuestExec says when the fake has no agent.
const NoAgentError = "the VM has no guest agent"

// FakeRFBBanner is what the fake VNC display says first.
const FakeRFBBanner = "RFB 003.008\n"

type console struct {
	mu      sync.Mutex
	viewers map[*viewer]struct{}
	line    []byte
}

type viewer struct {
	c      *console
	out    chan []byte
	closed chan struct{}
	once   sync.Once
	buf    []byte
}

func (h *Hypervisor) consoleOf(id string) *console {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.consoles == nil {
		h.consoles = map[string]*console{}
	}
	c := h.consoles[id]
	if c == nil {
		c = &console{viewers: map[*viewer]struct{}{}}
		h.consoles[id] = c
	}
	return c
}

func (h *Hypervisor) runningVM(id, what string) (*vm, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok {
		return nil, fmt.Errorf("fake %s %s: %w", what, id, ports.ErrNotFound)
	}
	if v.Status.State != ports.VMRunning {
		return nil, fmt.Errorf("fake %s %s: the VM is %s: %w", what, id, v.Status.State, ports.ErrFailedPrecondition)
	}
	return v, nil
}

func (h *Hypervisor) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if _, err := h.runningVM(id, "console"); err != nil {
		return nil, err
	}
	c := h.consoleOf(id)
	v := &viewer{c: c, out: make(chan []byte, 256), closed: make(chan struct{})}
	c.mu.Lock()
	c.viewers[v] = struct{}{}
	c.mu.Unlock()
	return v, nil
}

// ConsoleViewers counts the viewers attached to a VM's console.
func (h *Hypervisor) ConsoleViewers(id string) int {
	c := h.consoleOf(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.viewers)
}

func (c *console) broadcast(p []byte) {
	for v := range c.viewers {
		select {
		case v.out <- append([]byte(nil), p...):
		default: // a stalled viewer misses output, as on a real console
		}
	}
}

func (v *viewer) Read(p []byte) (int, error) {
	for len(v.buf) == 0 {
		select {
		case b := <-v.out:
			v.buf = b
		case <-v.closed:
			return 0, io.EOF
		}
	}
	n := copy(p, v.buf)
	v.buf = v.buf[n:]
	return n, nil
}

func (v *viewer) Write(p []byte) (int, error) {
	c := v.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.broadcast(p) // the terminal echoes
	for _, b := range p {
		if b == '\r' || b == '\n' {
			if len(c.line) > 0 {
				c.broadcast([]byte("\r\nfake-vm: you typed " + string(c.line) + "\r\n"))
			}
			c.line = c.line[:0]
			continue
		}
		c.line = append(c.line, b)
	}
	return len(p), nil
}

func (v *viewer) Close() error {
	v.once.Do(func() {
		v.c.mu.Lock()
		delete(v.c.viewers, v)
		v.c.mu.Unlock()
		close(v.closed)
	})
	return nil
}

// closeConsole ends every viewer of a VM that stopped.
func (h *Hypervisor) closeConsoleLocked(id string) {
	c := h.consoles[id]
	if c == nil {
		return
	}
	c.mu.Lock()
	var vs []*viewer
	for v := range c.viewers {
		vs = append(vs, v)
	}
	c.mu.Unlock()
	for _, v := range vs {
		go v.Close()
	}
}

func (h *Hypervisor) GuestExec(ctx context.Context, id string, req ports.GuestExecRequest) (ports.GuestExecResult, error) {
	v, err := h.runningVM(id, "exec")
	if err != nil {
		return ports.GuestExecResult{}, err
	}
	h.mu.Lock()
	noAgent := h.NoAgent
	h.execs++
	pid := int64(1000 + h.execs)
	h.mu.Unlock()
	if noAgent {
		return ports.GuestExecResult{}, fmt.Errorf("fake exec in %s: %s: %w", v.Spec.Name, NoAgentError, ports.ErrFailedPrecondition)
	}
	res := ports.GuestExecResult{PID: pid}
	var stdout, stderr bytes.Buffer
	argv := req.Argv
	switch argv[0] {
	case "hostname":
		fmt.Fprintln(&stdout, v.Spec.PodName)
	case "echo":
		fmt.Fprintln(&stdout, strings.Join(argv[1:], " "))
	case "cat":
		stdout.Write(req.Stdin)
	case "sleep":
		d := time.Second
		if len(argv) > 1 {
			if s, err := strconv.ParseFloat(argv[1], 64); err == nil {
				d = time.Duration(s * float64(time.Second))
			}
		}
		var timeout <-chan time.Time
		if req.Timeout > 0 {
			timeout = time.After(req.Timeout)
		}
		// The guest process runs until it ends, times out or the caller
		// leaves (then it is killed): Diagnose counts it meanwhile.
		h.mu.Lock()
		if h.running == nil {
			h.running = map[string]int{}
		}
		h.running[id]++
		h.mu.Unlock()
		defer func() {
			h.mu.Lock()
			h.running[id]--
			h.mu.Unlock()
		}()
		select {
		case <-time.After(d):
		case <-timeout:
			res.TimedOut, res.Killed, res.ExitCode = true, true, 137
			return res, nil
		case <-ctx.Done():
			return res, ctx.Err()
		}
	case "sh":
		if len(argv) == 3 && argv[1] == "-c" {
			script := strings.TrimSpace(argv[2])
			switch {
			case strings.HasPrefix(script, "exit "):
				code, _ := strconv.Atoi(strings.TrimPrefix(script, "exit "))
				res.ExitCode = int32(code)
			case strings.HasPrefix(script, "echo ") && strings.HasSuffix(script, ">&2"):
				fmt.Fprintln(&stderr, strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(script, "echo "), ">&2")))
			default:
				fmt.Fprintf(&stderr, "fake sh: cannot run %q\n", script)
				res.ExitCode = 2
			}
			break
		}
		fallthrough
	default:
		fmt.Fprintf(&stderr, "fake agent: %s: command not found\n", argv[0])
		res.ExitCode = 127
	}
	res.Stdout, res.StdoutTruncated = capped(stdout.Bytes(), req.MaxOutputBytes)
	res.Stderr, res.StderrTruncated = capped(stderr.Bytes(), req.MaxOutputBytes)
	return res, nil
}

func capped(b []byte, max int) ([]byte, bool) {
	if max > 0 && len(b) > max {
		return b[:max], true
	}
	return b, false
}

func (h *Hypervisor) Stats(ctx context.Context, ids []string) ([]ports.VMStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Stats"); err != nil {
		return nil, err
	}
	h.statsCalls++
	now := h.now()
	var out []ports.VMStats
	for _, id := range ids {
		v, ok := h.vms[id]
		if !ok || v.Status.State != ports.VMRunning {
			continue
		}
		up := uint64(now.Sub(v.Status.StartedAt))
		mem := uint64(v.Spec.MemoryBytes)
		s := ports.VMStats{ID: id, Timestamp: now, CPUNanos: up / 10,
			Memory: ports.MemoryStats{HostReported: true, CurrentBytes: mem, RSSBytes: mem / 2, GuestReported: true,
				AvailableBytes: mem - mem/16, UnusedBytes: mem / 2, CacheBytes: mem / 8,
				FaultsReported: true, MinorFaults: up / 1e6, MajorFaults: up / 1e8}}
		for _, d := range v.Spec.Disks {
			s.Disks = append(s.Disks, ports.DiskStats{Name: d.Name, ReadBytes: up / 1000, SizesReported: true, AllocationBytes: 1 << 20, CapacityBytes: 1 << 30})
		}
		for _, n := range v.Spec.NICs {
			s.NICs = append(s.NICs, ports.NICStats{Name: n.Name, RxBytes: up / 100, TxBytes: up / 200})
		}
		out = append(out, s)
	}
	return out, nil
}

// StatsCalls counts Stats calls (one per CRI list is the contract).
func (h *Hypervisor) StatsCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.statsCalls
}

func (h *Hypervisor) Diagnose(ctx context.Context, id string) (ports.VMDiagnostics, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok {
		return ports.VMDiagnostics{}, fmt.Errorf("fake diagnose %s: %w", id, ports.ErrNotFound)
	}
	def, _ := json.MarshalIndent(v.Spec, "", "  ")
	viewers := 0
	if c := h.consoles[id]; c != nil {
		c.mu.Lock()
		viewers = len(c.viewers)
		c.mu.Unlock()
	}
	return ports.VMDiagnostics{Definition: string(def), Details: map[string]string{"state": string(v.Status.State),
		"consoleViewers": strconv.Itoa(viewers), "guestProcesses": strconv.Itoa(h.running[id])}}, nil
}

func (h *Hypervisor) Inspect(ctx context.Context, id string, args []string) (ports.CommandOutput, error) {
	h.mu.Lock()
	v, ok := h.vms[id]
	h.mu.Unlock()
	if !ok {
		return ports.CommandOutput{}, fmt.Errorf("fake inspect %s: %w", id, ports.ErrNotFound)
	}
	if len(args) == 0 || args[0] != "dominfo" {
		return ports.CommandOutput{}, &ports.InvalidError{Field: "command", Value: strings.Join(args, " "), Allowed: "dominfo (the fake knows no other)"}
	}
	return ports.CommandOutput{Stdout: []byte(fmt.Sprintf("Name: %s\nState: %s\n", v.Spec.Name, v.Status.State))}, nil
}

func (h *Hypervisor) Display(ctx context.Context, id string) (ports.Display, error) {
	if _, err := h.runningVM(id, "display"); err != nil {
		return ports.Display{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.vnc == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports.Display{}, err
		}
		h.vnc = l
		go serveFakeVNC(l)
	}
	return ports.Display{Protocol: "vnc", Address: h.vnc.Addr().String()}, nil
}

// serveFakeVNC greets like a VNC server and echoes what the viewer sends.
func serveFakeVNC(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.WriteString(c, FakeRFBBanner)
			io.Copy(c, c)
		}()
	}
}

var (
	_ ports.ConsoleOpener = (*Hypervisor)(nil)
	_ ports.GuestExecer   = (*Hypervisor)(nil)
	_ ports.StatsReporter = (*Hypervisor)(nil)
	_ ports.VMInspector   = (*Hypervisor)(nil)
)
