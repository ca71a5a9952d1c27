// Package hypervisor carries ports.Hypervisor across the plugin boundary:
// Client implements the port over gRPC in the daemon, Server serves an
// adapter inside a plugin process.
package hypervisor

import (
	"context"
	"time"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

// Client is a ports.Hypervisor served by a plugin.
type Client struct {
	conn base.Conn
}

// NewClient returns a hypervisor client over a plugin connection.
func NewClient(c base.Conn) *Client { return &Client{conn: c} }

func (c *Client) rpc() (hypervisorv1.HypervisorClient, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return nil, err
	}
	return hypervisorv1.NewHypervisorClient(conn), nil
}

func (c *Client) Capabilities(ctx context.Context) (ports.HypervisorCapabilities, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.HypervisorCapabilities{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Capabilities(ctx, &hypervisorv1.CapabilitiesRequest{})
	if err != nil {
		return ports.HypervisorCapabilities{}, c.conn.Error(err)
	}
	return ports.HypervisorCapabilities{Name: resp.Name, Version: resp.Version, Accelerator: resp.Accelerator, Details: resp.Details}, nil
}

func (c *Client) Define(ctx context.Context, spec ports.VMSpec) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = rpc.Define(ctx, &hypervisorv1.DefineRequest{Spec: specToProto(spec)})
	return c.conn.Error(err)
}

func (c *Client) Start(ctx context.Context, id string) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = rpc.Start(ctx, &hypervisorv1.VMRequest{Id: id})
	return c.conn.Error(err)
}

func (c *Client) Stop(ctx context.Context, id string, timeout time.Duration) (ports.VMStatus, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.VMStatus{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, timeout+base.SlowCallTimeout)
	defer cancel()
	resp, err := rpc.Stop(ctx, &hypervisorv1.StopRequest{Id: id, TimeoutNanos: int64(timeout)})
	if err != nil {
		return ports.VMStatus{}, c.conn.Error(err)
	}
	return statusFromProto(resp), nil
}

func (c *Client) Undefine(ctx context.Context, id string) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = rpc.Undefine(ctx, &hypervisorv1.VMRequest{Id: id})
	return c.conn.Error(err)
}

func (c *Client) Status(ctx context.Context, id string) (ports.VMStatus, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.VMStatus{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.Status(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.VMStatus{}, c.conn.Error(err)
	}
	return statusFromProto(resp), nil
}

func (c *Client) List(ctx context.Context) ([]ports.VMStatus, error) {
	rpc, err := c.rpc()
	if err != nil {
		return nil, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.List(ctx, &hypervisorv1.ListRequest{})
	if err != nil {
		return nil, c.conn.Error(err)
	}
	out := make([]ports.VMStatus, 0, len(resp.Vms))
	for _, vm := range resp.Vms {
		out = append(out, statusFromProto(vm))
	}
	return out, nil
}

// Watch streams state changes; the channel closes when ctx ends or the
// plugin goes away (the caller then resubscribes and resynchronises).
func (c *Client) Watch(ctx context.Context) (<-chan ports.VMStatus, error) {
	rpc, err := c.rpc()
	if err != nil {
		return nil, err
	}
	stream, err := rpc.Watch(ctx, &hypervisorv1.WatchRequest{})
	if err != nil {
		return nil, c.conn.Error(err)
	}
	// Return once the plugin has subscribed (its first message, without an
	// ID): a change between this call and a later List is then never lost.
	first, err := stream.Recv()
	if err != nil {
		return nil, c.conn.Error(err)
	}
	out := make(chan ports.VMStatus, 64)
	if first.Id != "" {
		// A plugin that sends no marker (against the proto's contract):
		// Watch returned only with its first change; keep that change.
		out <- statusFromProto(first)
	}
	go func() {
		defer close(out)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case out <- statusFromProto(msg):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (c *Client) ReopenLog(ctx context.Context, id string) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	_, err = rpc.ReopenLog(ctx, &hypervisorv1.VMRequest{Id: id})
	return c.conn.Error(err)
}

func (c *Client) SetMemory(ctx context.Context, id string, bytes int64) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	_, err = rpc.SetMemory(ctx, &hypervisorv1.SetMemoryRequest{Id: id, MemoryBytes: bytes})
	return c.conn.Error(err)
}

func (c *Client) SetCPULimits(ctx context.Context, id string, l ports.CPULimits) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	limits := CPULimitsToProto(l)
	if limits == nil {
		limits = &hypervisorv1.CPULimits{}
	}
	_, err = rpc.SetCPULimits(ctx, &hypervisorv1.SetCPULimitsRequest{Id: id, Limits: limits})
	return c.conn.Error(err)
}

func (c *Client) SetVCPUs(ctx context.Context, id string, n int) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	_, err = rpc.SetVCPUs(ctx, &hypervisorv1.SetVCPUsRequest{Id: id, Vcpus: int32(n)})
	return c.conn.Error(err)
}

func (c *Client) WriteFiles(ctx context.Context, id string, files []ports.GuestFile) error {
	rpc, err := c.rpc()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	req := &hypervisorv1.WriteFilesRequest{Id: id}
	for _, f := range files {
		req.Files = append(req.Files, &hypervisorv1.GuestFile{Path: f.Path, Data: f.Data, Mode: uint32(f.Mode), Source: f.Source})
	}
	_, err = rpc.WriteFiles(ctx, req)
	return c.conn.Error(err)
}

var _ ports.Hypervisor = (*Client)(nil)
