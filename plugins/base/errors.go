package base

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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
	st := status.New(codeOf(err), err.Error())
	var invalid *ports.InvalidError
	if errors.As(err, &invalid) {
		// Its fields cross as an ErrorInfo, so that the daemon's side can
		// tell which field and value were refused, not only read the text.
		if detailed, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: invalidFieldReason, Domain: errorDomain, Metadata: map[string]string{
			"field": invalid.Field, "value": invalid.Value, "allowed": invalid.Allowed, "reason": invalid.Reason,
		}}); derr == nil {
			st = detailed
		}
	}
	return st.Err()
}

// An InvalidError crosses the process boundary as a google.rpc.ErrorInfo
// of this reason and domain.
const (
	invalidFieldReason = "INVALID_FIELD"
	errorDomain        = "virtlet.cloud"
)

// remoteError is an error a plugin returned: its message, naming the
// plugin, and the port error it carries (errors.Is, errors.As).
type remoteError struct {
	msg   string
	cause error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.cause }

// invalidOf returns the InvalidError a status carries, if any.
func invalidOf(st *status.Status) *ports.InvalidError {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == invalidFieldReason && info.Domain == errorDomain {
			m := info.Metadata
			return &ports.InvalidError{Field: m["field"], Value: m["value"], Allowed: m["allowed"], Reason: m["reason"]}
		}
	}
	return nil
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
		if invalid := invalidOf(st); invalid != nil {
			return &remoteError{msg: fmt.Sprintf("plugin %s (%s): %s", plugin, kind, st.Message()), cause: invalid}
		}
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
	// The plugin's message ends with the sentinel's text when it wrapped
	// it (the usual case): it is said once.
	msg := strings.TrimSuffix(st.Message(), ": "+sentinel.Error())
	return fmt.Errorf("plugin %s (%s): %s: %w", plugin, kind, msg, sentinel)
}
