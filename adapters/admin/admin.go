// Package admin is the daemon's local admin API (proto/admin/v1): an
// inbound adapter, like the CRI server, for the node's own tools. The
// flexvolume driver asks it to validate a volume's options when kubelet
// mounts the volume, so that a new volume type needs a plugin only, never
// a new driver. It listens on a unix socket only root may open.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/virtlet/virtlet/adapters/internal/rpcguard"
	"github.com/virtlet/virtlet/adapters/internal/unixsock"
	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	adminv1 "github.com/virtlet/virtlet/proto/admin/v1"
)

// DefaultSocket is where the daemon serves the admin API by default.
const DefaultSocket = "/run/virtlet/admin.sock"

// Runtime is what the admin API asks of the core.
type Runtime interface {
	ValidateVolume(ctx context.Context, fv ports.FlexvolumeOptions) (map[string]string, error)
	ForgetVolume(ctx context.Context, fv ports.FlexvolumeOptions) error
}

// Server serves the admin API over a runtime.
type Server struct {
	adminv1.UnimplementedAdminServer
	rt      Runtime
	version string
	log     logrus.FieldLogger
	plugins func() []PluginState
}

// PluginState is a plugin as its supervisor sees it.
type PluginState struct {
	Name, Kind, State string
	PID, Restarts     int
	LastError         string
}

// Status is what the admin API's Status reports.
type Status struct {
	Goroutines int
	Plugins    []PluginState
}

// WithPlugins makes Status report the plugins that plugins lists.
func (s *Server) WithPlugins(plugins func() []PluginState) *Server {
	s.plugins = plugins
	return s
}

// NewServer returns an admin server.
func NewServer(rt Runtime, version string, log logrus.FieldLogger) *Server {
	return &Server{rt: rt, version: version, log: log}
}

// GRPCServer returns a gRPC server with the admin service, logging every
// call (never the options, which may be secret) and mapping error kinds to
// gRPC codes.
func (s *Server) GRPCServer() *grpc.Server {
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(s.instrument, rpcguard.Unary(s.log)))
	adminv1.RegisterAdminServer(g, s)
	return g
}

func (s *Server) instrument(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	fields := logrus.Fields{"method": path.Base(info.FullMethod), "duration": time.Since(start).Round(time.Microsecond)}
	if r, ok := req.(*adminv1.FlexvolumeRequest); ok {
		fields["pod"] = r.PodNamespace + "/" + r.PodName
		fields["volume"] = r.Volume
		fields["type"] = r.Options["type"]
	}
	if err != nil {
		s.log.WithFields(fields).WithError(err).Warn("admin call failed")
		return nil, base.ToRPC(err)
	}
	s.log.WithFields(fields).Info("admin call")
	return resp, nil
}

// Listen opens the admin socket, mode 0600.
func Listen(socket string) (net.Listener, error) { return unixsock.Listen(socket, 0o600) }

func (s *Server) Version(ctx context.Context, _ *adminv1.VersionRequest) (*adminv1.VersionResponse, error) {
	return &adminv1.VersionResponse{Version: s.version}, nil
}

// Status reports the plugins and the goroutine count; it asks no plugin.
func (s *Server) Status(ctx context.Context, _ *adminv1.StatusRequest) (*adminv1.StatusResponse, error) {
	resp := &adminv1.StatusResponse{Goroutines: int64(runtime.NumGoroutine())}
	if s.plugins != nil {
		for _, p := range s.plugins() {
			resp.Plugins = append(resp.Plugins, &adminv1.PluginStatus{Name: p.Name, Kind: p.Kind, State: p.State,
				Pid: int64(p.PID), Restarts: int64(p.Restarts), LastError: p.LastError})
		}
	}
	return resp, nil
}

func flexvolume(r *adminv1.FlexvolumeRequest) ports.FlexvolumeOptions {
	return ports.FlexvolumeOptions{PodUID: r.PodUid, PodNamespace: r.PodNamespace, PodName: r.PodName, Volume: r.Volume, Options: r.Options}
}

func (s *Server) ValidateVolume(ctx context.Context, r *adminv1.FlexvolumeRequest) (*adminv1.ValidateVolumeResponse, error) {
	kept, err := s.rt.ValidateVolume(ctx, flexvolume(r))
	if err != nil {
		return nil, err
	}
	return &adminv1.ValidateVolumeResponse{Options: kept}, nil
}

func (s *Server) ForgetVolume(ctx context.Context, r *adminv1.FlexvolumeRequest) (*adminv1.ForgetVolumeResponse, error) {
	return &adminv1.ForgetVolumeResponse{}, s.rt.ForgetVolume(ctx, flexvolume(r))
}

// Client talks to a daemon's admin API.
type Client struct {
	conn *grpc.ClientConn
	api  adminv1.AdminClient
}

// Dial connects to the admin socket (the connection is made lazily; calls
// fail at once when nothing listens).
func Dial(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", socket, err)
	}
	return &Client{conn: conn, api: adminv1.NewAdminClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

func toProto(fv ports.FlexvolumeOptions) *adminv1.FlexvolumeRequest {
	return &adminv1.FlexvolumeRequest{PodUid: fv.PodUID, PodNamespace: fv.PodNamespace, PodName: fv.PodName, Volume: fv.Volume, Options: fv.Options}
}

// ValidateVolume asks the daemon to check a flexvolume's options.
func (c *Client) ValidateVolume(ctx context.Context, fv ports.FlexvolumeOptions) (map[string]string, error) {
	resp, err := c.api.ValidateVolume(ctx, toProto(fv))
	if err != nil {
		return nil, clientError(err)
	}
	return resp.Options, nil
}

// ForgetVolume tells the daemon a flexvolume is unmounted.
func (c *Client) ForgetVolume(ctx context.Context, fv ports.FlexvolumeOptions) error {
	_, err := c.api.ForgetVolume(ctx, toProto(fv))
	return clientError(err)
}

// Version asks the daemon's version.
func (c *Client) Version(ctx context.Context) (string, error) {
	resp, err := c.api.Version(ctx, &adminv1.VersionRequest{})
	if err != nil {
		return "", clientError(err)
	}
	return resp.Version, nil
}

// Status asks the daemon for its plugins' states and goroutine count.
func (c *Client) Status(ctx context.Context) (Status, error) {
	resp, err := c.api.Status(ctx, &adminv1.StatusRequest{})
	if err != nil {
		return Status{}, clientError(err)
	}
	st := Status{Goroutines: int(resp.Goroutines)}
	for _, p := range resp.Plugins {
		st.Plugins = append(st.Plugins, PluginState{Name: p.Name, Kind: p.Kind, State: p.State,
			PID: int(p.Pid), Restarts: int(p.Restarts), LastError: p.LastError})
	}
	return st, nil
}

// ErrDaemonUnreachable: nothing answers on the admin socket.
var ErrDaemonUnreachable = errors.New("the virtlet daemon does not answer on its admin socket (is it running?)")

// clientError keeps the daemon's message, which names the field at fault.
func clientError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	switch {
	case !ok:
		return err
	case st.Code() == codes.Unavailable:
		return fmt.Errorf("%w: %s", ErrDaemonUnreachable, st.Message())
	default:
		return errors.New(st.Message())
	}
}

var _ Runtime = (*Client)(nil)
