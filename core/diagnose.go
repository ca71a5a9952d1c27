package core

import (
	"context"
	"fmt"
	"slices"

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
	// Node is what the node shows of this pod alone: its network
	// namespace's interfaces and routes, its VMs' hypervisor logs.
	Node ports.NodeReport
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
	if r.deps.Node == nil {
		d.Problems = append(d.Problems, "this daemon reads nothing of the node")
		return d, nil
	}
	d.Node = r.deps.Node.InspectNode(ctx, ports.NodeInspection{NetNS: podNetNS(&sb), VMs: vmNames(d.Containers)})
	return d, nil
}

// DiagnoseNode gathers the node's part of the diagnostics: the node's own
// interfaces, routes and processes, its network namespaces, the
// hypervisor's log, and every Virtlet pod's network namespace and VM log.
// It shows every pod of the node: the edge decides who may see it.
func (r *accessService) DiagnoseNode(ctx context.Context) (ports.NodeReport, error) {
	if r.deps.Node == nil {
		return ports.NodeReport{}, fmt.Errorf("node diagnostics: this daemon reads nothing of the node: %w", ports.ErrUnimplemented)
	}
	req := ports.NodeInspection{Node: true}
	sandboxes := r.sandboxes.list(func(sb *Sandbox) bool { return sb.State != SandboxPending })
	slices.SortFunc(sandboxes, func(a, b *Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for _, sb := range sandboxes {
		req.NetNS = append(req.NetNS, podNetNS(sb)...)
	}
	containers := r.containers.list(nil)
	slices.SortFunc(containers, func(a, b *Container) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for _, c := range containers {
		if madeVM(c) {
			req.VMs = append(req.VMs, c.Spec.Name)
		}
	}
	return r.deps.Node.InspectNode(ctx, req), nil
}

// podNetNS is the pod's network namespace, when it has one.
func podNetNS(sb *Sandbox) []ports.PodNetNS {
	if sb.Network == nil || sb.Network.NetNSPath == "" {
		return nil
	}
	return []ports.PodNetNS{{Pod: sb.Namespace + "/" + sb.Name, Path: sb.Network.NetNSPath}}
}

// vmNames are the hypervisor's names of the VMs that were made.
func vmNames(containers []Container) []string {
	var names []string
	for i := range containers {
		if madeVM(&containers[i]) {
			names = append(names, containers[i].Spec.Name)
		}
	}
	return names
}

// madeVM reports whether the container's VM was made (an exited VM's log
// tells why it ended).
func madeVM(c *Container) bool {
	return c.State != ContainerCreating && c.Spec.Name != ""
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
