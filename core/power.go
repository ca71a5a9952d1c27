package core

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// Power operations keep a VM pod's container and act on its VM only
// (virtletctl stop, start and restart; README "Run strategies"). A halted
// VM is shut off but stays defined, with its disks, its pod network and
// its container: kubelet still sees the container running (so it neither
// restarts it nor ends the pod), while everything that needs the VM (exec,
// attach, port-forward, stats) says it is halted. Starting it boots the
// same VM from the same disks, whatever its root file system is.
//
// The halt is recorded before the VM is stopped, so a crash in between
// leaves a running VM with a halt mark (cleared by the next start, or
// completed by the next stop), never a VM that powered off unrecorded
// and would be taken for an exit.

// HaltVM shuts the VM of a running container down (ACPI, forced off after
// timeout) and keeps it halted. Halting a halted VM succeeds.
func (r *accessService) HaltVM(ctx context.Context, id string, timeout time.Duration) error {
	return r.power(ctx, id, "stop", func(ctx context.Context, c *Container) error {
		return r.haltLocked(ctx, c, timeout, "stop")
	})
}

// BootVM starts a halted VM again. Booting a VM that runs succeeds.
func (r *accessService) BootVM(ctx context.Context, id string) error {
	return r.power(ctx, id, "start", r.bootLocked)
}

// RebootVM power-cycles the VM: a halt (ACPI, forced off after timeout)
// and a boot, so the guest starts on fresh virtual hardware from the same
// disks. A halted VM is just booted.
func (r *accessService) RebootVM(ctx context.Context, id string, timeout time.Duration) error {
	return r.power(ctx, id, "restart", func(ctx context.Context, c *Container) error {
		if !c.Halted() {
			if err := r.haltLocked(ctx, c, timeout, "restart"); err != nil {
				return err
			}
			c, _ = r.containers.get(c.ID)
		}
		return r.bootLocked(ctx, c)
	})
}

// power runs a power operation on a running container's VM under its
// pod's lock. It goes on when the caller goes away: the guest may already
// be shutting down.
func (r *accessService) power(ctx context.Context, id, op string, act func(context.Context, *Container) error) error {
	return r.detached(ctx, func(ctx context.Context) error {
		c, unlock, err := r.vms.lockContainer(ctx, id)
		if err != nil {
			return err
		}
		defer unlock()
		if err := r.checkPowerable(c, op); err != nil {
			return err
		}
		return act(ctx, c)
	})
}

// checkPowerable refuses a container whose VM is not the running VM of a
// live pod: a created VM starts with StartContainer, an exited one is
// kubelet's to restart.
func (r *accessService) checkPowerable(c *Container, op string) error {
	if c.State == ContainerRunning {
		return nil
	}
	state := string(c.State)
	if c.State == ContainerExited {
		state = fmt.Sprintf("exited (exit code %d, %s): kubelet restarts it as the pod's restartPolicy says", c.ExitCode, c.Reason)
	}
	return fmt.Errorf("%s: the VM %s of pod %s/%s is %s; only the VM of a running container can be stopped, started or restarted: %w",
		op, c.Spec.Name, c.Spec.PodNamespace, c.Spec.PodName, state, ports.ErrFailedPrecondition)
}

func (r *accessService) haltLocked(ctx context.Context, c *Container, timeout time.Duration, op string) error {
	log := r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "op": op})
	halted := *c
	if !c.Halted() {
		halted.HaltedAt = r.opts.Now()
		halted.CPUNanosBefore += r.cpuNanos(ctx, c)
		if err := r.containers.put(ctx, &halted); err != nil {
			return err
		}
	}
	// Stopping a VM that is already off succeeds: a halt interrupted by a
	// crash is completed here.
	if _, err := r.deps.Hypervisor.Stop(ctx, c.ID, timeout); err != nil {
		err = fmt.Errorf("%s VM %s: %w", op, c.Spec.Name, err)
		if st, serr := r.deps.Hypervisor.Status(ctx, c.ID); serr == nil && st.State == ports.VMRunning && !c.Halted() {
			// Still running: the halt did not happen.
			unhalted := *c
			if cerr := r.containers.put(ctx, &unhalted); cerr != nil {
				log.WithError(cerr).Warn("forget the halt mark of a VM that did not stop")
			}
		}
		return err
	}
	log.Info("VM halted")
	return nil
}

func (r *accessService) bootLocked(ctx context.Context, c *Container) error {
	if err := r.deps.Hypervisor.Start(ctx, c.ID); err != nil {
		return fmt.Errorf("start VM %s: %w", c.Spec.Name, err)
	}
	if !c.Halted() {
		return nil
	}
	booted := *c
	booted.HaltedAt, booted.BootedAt = time.Time{}, r.opts.Now()
	if err := r.containers.put(ctx, &booted); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name}).Info("halted VM started")
	return nil
}

// cpuNanos is the CPU time the VM has used since it last booted, or 0 when
// the hypervisor cannot tell: a halted VM's next boot counts from zero, and
// the container's CPU time must not go back.
func (r *accessService) cpuNanos(ctx context.Context, c *Container) uint64 {
	sr, ok := r.deps.Hypervisor.(ports.StatsReporter)
	if !ok {
		return 0
	}
	stats, err := sr.Stats(ctx, []string{c.ID})
	if err != nil || len(stats) == 0 {
		r.log.WithError(err).WithField("vm", c.Spec.Name).Warn("CPU time before a halt unknown; the container's CPU time restarts from zero")
		return 0
	}
	return stats[0].CPUNanos
}

// haltedError says that what needs the VM cannot have it while it is
// halted.
func haltedError(what string, c *Container) error {
	return fmt.Errorf("%s: pod %s/%s: %s: %w", what, c.Spec.PodNamespace, c.Spec.PodName, c.HaltMessage(), ports.ErrFailedPrecondition)
}
