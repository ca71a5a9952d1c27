package base

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtlet/virtlet/ports"
)

// ToRPC turns an adapter's error into a gRPC status on the plugin side,
// keeping its kind (not found, invalid, ...) and its message.
func ToRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && errors.Unwrap(err) == nil {
		return err // already a status
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, ports.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ports.ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, ports.ErrInvalidArgument):
		return codes.InvalidArgument
	case errors.Is(err, ports.ErrFailedPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, ports.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, ports.ErrUnimplemented):
		return codes.Unimplemented
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	default:
		return codes.Unknown
	}
}

// FromRPC turns a gRPC error from a plugin back into a port error on the
// daemon side: the same kind, the plugin's message, and the plugin's name.
func FromRPC(err error, plugin string, kind ports.PluginKind) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("plugin %s (%s): %w", plugin, kind, err)
	}
	var sentinel error
	switch st.Code() {
	case codes.NotFound:
		sentinel = ports.ErrNotFound
	case codes.AlreadyExists:
		sentinel = ports.ErrAlreadyExists
	case codes.InvalidArgument:
		sentinel = ports.ErrInvalidArgument
	case codes.FailedPrecondition:
		sentinel = ports.ErrFailedPrecondition
	case codes.Unimplemented:
		sentinel = ports.ErrUnimplemented
	case codes.DeadlineExceeded:
		sentinel = context.DeadlineExceeded
	case codes.Canceled:
		sentinel = context.Canceled
	case codes.Unavailable:
		return &ports.UnavailableError{Plugin: plugin, Kind: kind, Reason: st.Message()}
	default:
		return fmt.Errorf("plugin %s (%s): %s", plugin, kind, st.Message())
	}
	return fmt.Errorf("plugin %s (%s): %s: %w", plugin, kind, st.Message(), sentinel)
}
