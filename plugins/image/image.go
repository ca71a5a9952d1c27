// Package image carries ports.ImageSource across the plugin boundary.
package image

import (
	"context"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	imagev1 "github.com/virtlet/virtlet/proto/image/v1"
)

// Adapter is what an image plugin implements.
type Adapter interface {
	ports.ImageSource
	ports.Describer
}

// Register adds the base and image services for impl to a gRPC server.
func Register(impl Adapter) func(*grpc.Server) {
	return func(s *grpc.Server) {
		basev1.RegisterPluginServer(s, &base.Server{Adapter: impl, Kind: ports.KindImage})
		imagev1.RegisterImageSourceServer(s, &Server{impl: impl})
	}
}

// Client is a ports.ImageSource served by a plugin.
type Client struct{ conn base.Conn }

// NewClient returns an image source client over a plugin connection.
func NewClient(c base.Conn) *Client { return &Client{conn: c} }

func (c *Client) Fetch(ctx context.Context, req ports.FetchRequest) (ports.FetchResult, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.FetchResult{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.FetchTimeout)
	defer cancel()
	preq := &imagev1.FetchRequest{
		Name: req.Name, Location: req.Location, Transport: req.Transport, TransportConfigJson: req.TransportConfig,
		Dest: req.Dest, ExpectedDigest: req.ExpectedDigest, MaxBytes: req.MaxBytes, KeepFreeBytes: req.KeepFreeBytes,
	}
	if a := req.Auth; a != nil {
		preq.Auth = &imagev1.RegistryAuth{Username: a.Username, Password: a.Password, Auth: a.Auth,
			ServerAddress: a.ServerAddress, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	resp, err := imagev1.NewImageSourceClient(conn).Fetch(ctx, preq)
	if err != nil {
		return ports.FetchResult{}, c.conn.Error(err)
	}
	return ports.FetchResult{Digest: resp.Digest, Size: resp.Size, Format: resp.Format, VirtualSize: resp.VirtualSize,
		ManifestDigest: resp.ManifestDigest}, nil
}

// Server serves a ports.ImageSource over gRPC.
type Server struct {
	imagev1.UnimplementedImageSourceServer
	impl ports.ImageSource
}

func (s *Server) Fetch(ctx context.Context, p *imagev1.FetchRequest) (*imagev1.FetchResponse, error) {
	req := ports.FetchRequest{
		Name: p.Name, Location: p.Location, Transport: p.Transport, TransportConfig: p.TransportConfigJson,
		Dest: p.Dest, ExpectedDigest: p.ExpectedDigest, MaxBytes: p.MaxBytes, KeepFreeBytes: p.KeepFreeBytes,
	}
	if a := p.Auth; a != nil {
		req.Auth = &ports.RegistryAuth{Username: a.Username, Password: a.Password, Auth: a.Auth,
			ServerAddress: a.ServerAddress, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	res, err := s.impl.Fetch(ctx, req)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &imagev1.FetchResponse{Digest: res.Digest, Size: res.Size, Format: res.Format, VirtualSize: res.VirtualSize,
		ManifestDigest: res.ManifestDigest}, nil
}

var _ ports.ImageSource = (*Client)(nil)
