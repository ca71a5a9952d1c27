// Package network carries ports.Network across the plugin boundary.
package network

import (
	"context"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	networkv1 "github.com/virtlet/virtlet/proto/network/v1"
)

// Adapter is what a network plugin implements.
type Adapter interface {
	ports.Network
	ports.Describer
}

// Register adds the base and network services for impl to a gRPC server.
func Register(impl Adapter) func(*grpc.Server) {
	return func(s *grpc.Server) {
		basev1.RegisterPluginServer(s, &base.Server{Adapter: impl, Kind: ports.KindNetwork})
		networkv1.RegisterNetworkServer(s, &Server{impl: impl})
	}
}

func requestToProto(r ports.NetworkRequest) *networkv1.NetworkRequest {
	p := &networkv1.NetworkRequest{SandboxId: r.SandboxID, PodName: r.PodName, PodNamespace: r.PodNamespace,
		PodUid: r.PodUID, Dns: base.DNSToProto(r.DNS), Annotations: r.Annotations}
	for _, m := range r.PortMappings {
		p.PortMappings = append(p.PortMappings, &networkv1.PortMapping{Protocol: m.Protocol, ContainerPort: m.ContainerPort, HostPort: m.HostPort, HostIp: m.HostIP})
	}
	return p
}

func requestFromProto(p *networkv1.NetworkRequest) ports.NetworkRequest {
	r := ports.NetworkRequest{SandboxID: p.SandboxId, PodName: p.PodName, PodNamespace: p.PodNamespace,
		PodUID: p.PodUid, DNS: base.DNSFromProto(p.Dns), Annotations: p.Annotations}
	for _, m := range p.PortMappings {
		r.PortMappings = append(r.PortMappings, ports.PortMapping{Protocol: m.Protocol, ContainerPort: m.ContainerPort, HostPort: m.HostPort, HostIP: m.HostIp})
	}
	return r
}

func attachmentToProto(a ports.NetworkAttachment) *networkv1.NetworkAttachment {
	p := &networkv1.NetworkAttachment{NetnsPath: a.NetNSPath, Dns: base.DNSToProto(a.DNS)}
	for _, i := range a.Interfaces {
		pi := &networkv1.NetworkInterface{Name: i.Name, Mac: i.MAC, Mtu: int32(i.MTU), Bridge: i.Bridge}
		for _, ip := range i.IPs {
			pi.Ips = append(pi.Ips, &networkv1.IPConfig{Address: ip.Address, Gateway: ip.Gateway})
		}
		p.Interfaces = append(p.Interfaces, pi)
	}
	for _, r := range a.Routes {
		p.Routes = append(p.Routes, &networkv1.Route{Destination: r.Destination, Gateway: r.Gateway})
	}
	return p
}

func attachmentFromProto(p *networkv1.NetworkAttachment) ports.NetworkAttachment {
	a := ports.NetworkAttachment{NetNSPath: p.NetnsPath, DNS: base.DNSFromProto(p.Dns)}
	for _, pi := range p.Interfaces {
		i := ports.NetworkInterface{Name: pi.Name, MAC: pi.Mac, MTU: int(pi.Mtu), Bridge: pi.Bridge}
		for _, ip := range pi.Ips {
			i.IPs = append(i.IPs, ports.IPConfig{Address: ip.Address, Gateway: ip.Gateway})
		}
		a.Interfaces = append(a.Interfaces, i)
	}
	for _, r := range p.Routes {
		a.Routes = append(a.Routes, ports.Route{Destination: r.Destination, Gateway: r.Gateway})
	}
	return a
}

// Client is a ports.Network served by a plugin.
type Client struct{ conn base.Conn }

// NewClient returns a network client over a plugin connection.
func NewClient(c base.Conn) *Client { return &Client{conn: c} }

func (c *Client) Ready(ctx context.Context) (ports.NetworkReadiness, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.NetworkReadiness{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := networkv1.NewNetworkClient(conn).Ready(ctx, &networkv1.ReadyRequest{})
	if err != nil {
		return ports.NetworkReadiness{}, c.conn.Error(err)
	}
	return ports.NetworkReadiness{Ready: resp.Ready, Reason: resp.Reason, Message: resp.Message}, nil
}

func (c *Client) Setup(ctx context.Context, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	resp, err := networkv1.NewNetworkClient(conn).Setup(ctx, requestToProto(req))
	if err != nil {
		return ports.NetworkAttachment{}, c.conn.Error(err)
	}
	return attachmentFromProto(resp), nil
}

func (c *Client) Teardown(ctx context.Context, req ports.NetworkRequest) error {
	conn, err := c.conn.GRPC()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = networkv1.NewNetworkClient(conn).Teardown(ctx, requestToProto(req))
	return c.conn.Error(err)
}

// Server serves a ports.Network over gRPC.
type Server struct {
	networkv1.UnimplementedNetworkServer
	impl ports.Network
}

func (s *Server) Ready(ctx context.Context, _ *networkv1.ReadyRequest) (*networkv1.ReadyResponse, error) {
	r, err := s.impl.Ready(ctx)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &networkv1.ReadyResponse{Ready: r.Ready, Reason: r.Reason, Message: r.Message}, nil
}

func (s *Server) Setup(ctx context.Context, p *networkv1.NetworkRequest) (*networkv1.NetworkAttachment, error) {
	a, err := s.impl.Setup(ctx, requestFromProto(p))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return attachmentToProto(a), nil
}

func (s *Server) Teardown(ctx context.Context, p *networkv1.NetworkRequest) (*networkv1.TeardownResponse, error) {
	return &networkv1.TeardownResponse{}, base.ToRPC(s.impl.Teardown(ctx, requestFromProto(p)))
}

var _ ports.Network = (*Client)(nil)
