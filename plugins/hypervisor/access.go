package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

// Reaching a running VM across the plugin boundary: the console as a
// bidirectional stream, guest exec, stats, diagnostics.

// consoleChunk bounds one console message (the serial line is far slower).
const consoleChunk = 32 << 10

// OpenConsole attaches a viewer through the plugin. The returned stream
// lives until Close, the VM stops, or ctx ends.
func (c *Client) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	rpc, err := c.rpc()
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := rpc.Console(sctx)
	if err != nil {
		cancel()
		return nil, c.conn.Error(err)
	}
	if err := stream.Send(&hypervisorv1.ConsoleInput{Id: id}); err != nil {
		cancel()
		return nil, c.conn.Error(err)
	}
	// The plugin answers with an empty message once the viewer is attached,
	// or with the error that prevented it; a plugin that does neither
	// does not hold the caller (and its client) forever.
	timer := time.AfterFunc(base.QuickCallTimeout, cancel)
	_, err = stream.Recv()
	if !timer.Stop() { // it fired: the stream is cancelled
		return nil, fmt.Errorf("open the console of VM %s: the hypervisor plugin did not attach the viewer within %s: %w", id, base.QuickCallTimeout, ports.ErrUnavailable)
	}
	if err != nil {
		cancel()
		return nil, c.conn.Error(err)
	}
	return &consoleClient{stream: stream, cancel: cancel, errOf: c.conn.Error}, nil
}

type consoleClient struct {
	stream hypervisorv1.Hypervisor_ConsoleClient
	cancel context.CancelFunc
	errOf  func(error) error
	buf    []byte
	sendMu sync.Mutex
	once   sync.Once
}

func (cc *consoleClient) Read(p []byte) (int, error) {
	for len(cc.buf) == 0 {
		msg, err := cc.stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		if err != nil {
			return 0, cc.errOf(err)
		}
		cc.buf = msg.Data
	}
	n := copy(p, cc.buf)
	cc.buf = cc.buf[n:]
	return n, nil
}

func (cc *consoleClient) Write(p []byte) (int, error) {
	cc.sendMu.Lock()
	defer cc.sendMu.Unlock()
	written := 0
	for len(p) > 0 {
		n := min(len(p), consoleChunk)
		if err := cc.stream.Send(&hypervisorv1.ConsoleInput{Data: append([]byte(nil), p[:n]...)}); err != nil {
			return written, cc.errOf(err)
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

func (cc *consoleClient) Close() error {
	cc.once.Do(func() {
		cc.sendMu.Lock()
		cc.stream.CloseSend()
		cc.sendMu.Unlock()
		cc.cancel()
	})
	return nil
}

// GuestExec runs a command through the plugin; the call may take the
// request's timeout plus a margin for killing the guest process.
func (c *Client) GuestExec(ctx context.Context, id string, req ports.GuestExecRequest) (ports.GuestExecResult, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.GuestExecResult{}, err
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout+guestExecMargin)
		defer cancel()
	}
	resp, err := rpc.GuestExec(ctx, &hypervisorv1.GuestExecRequest{
		Id: id, Argv: req.Argv, Stdin: req.Stdin, TimeoutNanos: int64(req.Timeout), MaxOutputBytes: int64(req.MaxOutputBytes),
	})
	if err != nil {
		return ports.GuestExecResult{}, c.conn.Error(err)
	}
	return ports.GuestExecResult{
		ExitCode: resp.ExitCode, Stdout: resp.Stdout, Stderr: resp.Stderr,
		StdoutTruncated: resp.StdoutTruncated, StderrTruncated: resp.StderrTruncated,
		TimedOut: resp.TimedOut, Killed: resp.Killed, KillError: resp.KillError, PID: resp.Pid,
	}, nil
}

// GuestInfo asks the guest's agent about itself through the plugin.
func (c *Client) GuestInfo(ctx context.Context, id string) (ports.GuestInfo, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.GuestInfo{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.GuestInfo(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.GuestInfo{}, c.conn.Error(err)
	}
	info := ports.GuestInfo{OS: resp.Os, Kernel: resp.Kernel, Hostname: resp.Hostname, TimeZone: resp.TimeZone}
	for _, i := range resp.Interfaces {
		info.Interfaces = append(info.Interfaces, ports.GuestInterface{Name: i.Name, MAC: i.Mac, Addresses: i.Addresses})
	}
	return info, nil
}

// guestExecMargin is the time a timed-out guest command gets for being
// killed and reported.
const guestExecMargin = 5 * time.Second

func (c *Client) Stats(ctx context.Context, ids []string) ([]ports.VMStats, error) {
	rpc, err := c.rpc()
	if err != nil {
		return nil, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Stats(ctx, &hypervisorv1.StatsRequest{Ids: ids})
	if err != nil {
		return nil, c.conn.Error(err)
	}
	out := make([]ports.VMStats, 0, len(resp.Vms))
	for _, s := range resp.Vms {
		out = append(out, statsFromProto(s))
	}
	return out, nil
}

func (c *Client) Diagnose(ctx context.Context, id string) (ports.VMDiagnostics, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.VMDiagnostics{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Diagnose(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.VMDiagnostics{}, c.conn.Error(err)
	}
	return ports.VMDiagnostics{Definition: resp.Definition, Details: resp.Details}, nil
}

func (c *Client) Inspect(ctx context.Context, id string, args []string) (ports.CommandOutput, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.CommandOutput{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Inspect(ctx, &hypervisorv1.InspectRequest{Id: id, Args: args})
	if err != nil {
		return ports.CommandOutput{}, c.conn.Error(err)
	}
	return ports.CommandOutput{Stdout: resp.Stdout, Stderr: resp.Stderr, ExitCode: resp.ExitCode}, nil
}

func (c *Client) Display(ctx context.Context, id string) (ports.Display, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.Display{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Display(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.Display{}, c.conn.Error(err)
	}
	return ports.Display{Protocol: resp.Protocol, Network: resp.Network, Address: resp.Address}, nil
}

var (
	_ ports.ConsoleOpener = (*Client)(nil)
	_ ports.GuestExecer   = (*Client)(nil)
	_ ports.GuestInformer = (*Client)(nil)
	_ ports.StatsReporter = (*Client)(nil)
	_ ports.VMInspector   = (*Client)(nil)
)

// Server side.

func unimplemented(what string) error {
	return base.ToRPC(fmt.Errorf("this hypervisor plugin does not support %s: %w", what, ports.ErrUnimplemented))
}

func (s *Server) Console(stream hypervisorv1.Hypervisor_ConsoleServer) error {
	co, ok := s.impl.(ports.ConsoleOpener)
	if !ok {
		return unimplemented("console access")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	console, err := co.OpenConsole(ctx, first.Id)
	if err != nil {
		return base.ToRPC(err)
	}
	defer console.Close()
	if err := stream.Send(&hypervisorv1.ConsoleOutput{}); err != nil { // attached
		return err
	}
	inputDone := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				inputDone <- err
				return
			}
			if len(msg.Data) == 0 {
				continue
			}
			if _, err := console.Write(msg.Data); err != nil {
				inputDone <- err
				return
			}
		}
	}()
	outputDone := make(chan error, 1)
	go func() {
		buf := make([]byte, consoleChunk)
		for {
			n, err := console.Read(buf)
			if n > 0 {
				if serr := stream.Send(&hypervisorv1.ConsoleOutput{Data: append([]byte(nil), buf[:n]...)}); serr != nil {
					outputDone <- serr
					return
				}
			}
			if err != nil {
				outputDone <- err
				return
			}
		}
	}()
	select {
	case err := <-outputDone:
		if errors.Is(err, io.EOF) {
			return nil // the VM stopped
		}
		return base.ToRPC(err)
	case err := <-inputDone:
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			return nil // the viewer detached
		}
		return base.ToRPC(err)
	}
}

func (s *Server) GuestExec(ctx context.Context, req *hypervisorv1.GuestExecRequest) (*hypervisorv1.GuestExecResponse, error) {
	ge, ok := s.impl.(ports.GuestExecer)
	if !ok {
		return nil, unimplemented("exec through a guest agent")
	}
	r, err := ge.GuestExec(ctx, req.Id, ports.GuestExecRequest{
		Argv: req.Argv, Stdin: req.Stdin, Timeout: time.Duration(req.TimeoutNanos), MaxOutputBytes: int(req.MaxOutputBytes),
	})
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.GuestExecResponse{
		ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		TimedOut: r.TimedOut, Killed: r.Killed, KillError: r.KillError, Pid: r.PID,
	}, nil
}

func (s *Server) GuestInfo(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.GuestInfoResponse, error) {
	gi, ok := s.impl.(ports.GuestInformer)
	if !ok {
		return nil, unimplemented("guest information from a guest agent")
	}
	info, err := gi.GuestInfo(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	resp := &hypervisorv1.GuestInfoResponse{Os: info.OS, Kernel: info.Kernel, Hostname: info.Hostname, TimeZone: info.TimeZone}
	for _, i := range info.Interfaces {
		resp.Interfaces = append(resp.Interfaces, &hypervisorv1.GuestInterface{Name: i.Name, Mac: i.MAC, Addresses: i.Addresses})
	}
	return resp, nil
}

func (s *Server) Stats(ctx context.Context, req *hypervisorv1.StatsRequest) (*hypervisorv1.StatsResponse, error) {
	sr, ok := s.impl.(ports.StatsReporter)
	if !ok {
		return nil, unimplemented("VM stats")
	}
	stats, err := sr.Stats(ctx, req.Ids)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	resp := &hypervisorv1.StatsResponse{}
	for _, st := range stats {
		resp.Vms = append(resp.Vms, statsToProto(st))
	}
	return resp, nil
}

func (s *Server) inspector() (ports.VMInspector, error) {
	vi, ok := s.impl.(ports.VMInspector)
	if !ok {
		return nil, unimplemented("VM diagnostics")
	}
	return vi, nil
}

func (s *Server) Diagnose(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.DiagnoseResponse, error) {
	vi, err := s.inspector()
	if err != nil {
		return nil, err
	}
	d, err := vi.Diagnose(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.DiagnoseResponse{Definition: d.Definition, Details: d.Details}, nil
}

func (s *Server) Inspect(ctx context.Context, req *hypervisorv1.InspectRequest) (*hypervisorv1.InspectResponse, error) {
	vi, err := s.inspector()
	if err != nil {
		return nil, err
	}
	out, err := vi.Inspect(ctx, req.Id, req.Args)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.InspectResponse{Stdout: out.Stdout, Stderr: out.Stderr, ExitCode: out.ExitCode}, nil
}

func (s *Server) Display(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.DisplayResponse, error) {
	vi, err := s.inspector()
	if err != nil {
		return nil, err
	}
	d, err := vi.Display(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.DisplayResponse{Protocol: d.Protocol, Network: d.Network, Address: d.Address}, nil
}

func statsToProto(s ports.VMStats) *hypervisorv1.VMStats {
	m := s.Memory
	p := &hypervisorv1.VMStats{Id: s.ID, Timestamp: base.Nanos(s.Timestamp), CpuNanos: s.CPUNanos,
		Memory: &hypervisorv1.MemoryStats{CurrentBytes: m.CurrentBytes, RssBytes: m.RSSBytes, GuestReported: m.GuestReported, HostReported: m.HostReported, FaultsReported: m.FaultsReported,
			AvailableBytes: m.AvailableBytes, UnusedBytes: m.UnusedBytes, CacheBytes: m.CacheBytes, MinorFaults: m.MinorFaults, MajorFaults: m.MajorFaults}}
	for _, d := range s.Disks {
		p.Disks = append(p.Disks, &hypervisorv1.DiskStats{Name: d.Name, ReadBytes: d.ReadBytes, WriteBytes: d.WriteBytes,
			ReadOps: d.ReadOps, WriteOps: d.WriteOps, AllocationBytes: d.AllocationBytes, CapacityBytes: d.CapacityBytes, SizesReported: d.SizesReported})
	}
	for _, n := range s.NICs {
		p.Nics = append(p.Nics, &hypervisorv1.NICStats{Name: n.Name, RxBytes: n.RxBytes, TxBytes: n.TxBytes,
			RxErrors: n.RxErrors, TxErrors: n.TxErrors, RxPackets: n.RxPackets, TxPackets: n.TxPackets})
	}
	return p
}

func statsFromProto(p *hypervisorv1.VMStats) ports.VMStats {
	m := p.GetMemory()
	s := ports.VMStats{ID: p.Id, Timestamp: base.Time(p.Timestamp), CPUNanos: p.CpuNanos,
		Memory: ports.MemoryStats{CurrentBytes: m.GetCurrentBytes(), RSSBytes: m.GetRssBytes(), GuestReported: m.GetGuestReported(), HostReported: m.GetHostReported(), FaultsReported: m.GetFaultsReported(),
			AvailableBytes: m.GetAvailableBytes(), UnusedBytes: m.GetUnusedBytes(), CacheBytes: m.GetCacheBytes(),
			MinorFaults: m.GetMinorFaults(), MajorFaults: m.GetMajorFaults()}}
	for _, d := range p.Disks {
		s.Disks = append(s.Disks, ports.DiskStats{Name: d.Name, ReadBytes: d.ReadBytes, WriteBytes: d.WriteBytes,
			ReadOps: d.ReadOps, WriteOps: d.WriteOps, AllocationBytes: d.AllocationBytes, CapacityBytes: d.CapacityBytes, SizesReported: d.SizesReported})
	}
	for _, n := range p.Nics {
		s.NICs = append(s.NICs, ports.NICStats{Name: n.Name, RxBytes: n.RxBytes, TxBytes: n.TxBytes,
			RxErrors: n.RxErrors, TxErrors: n.TxErrors, RxPackets: n.RxPackets, TxPackets: n.TxPackets})
	}
	return s
}
