// Package network carries ports.Network across the plugin boundary.
package network

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	networkv1 "github.com/virtlet/virtlet/proto/network/v1"
	typesv1 "github.com/virtlet/virtlet/proto/types/v1"
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
	return base.AttachmentFromProto(resp), nil
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

// AdoptMACs asks the plugin to serve the pod's interfaces under macs.
func (c *Client) AdoptMACs(ctx context.Context, req ports.NetworkRequest, macs []string) (ports.NetworkAttachment, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := networkv1.NewNetworkClient(conn).AdoptMACs(ctx, &networkv1.AdoptMACsRequest{Pod: requestToProto(req), Macs: macs})
	if err != nil {
		return ports.NetworkAttachment{}, c.conn.Error(err)
	}
	return base.AttachmentFromProto(resp), nil
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

func (s *Server) Setup(ctx context.Context, p *networkv1.NetworkRequest) (*typesv1.NetworkAttachment, error) {
	a, err := s.impl.Setup(ctx, requestFromProto(p))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return base.AttachmentToProto(a), nil
}

func (s *Server) Teardown(ctx context.Context, p *networkv1.NetworkRequest) (*networkv1.TeardownResponse, error) {
	return &networkv1.TeardownResponse{}, base.ToRPC(s.impl.Teardown(ctx, requestFromProto(p)))
}

func (s *Server) AdoptMACs(ctx context.Context, p *networkv1.AdoptMACsRequest) (*typesv1.NetworkAttachment, error) {
	a, ok := s.impl.(ports.MACAdopter)
	if !ok {
		return nil, base.ToRPC(fmt.Errorf("this network plugin cannot serve a pod's interfaces under other MACs: %w", ports.ErrUnimplemented))
	}
	att, err := a.AdoptMACs(ctx, requestFromProto(p.GetPod()), p.Macs)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return base.AttachmentToProto(att), nil
}

var (
	_ ports.Network    = (*Client)(nil)
	_ ports.MACAdopter = (*Client)(nil)
)
