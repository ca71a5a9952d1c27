package core

import (
	"context"
	"fmt"

	"github.com/virtlet/virtlet/ports"
)

// Diagnosis is what the runtime and the hypervisor know of one VM pod, for
// `virtletctl diag`. Secrets (network disk credentials) are left out.
type Diagnosis struct {
	Sandbox    Sandbox
	Containers []Container
	// VMs is the hypervisor's view of each container's VM, by container ID
	// (missing when the VM is gone or the plugin cannot tell).
	VMs map[string]ports.VMDiagnostics
	// Problems says what could not be read.
	Problems []string
}

// Diagnose gathers the records of the container's pod and the hypervisor's
// view of its VMs.
func (r *accessService) Diagnose(ctx context.Context, containerID string) (Diagnosis, error) {
	c, err := r.vms.ContainerStatus(ctx, containerID)
	if err != nil {
		return Diagnosis{}, err
	}
	sb, err := r.pods.SandboxStatus(ctx, c.SandboxID)
	if err != nil {
		return Diagnosis{}, err
	}
	d := Diagnosis{Sandbox: sb, VMs: map[string]ports.VMDiagnostics{}}
	vi, hasInspector := r.deps.Hypervisor.(ports.VMInspector)
	if !hasInspector {
		d.Problems = append(d.Problems, "the hypervisor plugin gives no diagnostics")
	}
	for _, other := range r.containersOf(sb.ID) {
		rec := *other
		rec.Spec.Disks = redactDisks(rec.Spec.Disks)
		d.Containers = append(d.Containers, rec)
		if !hasInspector || other.State == ContainerCreating {
			continue
		}
		vm, err := vi.Diagnose(ctx, other.ID)
		if err != nil {
			d.Problems = append(d.Problems, fmt.Sprintf("VM %s: %v", other.Spec.Name, err))
			continue
		}
		d.VMs[other.ID] = vm
	}
	return d, nil
}

// redactDisks copies disks without their credentials.
func redactDisks(disks []ports.Disk) []ports.Disk {
	out := make([]ports.Disk, len(disks))
	for i, disk := range disks {
		out[i] = disk
		if a := disk.Source.Auth; a != nil {
			out[i].Source.Auth = &ports.DiskAuth{Username: a.Username, SecretType: a.SecretType}
		}
	}
	return out
}

// InspectVM runs a read-only command of the hypervisor's own tool (virsh)
// against the container's VM.
func (r *accessService) InspectVM(ctx context.Context, containerID string, args []string) (ports.CommandOutput, error) {
	c, err := r.vms.ContainerStatus(ctx, containerID)
	if err != nil {
		return ports.CommandOutput{}, err
	}
	vi, ok := r.deps.Hypervisor.(ports.VMInspector)
	if !ok {
		return ports.CommandOutput{}, fmt.Errorf("inspect VM %s: the hypervisor plugin gives no diagnostics: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	out, err := vi.Inspect(ctx, c.ID, args)
	if err != nil {
		return ports.CommandOutput{}, fmt.Errorf("inspect VM %s: %w", c.Spec.Name, err)
	}
	return out, nil
}

// OpenDisplay connects to the running VM's graphical console (VNC) on
// this host.
func (r *accessService) OpenDisplay(ctx context.Context, containerID string) (ports.Display, ports.Conn, error) {
	c, err := r.runningVM(containerID, "display")
	if err != nil {
		return ports.Display{}, nil, err
	}
	vi, ok := r.deps.Hypervisor.(ports.VMInspector)
	if !ok {
		return ports.Display{}, nil, fmt.Errorf("display of VM %s: the hypervisor plugin cannot tell where it is: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	if r.deps.Dialer == nil {
		return ports.Display{}, nil, fmt.Errorf("display of VM %s: this daemon has no dialer: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	d, err := vi.Display(ctx, c.ID)
	if err != nil {
		return ports.Display{}, nil, fmt.Errorf("display of VM %s: %w", c.Spec.Name, err)
	}
	network := d.Network
	if network == "" {
		network = "tcp"
	}
	conn, err := r.deps.Dialer.Dial(ctx, network, d.Address)
	if err != nil {
		return ports.Display{}, nil, fmt.Errorf("display of VM %s at %s: %w", c.Spec.Name, d.Address, err)
	}
	return d, conn, nil
}
