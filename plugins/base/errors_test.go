package base_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
)

func TestErrorsCrossTheBoundaryWithTheirKind(t *testing.T) {
	for _, tt := range []struct {
		err  error
		kind error
	}{
		{fmt.Errorf("vm x: %w", ports.ErrNotFound), ports.ErrNotFound},
		{fmt.Errorf("vm x: %w", ports.ErrAlreadyExists), ports.ErrAlreadyExists},
		{&ports.InvalidError{Field: "volume size", Value: "-1", Allowed: "bytes"}, ports.ErrInvalidArgument},
		{fmt.Errorf("busy: %w", ports.ErrFailedPrecondition), ports.ErrFailedPrecondition},
		{fmt.Errorf("libvirtd down: %w", ports.ErrUnavailable), ports.ErrUnavailable},
		{fmt.Errorf("exec: %w", ports.ErrUnimplemented), ports.ErrUnimplemented},
		{context.DeadlineExceeded, context.DeadlineExceeded},
	} {
		got := base.FromRPC(base.ToRPC(tt.err), "p", ports.KindVolume)
		if !errors.Is(got, tt.kind) {
			t.Errorf("%v came back as %v", tt.err, got)
		}
		if !strings.Contains(got.Error(), "plugin p (volume)") || !strings.Contains(got.Error(), strings.SplitN(tt.err.Error(), ":", 2)[0]) {
			t.Errorf("message %q lost the plugin name or the original message %q", got, tt.err)
		}
	}
	// The kind is said once, not once by the plugin and again here.
	if got := base.FromRPC(base.ToRPC(fmt.Errorf("busy: %w", ports.ErrFailedPrecondition)), "p", ports.KindVolume); got.Error() != "plugin p (volume): busy: failed precondition" {
		t.Errorf("a wrapped kind: %q", got)
	}
	plain := base.FromRPC(base.ToRPC(errors.New("disk on fire")), "p", ports.KindVolume)
	if plain.Error() != "plugin p (volume): disk on fire" {
		t.Errorf("plain error: %q", plain)
	}
	if base.ToRPC(nil) != nil || base.FromRPC(nil, "p", ports.KindVolume) != nil {
		t.Error("nil errors must stay nil")
	}
}

// An InvalidError keeps its fields across the boundary (as a
// google.rpc.ErrorInfo in the status, marshalled as on the wire), and its
// text as the plugin wrote it.
func TestInvalidErrorKeepsItsFields(t *testing.T) {
	sent := &ports.InvalidError{Field: "libvirt config accelerator", Value: "hvf", Allowed: "auto, kvm or tcg", Reason: "not on Linux"}
	wrapped := fmt.Errorf("libvirt: %w", sent)
	st, _ := status.FromError(base.ToRPC(wrapped))
	wire, err := proto.Marshal(st.Proto())
	if err != nil {
		t.Fatal(err)
	}
	var back spb.Status
	if err := proto.Unmarshal(wire, &back); err != nil {
		t.Fatal(err)
	}
	got := base.FromRPC(status.ErrorProto(&back), "libvirt", ports.KindHypervisor)
	var invalid *ports.InvalidError
	if !errors.As(got, &invalid) {
		t.Fatalf("%v: no InvalidError on the daemon's side", got)
	}
	if *invalid != *sent {
		t.Errorf("fields came back as %+v, want %+v", *invalid, *sent)
	}
	if !errors.Is(got, ports.ErrInvalidArgument) {
		t.Errorf("%v is not an invalid argument", got)
	}
	if want := "plugin libvirt (hypervisor): " + wrapped.Error(); got.Error() != want {
		t.Errorf("message %q, want %q", got, want)
	}
}
