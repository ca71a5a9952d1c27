package cri

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/ports"
)

// Exec, Attach and PortForward are checked against the core first (a
// stopped VM, an empty command, a pod without a VM fail here, at once),
// then answered with a single-use URL of the streaming server.

func (s *Server) streaming(call string) error {
	if s.streams == nil {
		return unsupported(call, "this daemon runs no streaming server")
	}
	return nil
}

func (s *Server) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if vmtools.IsCommand(req.Cmd) {
		return nil, &ports.InvalidError{Field: "cmd", Value: req.Cmd[0], Reason: "Virtlet's own commands are served on exec streams only",
			Allowed: "a streaming exec (kubectl exec, crictl exec without --sync), as virtletctl does"}
	}
	res, err := s.rt.ExecSync(ctx, req.ContainerId, req.Cmd, time.Duration(req.Timeout)*time.Second)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ExecSyncResponse{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode}, nil
}

func (s *Server) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	if err := s.streaming("Exec"); err != nil {
		return nil, err
	}
	if !vmtools.IsCommand(req.Cmd) {
		if err := s.rt.CheckExec(req.ContainerId, req.Cmd, req.Tty); err != nil {
			return nil, err
		}
	} else if _, err := s.rt.ContainerStatus(ctx, req.ContainerId); err != nil {
		return nil, err
	}
	return s.streams.GetExec(req)
}

func (s *Server) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	if err := s.streaming("Attach"); err != nil {
		return nil, err
	}
	if err := s.rt.CheckAttach(req.ContainerId); err != nil {
		return nil, err
	}
	return s.streams.GetAttach(req)
}

func (s *Server) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	if err := s.streaming("PortForward"); err != nil {
		return nil, err
	}
	for _, p := range req.Port {
		if p < 1 || p > 65535 {
			return nil, &ports.InvalidError{Field: "port", Value: fmt.Sprint(p), Allowed: "1 to 65535"}
		}
	}
	if err := s.rt.CheckPortForward(req.PodSandboxId); err != nil {
		return nil, err
	}
	return s.streams.GetPortForward(req)
}
