package core

import (
	"context"

	"github.com/virtlet/virtlet/ports"
)

// Condition is one readiness condition of the runtime.
type Condition struct {
	Ready   bool
	Reason  string
	Message string
}

// RuntimeStatus is the readiness of the runtime and of the pod network.
type RuntimeStatus struct {
	Runtime    Condition
	Network    Condition
	Hypervisor ports.HypervisorCapabilities
}

// Status probes the hypervisor and the network through their ports: the
// runtime is ready when the hypervisor answers and the records have been
// reconciled with it; the network when a network plugin says so.
func (r *Runtime) Status(ctx context.Context) RuntimeStatus {
	ctx, cancel := context.WithTimeout(ctx, r.opts.ProbeTimeout)
	defer cancel()
	var st RuntimeStatus
	caps, err := r.deps.Hypervisor.Capabilities(ctx)
	switch {
	case err != nil:
		st.Runtime = Condition{Reason: "HypervisorUnavailable", Message: err.Error()}
	case !r.Synced():
		st.Runtime = Condition{Reason: "Reconciling", Message: "reconciling records with the hypervisor"}
	default:
		st.Runtime = Condition{Ready: true}
		st.Hypervisor = caps
	}
	if r.deps.Network == nil {
		st.Network = Condition{Reason: "NoNetworkPlugin", Message: "no network plugin is configured: VM pods get no pod IP"}
		return st
	}
	nr, err := r.deps.Network.Ready(ctx)
	switch {
	case err != nil:
		st.Network = Condition{Reason: "NetworkPluginUnavailable", Message: err.Error()}
	default:
		st.Network = Condition{Ready: nr.Ready, Reason: nr.Reason, Message: nr.Message}
	}
	return st
}

// Synced reports whether the records have been reconciled with the
// hypervisor since start.
func (r *reconciler) Synced() bool {
	select {
	case <-r.synced:
		return true
	default:
		return false
	}
}
