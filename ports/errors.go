package ports

import (
	"errors"
	"fmt"
)

// Error kinds shared by the core, the adapters and the plugin transport.
// Code wraps them with context (fmt.Errorf("...: %w", err)); the CRI edge and
// the plugin transport map them to gRPC codes in exactly one place each.
var (
	// ErrNotFound: the object named by the caller does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the object exists and the call would create it again.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the caller's input is wrong; retrying will not help.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the system is not in a state that allows the call.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable: a dependency (usually a plugin) cannot serve the call
	// now; retrying later may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnimplemented: the feature is not (yet) provided.
	ErrUnimplemented = errors.New("not implemented")
)

// InvalidError describes a bad input value: which field (an annotation name,
// a manifest field, a CRI field), the value given and what is allowed.
type InvalidError struct {
	Field   string // e.g. "annotation VirtletVCPUCount"
	Value   string // the offending value, verbatim (never a secret)
	Allowed string // what would have been accepted
	Reason  string // optional detail, e.g. a parser error
}

func (e *InvalidError) Error() string {
	msg := e.Field
	if e.Value != "" {
		msg += fmt.Sprintf(": invalid value %q", e.Value)
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Allowed != "" {
		msg += " (allowed: " + e.Allowed + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrInvalidArgument) hold for every InvalidError.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalidArgument }

// Invalid builds an InvalidError.
func Invalid(field, value, allowed string) *InvalidError {
	return &InvalidError{Field: field, Value: value, Allowed: allowed}
}

// UnavailableError says that a plugin cannot serve calls right now.
type UnavailableError struct {
	Plugin string     // manifest name
	Kind   PluginKind // plugin kind
	Reason string     // e.g. "restarting after exit (attempt 3)"
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("plugin %s (%s) is unavailable: %s", e.Plugin, e.Kind, e.Reason)
}

// Is makes errors.Is(err, ErrUnavailable) hold for every UnavailableError.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }
