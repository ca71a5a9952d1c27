package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// reconciler keeps the records in step with the hypervisor: it resyncs
// after every (re)subscription to the VMs' events, applies each event,
// and retries the undos of failed creations.
type reconciler struct {
	*shared
	pods   *sandboxService
	vms    *vmService
	synced chan struct{} // closed after the first resync
	events eventQueue    // the hypervisor's VM state events, applied per VM
}

// Run keeps the records in step with the hypervisor until ctx ends. It
// subscribes to VM state changes and, after every (re)subscription (the
// hypervisor plugin may have restarted), reconciles all records with the
// VMs the hypervisor has: the list-then-watch pattern, so no change is
// missed.
func (r *reconciler) Run(ctx context.Context) {
	var once sync.Once
	ev := &r.events
	go r.retryUndos(ctx)
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		watchCtx, cancel := context.WithCancel(ctx)
		ch, err := r.deps.Hypervisor.Watch(watchCtx)
		if err == nil {
			err = r.resync(watchCtx)
		}
		if err != nil {
			cancel()
			r.log.WithError(err).Warn("cannot reconcile with the hypervisor yet; retrying")
			sleep(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 200 * time.Millisecond
		once.Do(func() { close(r.synced) })
		for st := range ch {
			ev.add(ctx, st)
		}
		cancel()
		if ctx.Err() == nil {
			r.log.Warn("hypervisor event stream ended; resubscribing")
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// WaitSynced blocks until the first reconciliation is done or ctx ends.
func (r *reconciler) WaitSynced(ctx context.Context) error {
	select {
	case <-r.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resync reconciles every record with the hypervisor's VMs:
//   - a sandbox still "pending" was interrupted by a crash: its network is
//     torn down and the record dropped (kubelet retries RunPodSandbox);
//   - a container still "creating" likewise: its VM is undefined;
//   - a created/running container follows its VM's state; one whose VM is
//     gone has exited with reason Lost;
//   - a VM of ours that no record knows (a crash between undefine and
//     forgetting, or the reverse) is undefined.
func (r *reconciler) resync(ctx context.Context) error {
	for _, sb := range r.ListSandboxesIncludingPending() {
		if sb.State == SandboxPending {
			if err := r.dropPendingSandbox(ctx, sb.ID); err != nil {
				return err
			}
		}
	}
	// The records as they were before the list: a record that changes
	// after it (a creation that was in flight) is newer than the list
	// and is not judged by it (CRI calls are served meanwhile).
	listed := r.containers.list(nil)
	revisions := make(map[string]uint64, len(listed))
	for _, c := range listed {
		revisions[c.ID] = c.Revision
	}
	vms, err := r.deps.Hypervisor.List(ctx)
	if err != nil {
		return fmt.Errorf("list VMs: %w", err)
	}
	byID := make(map[string]ports.VMStatus, len(vms))
	for _, vm := range vms {
		byID[vm.ID] = vm
	}
	for id, rev := range revisions {
		if err := r.resyncContainer(ctx, id, rev, byID); err != nil {
			return err
		}
	}
	for id, vm := range byID {
		if _, known := r.containers.get(id); known {
			continue
		}
		r.log.WithFields(logrus.Fields{"vm": id, "state": vm.State}).Warn("removing a VM of ours that no record knows")
		if err := r.deps.Hypervisor.Undefine(ctx, id); err != nil && !errors.Is(err, ports.ErrNotFound) {
			return fmt.Errorf("remove orphan VM %s: %w", short(id), err)
		}
	}
	return nil
}

// ListSandboxesIncludingPending is ListSandboxes without hiding pending ones.
func (r *reconciler) ListSandboxesIncludingPending() []Sandbox {
	all := r.sandboxes.list(nil)
	out := make([]Sandbox, 0, len(all))
	for _, sb := range all {
		out = append(out, *sb)
	}
	return out
}

func (r *reconciler) dropPendingSandbox(ctx context.Context, id string) error {
	unlock, err := r.lockPod(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	sb, ok := r.sandboxes.get(id)
	if !ok || sb.State != SandboxPending {
		return nil
	}
	log := r.log.WithFields(logrus.Fields{"sandbox": short(id), "pod": sb.Namespace + "/" + sb.Name})
	log.Warn("cleaning up a sandbox whose creation was interrupted")
	if err := r.pods.teardownNetwork(ctx, sb, log); err != nil {
		return err
	}
	return r.sandboxes.delete(ctx, id)
}

func (r *reconciler) resyncContainer(ctx context.Context, id string, listedAt uint64, vms map[string]ports.VMStatus) error {
	c, ok := r.containers.get(id)
	if !ok {
		return nil
	}
	unlock, err := r.lockPod(ctx, c.SandboxID)
	if err != nil {
		return err
	}
	defer unlock()
	if c, ok = r.containers.get(id); !ok || c.Revision != listedAt {
		return nil // gone, or changed since the list
	}
	log := r.log.WithFields(logrus.Fields{"container": short(id), "vm": c.Spec.Name})
	switch c.State {
	case ContainerCreating:
		return r.undoInterruptedLocked(ctx, c, log)
	case ContainerCreated, ContainerRunning:
		vm, ok := vms[id]
		if !ok {
			vm = ports.VMStatus{ID: id, State: ports.VMStopped, ExitCode: 255, Reason: ReasonLost,
				Message: "the VM is no longer known to the hypervisor", FinishedAt: r.opts.Now()}
			log.Warn("VM disappeared from the hypervisor")
		}
		return r.applyLocked(ctx, c, vm)
	}
	return nil
}

// undoInterruptedLocked removes what a creation that failed or was
// interrupted made, and its record.
func (r *reconciler) undoInterruptedLocked(ctx context.Context, c *Container, log logrus.FieldLogger) error {
	log.Warn("cleaning up a VM whose creation was interrupted")
	if err := r.vms.releaseVM(ctx, c); err != nil {
		return fmt.Errorf("undo interrupted creation of VM %s: %w", c.Spec.Name, err)
	}
	if err := r.containers.delete(ctx, c.ID); err != nil {
		return err
	}
	log.Info("interrupted creation undone")
	return nil
}

// retryUndos undoes again, with backoff, the creations whose undo failed
// (a plugin it needed was restarting, usually back within seconds).
// Without it their volumes, media and records would wait for the next
// resubscription to the hypervisor, which may be days away.
func (r *reconciler) retryUndos(ctx context.Context) {
	type pending struct {
		next    time.Time
		backoff time.Duration
	}
	todo := map[string]*pending{}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var due <-chan time.Time // nothing to retry: no wake-ups
		if len(todo) > 0 {
			due = tick.C
		}
		select {
		case <-ctx.Done():
			return
		case id := <-r.vms.undos:
			if todo[id] == nil {
				todo[id] = &pending{next: time.Now().Add(time.Second), backoff: time.Second}
			}
		case <-due:
		}
		for id, p := range todo {
			if time.Now().Before(p.next) {
				continue
			}
			opCtx, cancel := context.WithTimeout(ctx, time.Minute)
			err := r.undoInterrupted(opCtx, id)
			cancel()
			if err != nil {
				p.backoff = min(2*p.backoff, 30*time.Second)
				p.next = time.Now().Add(p.backoff)
				r.log.WithError(err).WithFields(logrus.Fields{"container": short(id), "retryIn": p.backoff}).Warn("undo VM creation")
				continue
			}
			delete(todo, id)
		}
	}
}

// undoInterrupted undoes the creation of container id if its record is
// still "creating".
func (r *reconciler) undoInterrupted(ctx context.Context, id string) error {
	c, ok := r.containers.get(id)
	if !ok {
		return nil
	}
	unlock, err := r.lockPod(ctx, c.SandboxID)
	if err != nil {
		return err
	}
	defer unlock()
	if c, ok = r.containers.get(id); !ok || c.State != ContainerCreating {
		return nil
	}
	return r.undoInterruptedLocked(ctx, c, r.log.WithFields(logrus.Fields{"container": short(id), "vm": c.Spec.Name}))
}

// applyLocked moves a container to the state its VM reports.
func (r *reconciler) applyLocked(ctx context.Context, c *Container, vm ports.VMStatus) error {
	next := *c
	switch {
	case c.Halted() && vm.State == ports.VMRunning && vm.StartedAt.After(c.HaltedAt):
		// Booted after the halt (a start interrupted before it was
		// recorded, or the VM started by hand): it runs again. A status
		// of the VM from before the halt (StartedAt earlier) is stale.
		// The boot is recorded as bootLocked records it, so that a stop
		// from before it is told stale too.
		next.HaltedAt, next.BootedAt = time.Time{}, vm.StartedAt
	case c.Halted():
		// Off as asked, or still shutting down: the container stays.
		return nil
	case vm.State == ports.VMStopped && !vm.FinishedAt.IsZero() && vm.FinishedAt.Before(c.BootedAt):
		// The end of the run before the VM's last boot (a halt's stop,
		// applied after the boot): stale.
		return nil
	case vm.State == ports.VMRunning && c.State == ContainerCreated:
		next.State = ContainerRunning
		next.StartedAt = vm.StartedAt
		if next.StartedAt.IsZero() {
			next.StartedAt = r.opts.Now()
		}
	case vm.State == ports.VMStopped && (c.State == ContainerRunning || c.State == ContainerCreated):
		r.vms.applyExit(&next, vm)
		if next.StartedAt.IsZero() {
			next.StartedAt = vm.StartedAt
		}
	default:
		return nil
	}
	if err := r.containers.put(ctx, &next); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "state": next.State,
		"exitCode": next.ExitCode, "reason": next.Reason}).Info("VM state changed")
	return nil
}

// eventQueue applies VM state changes, one worker per VM so that a slow
// operation on one pod never delays another pod's events. Only the latest
// status of a VM matters: it carries the whole state.
type eventQueue struct {
	apply    func(context.Context, ports.VMStatus) error
	log      logrus.FieldLogger
	mu       sync.Mutex
	pending  map[string]ports.VMStatus
	active   map[string]bool
	received uint64 // events taken from the hypervisor's stream
}

func (q *eventQueue) add(ctx context.Context, st ports.VMStatus) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.received++
	if q.pending == nil {
		q.pending = map[string]ports.VMStatus{}
	}
	q.pending[st.ID] = st
	if q.active == nil {
		q.active = map[string]bool{}
	}
	if q.active[st.ID] {
		return
	}
	q.active[st.ID] = true
	go q.work(ctx, st.ID)
}

func (q *eventQueue) work(ctx context.Context, id string) {
	for {
		q.mu.Lock()
		st, ok := q.pending[id]
		delete(q.pending, id)
		if !ok {
			delete(q.active, id)
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		if err := q.apply(ctx, st); err != nil && ctx.Err() == nil {
			q.log.WithError(err).WithField("container", short(id)).Warn("apply VM state change")
		}
	}
}

// EventsSettled tells how many VM state events the runtime has taken from
// the hypervisor's stream, and whether each of them has been applied to
// its container (none is queued or being applied). A caller that knows
// how many events the hypervisor sent waits on it instead of sleeping.
func (r *reconciler) EventsSettled() (received uint64, settled bool) {
	q := &r.events
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.received, len(q.active) == 0
}

func (r *reconciler) observe(ctx context.Context, st ports.VMStatus) error {
	c, ok := r.containers.get(st.ID)
	if !ok {
		return nil
	}
	unlock, err := r.lockPod(ctx, c.SandboxID)
	if err != nil {
		return err
	}
	defer unlock()
	if c, ok = r.containers.get(st.ID); !ok {
		return nil
	}
	return r.applyLocked(ctx, c, st)
}
