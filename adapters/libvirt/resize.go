// Resizing a running VM: memory by the balloon, vCPUs hot-plugged and
// brought online by the guest agent (in the background when the guest is
// slow to see them).

package libvirt

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// SetMemory resizes a VM's memory within its maximum: through the balloon
// while it runs (the guest gives pages back or takes them), and in its
// definition for the next boot.
func (h *Hypervisor) SetMemory(ctx context.Context, id string, bytes int64) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	h.mu.Lock()
	name, max := r.Spec.Name, maxMemory(r.Spec)
	h.mu.Unlock()
	if bytes <= 0 || bytes > max {
		return &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", bytes),
			Reason: fmt.Sprintf("outside what VM %s can be resized to", name), Allowed: fmt.Sprintf("at most %d bytes (VirtletMaxMemory)", max)}
	}
	flags := libvirt.DOMAIN_MEM_CONFIG
	if state, _, err := dom.GetState(); err == nil && state == libvirt.DOMAIN_RUNNING {
		flags |= libvirt.DOMAIN_MEM_LIVE
	}
	if err := dom.SetMemoryFlags(uint64(bytes>>10), flags); err != nil {
		return libvirtError("resize the memory of domain "+name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := r.Spec.MemoryBytes
	r.Spec.MemoryBytes = bytes
	if err := h.store.save(r); err != nil {
		r.Spec.MemoryBytes = old // the record on disk still says so
		return err
	}
	return nil
}

// SetCPULimits sets a VM's CPU weight and limit (libvirt's scheduler
// parameters: cpu_shares, global_period and global_quota, the whole VM's),
// live while it runs and in its definition for the next boot.
func (h *Hypervisor) SetCPULimits(ctx context.Context, id string, l ports.CPULimits) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	if l.Shares > 262144 || l.Quota > 0 && l.Quota < 1000 {
		return &ports.InvalidError{Field: "resources cpu", Value: fmt.Sprintf("shares %d, quota %d", l.Shares, l.Quota),
			Allowed: "cpu_shares up to 262144, a quota of at least 1000 µs (1 millicore per 1 s period)"}
	}
	h.mu.Lock()
	name := r.Spec.Name
	h.mu.Unlock()
	flags := libvirt.DOMAIN_AFFECT_CONFIG
	if state, _, err := dom.GetState(); err == nil && (state == libvirt.DOMAIN_RUNNING || state == libvirt.DOMAIN_PAUSED) {
		flags |= libvirt.DOMAIN_AFFECT_LIVE
	}
	if err := dom.SetSchedulerParametersFlags(schedulerParams(l), flags); err != nil {
		return libvirtError("set the CPU limits of domain "+name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := r.Spec.CPULimits
	r.Spec.CPULimits = l
	if err := h.store.save(r); err != nil {
		r.Spec.CPULimits = old
		return err
	}
	return nil
}

// SetVCPUs changes a VM's vCPUs within its range, live while it runs and
// in its definition for the next boot. Growing hot-plugs vCPUs and has the
// guest's agent bring them online in the background (Linux leaves a
// hot-plugged CPU offline unless told). Shrinking has the agent take vCPUs offline, and unplugs
// them at the next boot: Debian 12's QEMU 7.2 does not report a removed
// vCPU (no DEVICE_DELETED for the CPU itself, only for its local APIC), so
// libvirt 9.0 times out and keeps counting an unplugged vCPU as present,
// and can neither plug it again nor tell its true count. A shrink
// therefore needs the guest's agent; a later grow brings the offline vCPUs
// back before it plugs new ones.
func (h *Hypervisor) SetVCPUs(ctx context.Context, id string, n int) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	h.mu.Lock()
	name, old, lo, hi := r.Spec.Name, r.Spec.VCPUs, max(r.Spec.MinVCPUs, 1), topVCPUs(r.Spec)
	fixed := r.Spec.MaxVCPUs == 0
	h.mu.Unlock()
	if fixed {
		lo, hi = old, old
	}
	if n < lo || n > hi {
		return &ports.InvalidError{Field: "vCPUs", Value: strconv.Itoa(n),
			Reason: fmt.Sprintf("outside what VM %s can be given while it runs", name), Allowed: fmt.Sprintf("%d to %d", lo, hi)}
	}
	if n == old {
		return nil
	}
	log := h.log.WithFields(logrus.Fields{"vm": name, "from": old, "to": n})
	onlineLater := false
	if state, _, err := dom.GetState(); err == nil && state == libvirt.DOMAIN_RUNNING {
		plugged, err := dom.GetVcpusFlags(libvirt.DOMAIN_VCPU_LIVE)
		if err != nil {
			return libvirtError("the live vCPUs of domain "+name, err)
		}
		if n > int(plugged) {
			if err := dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_LIVE); err != nil {
				return libvirtError(fmt.Sprintf("hot-plug vCPUs into domain %s (%d to %d)", name, plugged, n), err)
			}
		}
		// An onlining of an earlier grow ends first (its last agent call
		// included): it must not online vCPUs after this resize.
		h.onliner.stop(id)
		if n < old {
			if err := onlineGuestVCPUs(ctx, dom, n); err != nil {
				return fmt.Errorf("take vCPUs of VM %s offline (%d to %d) through its guest agent: %w: %w", name, old, n, err, ports.ErrFailedPrecondition)
			}
		} else {
			onlineLater = true
		}
	}
	if err := dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_CONFIG); err != nil {
		return libvirtError(fmt.Sprintf("set the vCPUs of domain %s to %d for its next boot", name, n), err)
	}
	h.mu.Lock()
	r.Spec.VCPUs = n
	if err := h.store.save(r); err != nil {
		r.Spec.VCPUs = old // the record on disk still says so
		h.mu.Unlock()
		return err
	}
	h.mu.Unlock()
	if onlineLater {
		// The guest's kernel learns of a hot-plugged vCPU through ACPI,
		// which a busy TCG guest may handle a minute later; its agent may
		// be busy with execs meanwhile. The resize returns now and the
		// agent onlines them when it can.
		h.onliner.later(r, n, log)
	}
	log.Info("vCPUs set")
	return nil
}

// onlineGuestVCPUs waits until the guest has seen at least n vCPUs (a
// hot-plugged CPU reaches the guest's kernel through ACPI a little after
// QEMU added it) and has its agent keep exactly n of them online.
func onlineGuestVCPUs(ctx context.Context, dom *libvirt.Domain, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		err := setGuestVCPUs(dom, n)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setGuestVCPUs has the guest's agent keep n vCPUs online once the guest
// sees n.
func setGuestVCPUs(dom *libvirt.Domain, n int) error {
	gv, err := dom.GetGuestVcpus(0)
	if err != nil {
		return err
	}
	if seen := countTrue(gv.Vcpus); seen < n {
		return fmt.Errorf("the guest sees %d of its %d vCPUs", seen, n)
	}
	return dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_GUEST)
}

// vcpuOnlineWindow bounds how long hot-plugged vCPUs are waited for in the
// background, and vcpuOnlineRetry how often the guest is asked meanwhile.
const (
	vcpuOnlineWindow = 5 * time.Minute
	vcpuOnlineRetry  = time.Second
)

// onliner has guests' agents bring hot-plugged vCPUs online in the
// background, one job per VM. Its lock guards jobs and is taken alone.
type onliner struct {
	vms vmSource
	// domain returns a VM's domain on the guest agent's connection.
	domain func(r *record) (*libvirt.Domain, error)

	mu   sync.Mutex
	jobs map[string]*onlining
}

// onlining is one background onlining of hot-plugged vCPUs; done closes
// when its goroutine has returned (its last agent call over).
type onlining struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// later has the guest's agent bring n vCPUs online in the background,
// retrying until it has, the VM is shut off or removed, another resize or
// close supersedes it, or vcpuOnlineWindow ends.
func (o *onliner) later(r *record, n int, log logrus.FieldLogger) {
	id := r.Spec.ID
	o.stop(id)
	ctx, cancel := context.WithTimeout(context.Background(), vcpuOnlineWindow)
	job := &onlining{cancel: cancel, done: make(chan struct{})}
	o.mu.Lock()
	if o.jobs == nil {
		o.jobs = map[string]*onlining{}
	}
	o.jobs[id] = job
	o.mu.Unlock()
	go func() {
		defer close(job.done)
		defer cancel()
		defer func() {
			o.mu.Lock()
			if o.jobs[id] == job {
				delete(o.jobs, id)
			}
			o.mu.Unlock()
		}()
		o.run(ctx, r, n, log)
	}()
}

// run retries onlining until it is done or ctx ends.
func (o *onliner) run(ctx context.Context, r *record, n int, log logrus.FieldLogger) {
	var err error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(vcpuOnlineRetry):
			}
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				log.WithError(err).Warn("vCPUs hot-plugged; the guest's agent did not bring them online (the guest may do it itself)")
			}
			return
		}
		if o.vms.record(r.Spec.ID) != r {
			return // removed (a record of its own for a redefined VM)
		}
		var dom *libvirt.Domain
		if dom, err = o.domain(r); err != nil {
			continue
		}
		state, _, serr := dom.GetState()
		switch {
		case serr == nil && (state == libvirt.DOMAIN_SHUTOFF || state == libvirt.DOMAIN_CRASHED || state == libvirt.DOMAIN_SHUTDOWN):
			dom.Free()
			log.WithField("state", state).Info("the VM stopped before its hot-plugged vCPUs came online")
			return
		case serr == nil && state != libvirt.DOMAIN_RUNNING:
			err = fmt.Errorf("the VM is not running (state %d)", state) // paused: later
		default:
			err = setGuestVCPUs(dom, n)
		}
		dom.Free()
		if err == nil {
			log.WithField("attempts", attempt+1).Info("hot-plugged vCPUs online")
			return
		}
	}
}

// stop cancels a background onlining of VM id's vCPUs and waits until it
// has ended. Called without h.mu.
func (o *onliner) stop(id string) {
	o.mu.Lock()
	job := o.jobs[id]
	delete(o.jobs, id)
	o.mu.Unlock()
	if job != nil {
		job.cancel()
		<-job.done
	}
}

// stopAll cancels every onlining and waits until they have ended (an
// agent call in flight ends at its own timeout).
func (o *onliner) stopAll() {
	o.mu.Lock()
	var jobs []*onlining
	for id, job := range o.jobs {
		job.cancel()
		jobs = append(jobs, job)
		delete(o.jobs, id)
	}
	o.mu.Unlock()
	for _, job := range jobs {
		<-job.done
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
