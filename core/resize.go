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
	// CPUQuota and CPUPeriod are the CPU limit (quota ≤ 0: unchanged).
	CPUQuota, CPUPeriod int64
	// CPUShares is the CPU request as CFS shares (0: unchanged).
	CPUShares int64
}

// minShares are the CFS shares kubelet gives a container without a CPU
// request (cgroup v2's least weight): such a VM keeps the hypervisor's
// default weight, as every other VM without a request does, rather than
// the least, which would starve it beside VMs created outside kubelet.
const minShares = 2

// cpuLimits are the VM's CPU limits for a container's CFS figures: the
// request's shares, and the limit's quota per period for the whole VM.
func cpuLimits(shares, period, quota int64) ports.CPULimits {
	l := ports.CPULimits{}
	if shares > minShares {
		l.Shares = uint64(shares)
	}
	if quota > 0 {
		l.Quota, l.Period = quota, cfsPeriod(period)
	}
	return l
}

// resizedCPULimits are the VM's CPU limits after a resize: what it asks
// for replaces what it names. kubelet names both every time: a pod
// without a CPU request has kubelet's least shares (the hypervisor's
// default weight, as at creation), one without a CPU limit a quota of 0
// per a period (or -1, runc's "no limit"): the limit goes. A resize that
// names neither (crictl update --memory) leaves them.
func resizedCPULimits(spec ports.VMSpec, res ContainerResources) ports.CPULimits {
	l := spec.CPULimits
	switch {
	case res.CPUShares > minShares:
		l.Shares = uint64(res.CPUShares)
	case res.CPUShares > 0:
		l.Shares = 0
	}
	switch {
	case res.CPUQuota > 0:
		l.Quota, l.Period = res.CPUQuota, cfsPeriod(res.CPUPeriod)
	case res.CPUQuota < 0, res.CPUPeriod > 0:
		l.Quota, l.Period = 0, 0
	}
	return l
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

// cfsPeriod is a CFS period, CFS's default when none is given.
func cfsPeriod(period int64) int64 {
	if period <= 0 {
		return 100_000
	}
	return period
}

// limitVCPUs is the vCPU count a CPU limit asks for: the limit in whole
// CPUs, rounded up; 0 without a limit.
func limitVCPUs(quota, period int64) int {
	if quota <= 0 {
		return 0
	}
	period = cfsPeriod(period)
	return int((quota + period - 1) / period)
}

// cpuLimit formats a CFS quota as the CPU limit it came from.
func cpuLimit(quota, period int64) string {
	return fmt.Sprintf("%dm", quota*1000/cfsPeriod(period))
}

// bootVCPUs is the vCPU count a VM is created with: VirtletVCPUCount, or,
// for a VM that can change them (VirtletMaxVCPUCount), its CPU limit
// rounded up, at least VirtletVCPUCount: what a resize to that limit
// would give it.
func bootVCPUs(opts annotations.VMOptions, quota, period int64) (int, error) {
	return resizedVCPUs(ports.VMSpec{VCPUs: opts.VCPUCount, MinVCPUs: opts.VCPUCount, MaxVCPUs: opts.MaxVCPUCount},
		ContainerResources{CPUQuota: quota, CPUPeriod: period})
}

// UpdateContainerResources resizes a VM pod's VM in place (kubelet's
// in-place pod resize): its memory, through the balloon, within the
// VM's VirtletMaxMemory, and, for a VM with VirtletMaxVCPUCount, its
// vCPUs, hot-plugged to follow the CPU limit. kubelet sends every resource
// each time: unchanged ones pass, CPU shares and quota are not applied to
// VMs otherwise (README); a new CPU set, a memory or CPU limit beyond the
// VM's range is refused, naming the field, before anything changes.
func (r *accessService) UpdateContainerResources(ctx context.Context, id string, res ContainerResources) error {
	c, unlock, err := r.vms.lockContainer(ctx, id)
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
	vcpus, err := resizedVCPUs(spec, res)
	if err != nil {
		return err
	}
	memory, err := resizedMemory(spec, res.MemoryLimitBytes)
	if err != nil {
		return err
	}
	if vcpus != spec.VCPUs {
		if err := r.deps.Hypervisor.SetVCPUs(ctx, c.ID, vcpus); err != nil {
			return fmt.Errorf("resize the vCPUs of VM %s: %w", spec.Name, err)
		}
		if c, err = r.resized(ctx, c, func(s *ports.VMSpec) { s.VCPUs = vcpus }); err != nil {
			return err
		}
		r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": spec.Name, "from": spec.VCPUs, "to": vcpus}).Info("VM vCPUs resized")
	}
	if limits := resizedCPULimits(spec, res); limits != spec.CPULimits {
		if err := r.deps.Hypervisor.SetCPULimits(ctx, c.ID, limits); err != nil {
			return fmt.Errorf("set the CPU limits of VM %s: %w", spec.Name, err)
		}
		if c, err = r.resized(ctx, c, func(s *ports.VMSpec) { s.CPULimits = limits }); err != nil {
			return err
		}
		r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": spec.Name, "shares": limits.Shares,
			"limit": cpuLimit(limits.Quota, limits.Period)}).Info("VM CPU limits changed")
	}
	if memory != spec.MemoryBytes {
		if err := r.deps.Hypervisor.SetMemory(ctx, c.ID, memory); err != nil {
			return fmt.Errorf("resize the memory of VM %s: %w", spec.Name, err)
		}
		if _, err = r.resized(ctx, c, func(s *ports.VMSpec) { s.MemoryBytes = memory }); err != nil {
			return err
		}
		r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": spec.Name, "from": spec.MemoryBytes, "to": memory}).Info("VM memory resized")
	}
	return nil
}

// resized records a change of the container's VM.
func (r *accessService) resized(ctx context.Context, c *Container, change func(*ports.VMSpec)) (*Container, error) {
	next := *c
	change(&next.Spec)
	if err := r.containers.put(ctx, &next); err != nil {
		return nil, err
	}
	return &next, nil
}

// resizedMemory is the memory a resize asks of the VM (0: unchanged),
// within the range set when the pod was created: VirtletMaxMemory, else
// the memory limit then (a shrink does not lower it).
func resizedMemory(spec ports.VMSpec, m int64) (int64, error) {
	if m == 0 || m == spec.MemoryBytes {
		return spec.MemoryBytes, nil
	}
	top := max(spec.MaxMemoryBytes, spec.MemoryBytes)
	switch {
	case spec.HugepageSizeBytes != 0:
		return 0, &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", m),
			Reason: "a VM backed by hugepages cannot be resized", Allowed: fmt.Sprintf("%d bytes", spec.MemoryBytes)}
	case m < MinMemoryBytes || m > top:
		return 0, &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", m),
			Reason:  "outside the range the VM can be resized within",
			Allowed: fmt.Sprintf("%d to %d bytes (annotation %s sets the top when the pod is created)", int64(MinMemoryBytes), top, annotations.MaxMemory)}
	}
	return m, nil
}

// resizedVCPUs is the vCPU count a resize asks of the VM: its CPU limit,
// rounded up, for a VM that can change its vCPUs; the VM's count
// otherwise. A count beyond the VM's range is refused.
func resizedVCPUs(spec ports.VMSpec, res ContainerResources) (int, error) {
	n := limitVCPUs(res.CPUQuota, res.CPUPeriod)
	if spec.MaxVCPUs == 0 || n == 0 {
		return spec.VCPUs, nil
	}
	n = max(n, spec.MinVCPUs, 1)
	if n > spec.MaxVCPUs {
		return 0, &ports.InvalidError{Field: "resources.limits.cpu", Value: cpuLimit(res.CPUQuota, res.CPUPeriod),
			Reason:  fmt.Sprintf("%d vCPUs, more than the VM's %s", n, annotations.MaxVCPUCount),
			Allowed: fmt.Sprintf("at most %d CPUs (annotation %s sets the top when the pod is created)", spec.MaxVCPUs, annotations.MaxVCPUCount)}
	}
	return n, nil
}
