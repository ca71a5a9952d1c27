package core

import (
	"context"
	"errors"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Observation: the core reports what it measures to Deps.Observer, a port
// like any other (the daemon's metrics adapter implements it); the core
// never imports a metrics library. Counts answers the scrapes that read the
// records themselves.

// phaseDone reports a phase that succeeded, begun at start.
func (r *shared) phaseDone(p ports.VMPhase, start time.Time) {
	if o := r.deps.Observer; o != nil {
		o.VMPhase(p, time.Since(start))
	}
}

// pathPhase names a step by the path the VM took: cold, or claimed from
// the hypervisor's pool of pre-launched VMs (prelaunched).
func pathPhase(prelaunched bool, cold, pooled ports.VMPhase) ports.VMPhase {
	if prelaunched {
		return pooled
	}
	return cold
}

// pulled reports a pull's outcome.
func (r *shared) pulled(p ports.ImagePull) {
	if o := r.deps.Observer; o != nil {
		o.ImagePull(p)
	}
}

// pullFailure classes err, a pull's failure; otherwise is the class of an
// error of no known kind.
func pullFailure(err error, otherwise ports.PullFailure) ports.PullFailure {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ports.PullTimeout
	case errors.Is(err, context.Canceled):
		return ports.PullCanceled
	case errors.Is(err, ports.ErrNotFound):
		return ports.PullNotFound
	case errors.Is(err, ports.ErrUnavailable):
		return ports.PullUnavailable
	}
	return otherwise
}

// Counts is how many records the runtime holds in each state, the
// in-progress ones (pending sandboxes, creating containers) included.
type Counts struct {
	Sandboxes  map[SandboxState]int
	Containers map[ContainerState]int
	// HaltedVMs counts the running containers whose VM is halted.
	HaltedVMs int
}

// SandboxStates and ContainerStates list every state, so that a count of
// zero can be told from an unknown state.
var (
	SandboxStates   = []SandboxState{SandboxPending, SandboxReady, SandboxNotReady}
	ContainerStates = []ContainerState{ContainerCreating, ContainerCreated, ContainerRunning, ContainerExited, ContainerUnknown}
)

// Counts counts the records in memory: no plugin is asked.
func (r *Runtime) Counts() Counts {
	c := Counts{Sandboxes: map[SandboxState]int{}, Containers: map[ContainerState]int{}}
	for _, sb := range r.sandboxes.list(nil) {
		c.Sandboxes[sb.State]++
	}
	for _, ct := range r.containers.list(nil) {
		c.Containers[ct.State]++
		if ct.Halted() {
			c.HaltedVMs++
		}
	}
	return c
}
