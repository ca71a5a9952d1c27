package cri

import (
	"context"
	"errors"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// What a router in front of the server (a node that forwards container pods
// to a container runtime) asks to route a call: whose pod, container or
// image it is. Every answer comes from the core's own records, so it holds
// across daemon restarts without a routing table of its own.

// ClaimsPod tells whether RunPodSandbox of config belongs to Virtlet.
func (s *Server) ClaimsPod(config *runtimeapi.PodSandboxConfig, handler string) bool {
	return core.ClaimsPod(config.GetAnnotations(), handler)
}

// OwnsSandbox tells whether id (or an ID prefix) names one of Virtlet's pods.
// An ambiguous prefix counts as Virtlet's, which then explains the error.
func (s *Server) OwnsSandbox(id string) bool {
	_, err := s.rt.SandboxStatus(context.Background(), id)
	return !errors.Is(err, ports.ErrNotFound)
}

// OwnsContainer tells whether id (or an ID prefix) names one of Virtlet's
// containers (VMs).
func (s *Server) OwnsContainer(id string) bool {
	_, err := s.rt.ContainerStatus(context.Background(), id)
	return !errors.Is(err, ports.ErrNotFound)
}

// OwnsImage tells whether image (a name or an image ID) is a VM image:
// names start with virtlet.cloud/, IDs are looked up.
func (s *Server) OwnsImage(ctx context.Context, image string) bool {
	if core.IsVMImageName(image) {
		return true
	}
	_, err := s.rt.ImageStatus(ctx, image)
	return err == nil
}

// forwardedKey marks a call's context for instrument: routers note there
// which runtime served the call.
type forwardedKey struct{}

// NoteForwarded records, for the call's log line, that runtime (not
// Virtlet) served the call of ctx.
func NoteForwarded(ctx context.Context, runtime string) {
	if p, ok := ctx.Value(forwardedKey{}).(*string); ok {
		*p = runtime
	}
}
