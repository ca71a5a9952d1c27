package cri

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/internal/rpcguard"
	"github.com/virtlet/virtlet/ports"
)

// The observer hears every call once, with the code the client gets: core
// error kinds mapped, a panic as Internal, a forwarded call marked.
func TestCallObserverHearsEveryCallWithItsCode(t *testing.T) {
	s := newServer(t)
	type heard struct {
		method    string
		code      codes.Code
		forwarded bool
	}
	var calls []heard
	s.WithCallObserver(func(method string, code codes.Code, forwarded bool, took time.Duration) {
		if took <= 0 {
			t.Errorf("%s took %s", method, took)
		}
		calls = append(calls, heard{method, code, forwarded})
	})
	guard := rpcguard.Unary(s.log)
	for _, tt := range []struct {
		method  string
		handler grpc.UnaryHandler
		want    heard
	}{
		{"RunPodSandbox", func(ctx context.Context, req interface{}) (interface{}, error) {
			time.Sleep(time.Millisecond)
			return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "x"}, nil
		}, heard{"RunPodSandbox", codes.OK, false}},
		{"StopContainer", func(ctx context.Context, req interface{}) (interface{}, error) {
			return nil, fmt.Errorf("container x: %w", ports.ErrNotFound)
		}, heard{"StopContainer", codes.NotFound, false}},
		{"StartContainer", func(ctx context.Context, req interface{}) (interface{}, error) {
			panic("a bug")
		}, heard{"StartContainer", codes.Internal, false}},
		{"ListContainers", func(ctx context.Context, req interface{}) (interface{}, error) {
			NoteForwarded(ctx, "unix:///run/containerd/containerd.sock")
			return &runtimeapi.ListContainersResponse{}, nil
		}, heard{"ListContainers", codes.OK, true}},
	} {
		info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.RuntimeService/" + tt.method}
		s.instrument(context.Background(), &runtimeapi.StopContainerRequest{}, info, func(ctx context.Context, req interface{}) (interface{}, error) {
			return guard(ctx, req, info, tt.handler)
		})
		if len(calls) == 0 || calls[len(calls)-1] != tt.want {
			t.Errorf("%s: heard %+v, want %+v last", tt.method, calls, tt.want)
		}
	}
	if len(calls) != 4 {
		t.Errorf("heard %d calls, want 4", len(calls))
	}
}
