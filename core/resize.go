package core

import (
	"context"
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// ContainerResources are the resources an in-place pod resize asks a
// running container for (CRI UpdateContainerResources).
type ContainerResources struct {
	MemoryLimitBytes int64  // 0: unchanged
	CPUSet           string // "": unchanged
}

// checkMaxMemory: VirtletMaxMemory leaves room above the VM's memory for
// resizes; hugepage-backed memory has no balloon to resize it with.
func checkMaxMemory(max, memory, hugepages int64, value string) error {
	switch {
	case max == 0:
		return nil
	case max < memory:
		return &ports.InvalidError{Field: "annotation " + annotations.MaxMemory, Value: value,
			Reason: fmt.Sprintf("below the VM's memory (%d bytes, resources.limits.memory)", memory), Allowed: fmt.Sprintf("at least %d bytes", memory)}
	case hugepages != 0 && max > memory:
		return &ports.InvalidError{Field: "annotation " + annotations.MaxMemory, Value: value,
			Reason: "a VM backed by hugepages cannot be resized (its balloon cannot hand hugepages back)", Allowed: "no " + annotations.MaxMemory + " with a hugepages limit"}
	}
	return nil
}

// UpdateContainerResources resizes a VM pod's VM in place (kubelet's
// in-place pod resize): its memory, through the balloon, within the
// VM's VirtletMaxMemory. kubelet sends every resource each time: CPU
// shares and quota are not applied to VMs (README) and pass; a new CPU
// set or a memory beyond the VM's range is refused, naming the field.
func (r *Runtime) UpdateContainerResources(ctx context.Context, id string, res ContainerResources) error {
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	spec := c.Spec
	if res.CPUSet != "" {
		cpus, err := ParseCPUList(res.CPUSet)
		if err != nil || !slices.Equal(cpus, spec.CPUSet) {
			return &ports.InvalidError{Field: "resources cpuset_cpus", Value: res.CPUSet,
				Reason: "the vCPUs' pinning is fixed while the VM runs", Allowed: "the VM's own CPU set (recreate the pod to change it)"}
		}
	}
	m := res.MemoryLimitBytes
	if m == 0 || m == spec.MemoryBytes {
		return nil
	}
	// The ceiling is set at creation (VirtletMaxMemory, else the memory
	// limit then): a shrink does not lower it.
	top := max(spec.MaxMemoryBytes, spec.MemoryBytes)
	switch {
	case spec.HugepageSizeBytes != 0:
		return &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", m),
			Reason: "a VM backed by hugepages cannot be resized", Allowed: fmt.Sprintf("%d bytes", spec.MemoryBytes)}
	case m < MinMemoryBytes || m > top:
		return &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", m),
			Reason:  "outside the range the VM can be resized within",
			Allowed: fmt.Sprintf("%d to %d bytes (annotation %s sets the top when the pod is created)", int64(MinMemoryBytes), top, annotations.MaxMemory)}
	}
	if err := r.deps.Hypervisor.SetMemory(ctx, c.ID, m); err != nil {
		return fmt.Errorf("resize the memory of VM %s: %w", spec.Name, err)
	}
	resized := *c
	resized.Spec.MemoryBytes = m
	if err := r.commit(ctx, write{container: &resized}); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": spec.Name, "from": spec.MemoryBytes, "to": m}).Info("VM memory resized")
	return nil
}
