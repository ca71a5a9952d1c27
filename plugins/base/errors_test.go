package base_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
	plain := base.FromRPC(base.ToRPC(errors.New("disk on fire")), "p", ports.KindVolume)
	if plain.Error() != "plugin p (volume): disk on fire" {
		t.Errorf("plain error: %q", plain)
	}
	if base.ToRPC(nil) != nil || base.FromRPC(nil, "p", ports.KindVolume) != nil {
		t.Error("nil errors must stay nil")
	}
}
