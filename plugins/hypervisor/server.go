package hypervisor

import (
	"context"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

// Adapter is what a hypervisor plugin implements.
type Adapter interface {
	ports.Hypervisor
	ports.Describer
}

// Register returns the function that adds the base and hypervisor services
// for impl to a plugin's gRPC server.
func Register(impl Adapter) func(*grpc.Server) {
	return func(s *grpc.Server) {
		basev1.RegisterPluginServer(s, &base.Server{Adapter: impl, Kind: ports.KindHypervisor})
		hypervisorv1.RegisterHypervisorServer(s, &Server{impl: impl})
	}
}

// Server serves a ports.Hypervisor over gRPC.
type Server struct {
	hypervisorv1.UnimplementedHypervisorServer
	impl ports.Hypervisor
}

// NewServer serves impl.
func NewServer(impl ports.Hypervisor) *Server { return &Server{impl: impl} }

func (s *Server) Capabilities(ctx context.Context, _ *hypervisorv1.CapabilitiesRequest) (*hypervisorv1.CapabilitiesResponse, error) {
	c, err := s.impl.Capabilities(ctx)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.CapabilitiesResponse{Name: c.Name, Version: c.Version, Accelerator: c.Accelerator, Details: c.Details}, nil
}

func (s *Server) Define(ctx context.Context, req *hypervisorv1.DefineRequest) (*hypervisorv1.DefineResponse, error) {
	return &hypervisorv1.DefineResponse{}, base.ToRPC(s.impl.Define(ctx, specFromProto(req.GetSpec())))
}

func (s *Server) Start(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.StartResponse, error) {
	return &hypervisorv1.StartResponse{}, base.ToRPC(s.impl.Start(ctx, req.Id))
}

func (s *Server) Stop(ctx context.Context, req *hypervisorv1.StopRequest) (*hypervisorv1.VMStatus, error) {
	st, err := s.impl.Stop(ctx, req.Id, time.Duration(req.TimeoutNanos))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return statusToProto(st), nil
}

func (s *Server) Undefine(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.UndefineResponse, error) {
	return &hypervisorv1.UndefineResponse{}, base.ToRPC(s.impl.Undefine(ctx, req.Id))
}

func (s *Server) Status(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VMStatus, error) {
	st, err := s.impl.Status(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return statusToProto(st), nil
}

func (s *Server) List(ctx context.Context, _ *hypervisorv1.ListRequest) (*hypervisorv1.ListResponse, error) {
	vms, err := s.impl.List(ctx)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	resp := &hypervisorv1.ListResponse{}
	for _, vm := range vms {
		resp.Vms = append(resp.Vms, statusToProto(vm))
	}
	return resp, nil
}

func (s *Server) ReopenLog(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.ReopenLogResponse, error) {
	return &hypervisorv1.ReopenLogResponse{}, base.ToRPC(s.impl.ReopenLog(ctx, req.Id))
}

func (s *Server) SetMemory(ctx context.Context, req *hypervisorv1.SetMemoryRequest) (*hypervisorv1.SetMemoryResponse, error) {
	return &hypervisorv1.SetMemoryResponse{}, base.ToRPC(s.impl.SetMemory(ctx, req.Id, req.MemoryBytes))
}

func (s *Server) SetCPULimits(ctx context.Context, req *hypervisorv1.SetCPULimitsRequest) (*hypervisorv1.SetCPULimitsResponse, error) {
	return &hypervisorv1.SetCPULimitsResponse{}, base.ToRPC(s.impl.SetCPULimits(ctx, req.Id, CPULimitsFromProto(req.GetLimits())))
}

func (s *Server) SetVCPUs(ctx context.Context, req *hypervisorv1.SetVCPUsRequest) (*hypervisorv1.SetVCPUsResponse, error) {
	return &hypervisorv1.SetVCPUsResponse{}, base.ToRPC(s.impl.SetVCPUs(ctx, req.Id, int(req.Vcpus)))
}

func (s *Server) WriteFiles(ctx context.Context, req *hypervisorv1.WriteFilesRequest) (*hypervisorv1.WriteFilesResponse, error) {
	files := make([]ports.GuestFile, 0, len(req.Files))
	for _, f := range req.Files {
		files = append(files, ports.GuestFile{Path: f.Path, Data: f.Data, Mode: os.FileMode(f.Mode), Source: f.Source})
	}
	return &hypervisorv1.WriteFilesResponse{}, base.ToRPC(s.impl.WriteFiles(ctx, req.Id, files))
}

func (s *Server) Watch(_ *hypervisorv1.WatchRequest, stream hypervisorv1.Hypervisor_WatchServer) error {
	ch, err := s.impl.Watch(stream.Context())
	if err != nil {
		return base.ToRPC(err)
	}
	// A status without an ID says the subscription stands: the client
	// returns only then, so that no change after its Watch is lost.
	if err := stream.Send(&hypervisorv1.VMStatus{}); err != nil {
		return err
	}
	for st := range ch {
		if err := stream.Send(statusToProto(st)); err != nil {
			return err
		}
	}
	return nil
}
