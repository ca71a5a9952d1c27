// Package datasource carries ports.Datasource across the plugin boundary.
package datasource

import (
	"context"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	datasourcev1 "github.com/virtlet/virtlet/proto/datasource/v1"
	typesv1 "github.com/virtlet/virtlet/proto/types/v1"
)

// Adapter is what a datasource plugin implements.
type Adapter interface {
	ports.Datasource
	ports.Describer
}

// Register adds the base and datasource services for impl to a gRPC server.
func Register(impl Adapter) func(*grpc.Server) {
	return func(s *grpc.Server) {
		basev1.RegisterPluginServer(s, &base.Server{Adapter: impl, Kind: ports.KindDatasource})
		datasourcev1.RegisterDatasourceServer(s, &Server{impl: impl})
	}
}

// Client is a ports.Datasource served by a plugin.
type Client struct{ conn base.Conn }

// NewClient returns a datasource client over a plugin connection.
func NewClient(c base.Conn) *Client { return &Client{conn: c} }

func (c *Client) BuildMedia(ctx context.Context, req ports.MediaRequest) (ports.Disk, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.Disk{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	p := &datasourcev1.MediaRequest{
		VmId: req.VMID, Datasource: req.Datasource, MetaData: req.MetaData, UserData: req.UserData, NetworkConfig: req.NetworkConfig,
	}
	if req.Network != nil {
		p.Network = base.AttachmentToProto(*req.Network)
	}
	resp, err := datasourcev1.NewDatasourceClient(conn).BuildMedia(ctx, p)
	if err != nil {
		return ports.Disk{}, c.conn.Error(err)
	}
	return base.DiskFromProto(resp), nil
}

func (c *Client) RemoveMedia(ctx context.Context, vmID string) error {
	conn, err := c.conn.GRPC()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = datasourcev1.NewDatasourceClient(conn).RemoveMedia(ctx, &datasourcev1.RemoveMediaRequest{VmId: vmID})
	return c.conn.Error(err)
}

// Server serves a ports.Datasource over gRPC.
type Server struct {
	datasourcev1.UnimplementedDatasourceServer
	impl ports.Datasource
}

func (s *Server) BuildMedia(ctx context.Context, p *datasourcev1.MediaRequest) (*typesv1.Disk, error) {
	req := ports.MediaRequest{
		VMID: p.VmId, Datasource: p.Datasource, MetaData: p.MetaData, UserData: p.UserData, NetworkConfig: p.NetworkConfig,
	}
	if p.Network != nil {
		att := base.AttachmentFromProto(p.Network)
		req.Network = &att
	}
	d, err := s.impl.BuildMedia(ctx, req)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return base.DiskToProto(d), nil
}

func (s *Server) RemoveMedia(ctx context.Context, p *datasourcev1.RemoveMediaRequest) (*datasourcev1.RemoveMediaResponse, error) {
	return &datasourcev1.RemoveMediaResponse{}, base.ToRPC(s.impl.RemoveMedia(ctx, p.VmId))
}

var _ ports.Datasource = (*Client)(nil)
