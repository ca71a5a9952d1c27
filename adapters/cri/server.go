// Package cri is the inbound adapter kubelet talks to: the CRI v1
// RuntimeService and ImageService on a unix socket. It converts CRI
// requests into core calls and core results into CRI replies, and holds no
// business logic: every decision is the core's.
package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/internal/rpcguard"
	"github.com/virtlet/virtlet/adapters/internal/unixsock"
	"github.com/virtlet/virtlet/core"
)

// Info is what the server reports about the daemon.
type Info struct {
	// Version is the daemon's build version.
	Version string
	// Plugins, if set, describes the plugins for verbose Status replies.
	Plugins func() interface{}
	// CgroupDriver is "systemd" or "cgroupfs": the driver kubelet must use
	// for pod cgroups (RuntimeConfig).
	CgroupDriver string
}

// Server implements the CRI RuntimeService and ImageService over the core.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	rt      *core.Runtime
	info    Info
	log     logrus.FieldLogger
	streams StreamURLs
	observe CallObserver

	sandboxWire, containerWire wireCache
}

// New returns a CRI server for rt.
func New(rt *core.Runtime, info Info, log logrus.FieldLogger) *Server {
	return &Server{rt: rt, info: info, log: log}
}

// StreamURLs hands out the single-use URLs of the streaming server that
// serves Exec, Attach and PortForward (kubelet connects to them).
type StreamURLs interface {
	GetExec(*runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error)
	GetAttach(*runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error)
	GetPortForward(*runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error)
}

// WithStreaming makes the server answer Exec, Attach and PortForward with
// URLs of streams.
func (s *Server) WithStreaming(streams StreamURLs) *Server {
	s.streams = streams
	return s
}

// Services is what the CRI socket serves: the Server itself, or a router
// in front of it that forwards some calls elsewhere.
type Services interface {
	runtimeapi.RuntimeServiceServer
	runtimeapi.ImageServiceServer
}

// GRPCServer returns a gRPC server with both CRI services registered and
// every call instrumented.
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	return s.GRPCServerFor(s, opts...)
}

// GRPCServerFor is GRPCServer serving svc (a router in front of s): every
// call is still logged and its error converted by s.
func (s *Server) GRPCServerFor(svc Services, opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.ChainUnaryInterceptor(s.instrument, rpcguard.Unary(s.log)),
		grpc.ChainStreamInterceptor(rpcguard.Stream(s.log)),
		grpc.MaxRecvMsgSize(16<<20), grpc.MaxSendMsgSize(16<<20),
	)
	g := grpc.NewServer(opts...)
	runtimeapi.RegisterRuntimeServiceServer(g, svc)
	runtimeapi.RegisterImageServiceServer(g, svc)
	return g
}

// Listen opens the CRI socket of endpoint (unix:///path or a path) with
// mode 0660. A stale socket is replaced; one another daemon still serves
// is not.
func Listen(endpoint string) (net.Listener, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if strings.Contains(path, "://") {
		return nil, fmt.Errorf("listen %s: only unix:// endpoints are supported", endpoint)
	}
	return unixsock.Listen(path, 0o660)
}

// ServeUntil serves on l until ctx ends, then stops gracefully (bounded).
func ServeUntil(ctx context.Context, g *grpc.Server, l net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		g.Stop()
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
