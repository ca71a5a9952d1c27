// Package volume carries ports.Volumes across the plugin boundary.
package volume

import (
	"context"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	volumev1 "github.com/virtlet/virtlet/proto/volume/v1"
)

// Adapter is what a volume plugin implements.
type Adapter interface {
	ports.Volumes
	ports.Describer
}

// Register adds the base and volume services for impl to a gRPC server.
func Register(impl Adapter) func(*grpc.Server) {
	return func(s *grpc.Server) {
		basev1.RegisterPluginServer(s, &base.Server{Adapter: impl, Kind: ports.KindVolume})
		volumev1.RegisterVolumesServer(s, &Server{impl: impl})
	}
}

func requestToProto(r ports.VolumeRequest) *volumev1.VolumeRequest {
	p := &volumev1.VolumeRequest{VmId: r.VMID, PodUid: r.PodUID, PodNamespace: r.PodNamespace, PodName: r.PodName, Name: r.Name,
		Type: r.Type, Options: r.Options, HostPath: r.HostPath, ReadOnly: r.ReadOnly, Chown: r.Chown, RunAs: base.IdentityToProto(r.RunAs)}
	if rf := r.Rootfs; rf != nil {
		p.Rootfs = &volumev1.RootfsRequest{ImagePath: rf.ImagePath, ImageFormat: rf.ImageFormat, ImageDigest: rf.ImageDigest,
			ImageName: rf.ImageName, ImageVirtualSize: rf.ImageVirtualSize, Reinitialize: rf.Reinitialize}
	}
	return p
}

func requestFromProto(p *volumev1.VolumeRequest) ports.VolumeRequest {
	r := ports.VolumeRequest{VMID: p.VmId, PodUID: p.PodUid, PodNamespace: p.PodNamespace, PodName: p.PodName, Name: p.Name,
		Type: p.Type, Options: p.Options, HostPath: p.HostPath, ReadOnly: p.ReadOnly, Chown: p.Chown, RunAs: base.IdentityFromProto(p.RunAs)}
	if rf := p.Rootfs; rf != nil {
		r.Rootfs = &ports.RootfsRequest{ImagePath: rf.ImagePath, ImageFormat: rf.ImageFormat, ImageDigest: rf.ImageDigest,
			ImageName: rf.ImageName, ImageVirtualSize: rf.ImageVirtualSize, Reinitialize: rf.Reinitialize}
	}
	return r
}

// Client is a ports.Volumes served by a plugin.
type Client struct{ conn base.Conn }

// NewClient returns a volume client over a plugin connection.
func NewClient(c base.Conn) *Client { return &Client{conn: c} }

// RootfsTypes asks the plugin on which of its types a flexvolume may hold
// the VM's persistent root (its PluginInfo), only when a pod asks for one.
func (c *Client) RootfsTypes(ctx context.Context) ([]string, error) {
	info, err := base.Info(ctx, c.conn)
	if err != nil {
		return nil, err
	}
	return info.RootfsTypes, nil
}

func (c *Client) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return nil, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := volumev1.NewVolumesClient(conn).Validate(ctx, requestToProto(req))
	if err != nil {
		return nil, c.conn.Error(err)
	}
	return resp.Options, nil
}

func (c *Client) Forget(ctx context.Context, req ports.VolumeRequest) error {
	conn, err := c.conn.GRPC()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	_, err = volumev1.NewVolumesClient(conn).Forget(ctx, requestToProto(req))
	return c.conn.Error(err)
}

func (c *Client) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	conn, err := c.conn.GRPC()
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	resp, err := volumev1.NewVolumesClient(conn).Prepare(ctx, requestToProto(req))
	if err != nil {
		return ports.VolumeAttachment{}, c.conn.Error(err)
	}
	return ports.VolumeAttachment{Disks: base.DisksFromProto(resp.Disks), Filesystems: base.FilesystemsFromProto(resp.Filesystems),
		Format: resp.Format, FormatUUID: resp.FormatUuid}, nil
}

func (c *Client) Release(ctx context.Context, req ports.VolumeRequest) error {
	conn, err := c.conn.GRPC()
	if err != nil {
		return err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	_, err = volumev1.NewVolumesClient(conn).Release(ctx, requestToProto(req))
	return c.conn.Error(err)
}

// Server serves a ports.Volumes over gRPC.
type Server struct {
	volumev1.UnimplementedVolumesServer
	impl ports.Volumes
}

func (s *Server) Validate(ctx context.Context, p *volumev1.VolumeRequest) (*volumev1.ValidateResponse, error) {
	opts, err := s.impl.Validate(ctx, requestFromProto(p))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &volumev1.ValidateResponse{Options: opts}, nil
}

func (s *Server) Forget(ctx context.Context, p *volumev1.VolumeRequest) (*volumev1.ForgetResponse, error) {
	return &volumev1.ForgetResponse{}, base.ToRPC(s.impl.Forget(ctx, requestFromProto(p)))
}

func (s *Server) Prepare(ctx context.Context, p *volumev1.VolumeRequest) (*volumev1.VolumeAttachment, error) {
	att, err := s.impl.Prepare(ctx, requestFromProto(p))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &volumev1.VolumeAttachment{Disks: base.DisksToProto(att.Disks), Filesystems: base.FilesystemsToProto(att.Filesystems),
		Format: att.Format, FormatUuid: att.FormatUUID}, nil
}

func (s *Server) Release(ctx context.Context, p *volumev1.VolumeRequest) (*volumev1.ReleaseResponse, error) {
	return &volumev1.ReleaseResponse{}, base.ToRPC(s.impl.Release(ctx, requestFromProto(p)))
}

var (
	_ ports.Volumes      = (*Client)(nil)
	_ ports.RootfsHolder = (*Client)(nil)
)
