// Lifecycle events: libvirt's callbacks queue them, one goroutine applies
// them to the records in order, and subscribers hear the statuses.

package libvirt

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// event is a lifecycle event of one of our domains, or (watchdog set) the
// firing of its watchdog.
type event struct {
	uuid     string
	kind     libvirt.DomainEventType
	detail   int
	watchdog string
	domain   string // the domain's name, for a watchdog's firing
}

// dispatcher queues the domains' events as libvirt's callbacks deliver
// them and runs one goroutine that applies them in order, and
// resynchronises with libvirt when asked (events were lost, or the
// connection is new) and every `every` (an event may be lost where nobody
// notices). Both run there, so that no event older than a resync is
// applied after it. Its lock guards the goroutine's start and end and is
// taken alone.
type dispatcher struct {
	log    logrus.FieldLogger
	apply  func(event)
	resync func()

	queued chan event
	// resyncs asks for a resync: nil after lost events, a channel to
	// close when done from resume.
	resyncs chan chan struct{}
	// every is how often the dispatcher resynchronises anyway.
	every time.Duration

	mu sync.Mutex
	// quit ends the goroutine, which closes dispatched (close: tests).
	quit, dispatched chan struct{}
}

func newDispatcher(log logrus.FieldLogger, apply func(event), resync func()) dispatcher {
	return dispatcher{log: log, apply: apply, resync: resync, queued: make(chan event, 256),
		resyncs: make(chan chan struct{}, 1), every: 30 * time.Second}
}

// onLifecycle runs on libvirt's event loop: it only queues the event.
func (d *dispatcher) onLifecycle(c *libvirt.Connect, dom *libvirt.Domain, e *libvirt.DomainEventLifecycle) {
	uuid, err := dom.GetUUIDString()
	if err != nil {
		return
	}
	d.queue(event{uuid: uuid, kind: e.Event, detail: e.Detail})
}

// watchdogActions name libvirt's watchdog actions as the annotation does.
var watchdogActions = map[libvirt.DomainEventWatchdogAction]string{
	libvirt.DOMAIN_EVENT_WATCHDOG_NONE: "none", libvirt.DOMAIN_EVENT_WATCHDOG_PAUSE: "pause",
	libvirt.DOMAIN_EVENT_WATCHDOG_RESET: "reset", libvirt.DOMAIN_EVENT_WATCHDOG_POWEROFF: "poweroff",
	libvirt.DOMAIN_EVENT_WATCHDOG_SHUTDOWN: "shutdown", libvirt.DOMAIN_EVENT_WATCHDOG_DEBUG: "dump",
	libvirt.DOMAIN_EVENT_WATCHDOG_INJECTNMI: "inject-nmi",
}

// onWatchdog runs on libvirt's event loop when a guest's watchdog fires:
// it queues the firing, in order with the lifecycle events it causes.
func (d *dispatcher) onWatchdog(c *libvirt.Connect, dom *libvirt.Domain, e *libvirt.DomainEventWatchdog) {
	uuid, err := dom.GetUUIDString()
	if err != nil {
		return
	}
	action := watchdogActions[e.Action]
	if action == "" {
		action = fmt.Sprintf("action %d", e.Action)
	}
	name, _ := dom.GetName()
	d.queue(event{uuid: uuid, watchdog: action, domain: name})
}

func (d *dispatcher) queue(e event) {
	select {
	case d.queued <- e:
	default:
		d.log.Warn("libvirt event queue full; a resync will catch up")
		select {
		case d.resyncs <- nil:
		default: // one is pending already
		}
	}
}

// start runs the dispatching goroutine unless it runs already.
func (d *dispatcher) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.quit != nil {
		return
	}
	d.quit, d.dispatched = make(chan struct{}), make(chan struct{})
	go d.run(d.quit, d.dispatched)
}

// stop ends the dispatching goroutine and waits for it: no event or
// resync applies (and writes a record) after stop.
func (d *dispatcher) stop() {
	d.mu.Lock()
	quit, dispatched := d.quit, d.dispatched
	d.quit = nil
	d.mu.Unlock()
	if quit != nil {
		close(quit)
		<-dispatched
	}
}

// resume has the dispatcher resynchronise and waits until it has: after
// (re)connecting, it takes up the states that changed while nobody
// listened, and the console streams of running VMs.
func (d *dispatcher) resume() {
	done := make(chan struct{})
	d.resyncs <- done
	<-done
}

func (d *dispatcher) run(quit <-chan struct{}, dispatched chan<- struct{}) {
	defer close(dispatched)
	tick := time.NewTicker(d.every)
	defer tick.Stop()
	for {
		select {
		case <-quit:
			return
		case e := <-d.queued:
			d.apply(e)
		case done := <-d.resyncs:
			d.drain()
			d.resync()
			if done != nil {
				close(done)
			}
		case <-tick.C:
			d.drain()
			d.resync()
		}
	}
}

// drain applies the events queued so far.
func (d *dispatcher) drain() {
	for {
		select {
		case e := <-d.queued:
			d.apply(e)
		default:
			return
		}
	}
}

// apply applies one lifecycle event.
func (rc *reconciler) apply(e event) {
	rc.h.mu.Lock()
	defer rc.h.mu.Unlock()
	var r *record
	for _, rec := range rc.h.records {
		if strings.EqualFold(rec.Spec.UUID, e.uuid) {
			r = rec
			break
		}
	}
	if r == nil {
		return // not ours
	}
	if e.watchdog != "" {
		// The guest stopped petting its watchdog: the VM it stops (poweroff,
		// shutdown) ends with reason Watchdog; a reset or a dump leaves it
		// running, and is logged.
		rc.h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "action": e.watchdog}).Warn("the guest's watchdog fired")
		if e.watchdog == "dump" && e.domain != "" {
			rc.h.dumps.prune(r.Spec.Name, e.domain, 1) // and again as it resumes, the new dump written
		}
		if e.watchdog == "poweroff" || e.watchdog == "shutdown" {
			r.Watchdog = e.watchdog
			if err := rc.h.store.save(r); err != nil {
				rc.h.log.WithError(err).Warn("save VM record")
			}
		}
		return
	}
	switch e.kind {
	case libvirt.DOMAIN_EVENT_STARTED, libvirt.DOMAIN_EVENT_RESUMED:
		// libvirtd resumes a guest once its watchdog's dump is written
		// (the firing's event comes before the dump): the older ones go.
		if wd := r.Spec.Watchdog; wd != nil && wd.Action == "dump" && e.kind == libvirt.DOMAIN_EVENT_RESUMED {
			rc.h.dumps.prune(r.Spec.Name, r.Spec.Name, 1)
		}
		if r.Incoming {
			// A live migration's guest arriving: its console streams from
			// now, not from when the pod's StartContainer hears of it; it
			// is the VM's guest once Start takes it (a migration may still
			// fail), so its state stays.
			if rc.h.tailers[r.Spec.ID] == nil {
				rc.startTailerLocked(r)
			}
			return
		}
		if r.State == ports.VMRunning {
			return
		}
		r.State = ports.VMRunning
		r.seq++
		if r.StartedAt.IsZero() {
			r.StartedAt = time.Now().UTC()
		}
	case libvirt.DOMAIN_EVENT_CRASHED:
		r.Crashed = true
		return
	case libvirt.DOMAIN_EVENT_STOPPED:
		if r.State != ports.VMRunning {
			return // applied already, from the shutoff reason (Stop, a resync)
		}
		rc.exitLocked(r, exitFromEvent(libvirt.DomainEventStoppedDetailType(e.detail), r))
	default:
		return
	}
	if err := rc.h.store.save(r); err != nil {
		rc.h.log.WithError(err).Warn("save VM record")
	}
	rc.h.watchers.notify(r.status())
}

// exit is how a VM ended.
type exit struct {
	code    int32
	reason  string
	message string
}

func exitFromEvent(detail libvirt.DomainEventStoppedDetailType, r *record) exit {
	switch detail {
	case libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN:
		if r.StopRequested {
			return exit{0, "Completed", "the guest shut down on request"}
		}
		return exit{0, "Completed", "the guest powered off"}
	case libvirt.DOMAIN_EVENT_STOPPED_DESTROYED:
		return forcedExit(r)
	case libvirt.DOMAIN_EVENT_STOPPED_CRASHED:
		return exit{1, "Crashed", "the guest crashed"}
	case libvirt.DOMAIN_EVENT_STOPPED_FAILED:
		return exit{1, "Failed", "the QEMU process ended unexpectedly"}
	case libvirt.DOMAIN_EVENT_STOPPED_MIGRATED:
		return migratedExit
	default:
		return exit{255, "Stopped", fmt.Sprintf("stopped by libvirt (event detail %d)", detail)}
	}
}

// shutoffEvents maps the reasons a domain is found shut off to the
// stopped events that say the same.
var shutoffEvents = map[libvirt.DomainShutoffReason]libvirt.DomainEventStoppedDetailType{
	libvirt.DOMAIN_SHUTOFF_SHUTDOWN:  libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN,
	libvirt.DOMAIN_SHUTOFF_DESTROYED: libvirt.DOMAIN_EVENT_STOPPED_DESTROYED,
	libvirt.DOMAIN_SHUTOFF_CRASHED:   libvirt.DOMAIN_EVENT_STOPPED_CRASHED,
	libvirt.DOMAIN_SHUTOFF_FAILED:    libvirt.DOMAIN_EVENT_STOPPED_FAILED,
	libvirt.DOMAIN_SHUTOFF_MIGRATED:  libvirt.DOMAIN_EVENT_STOPPED_MIGRATED,
}

func exitFromShutoff(reason libvirt.DomainShutoffReason, r *record) exit {
	if detail, ok := shutoffEvents[reason]; ok {
		return exitFromEvent(detail, r)
	}
	return exit{255, "Stopped", fmt.Sprintf("found shut off (reason %d)", reason)}
}

func forcedExit(r *record) exit {
	switch {
	case r.Crashed:
		return exit{1, "Crashed", "the guest crashed"}
	case r.ForcedAfter > 0:
		return exit{137, "Killed", fmt.Sprintf("forced off: the guest did not shut down within the %s grace period", r.ForcedAfter)}
	case r.StopRequested:
		return exit{137, "Killed", "forced off"}
	default:
		return exit{137, "Killed", "destroyed outside Virtlet"}
	}
}

// exitLocked records a VM's end; callers hold h.mu.
func (rc *reconciler) exitLocked(r *record, e exit) {
	r.State = ports.VMStopped
	r.seq++
	r.FinishedAt = time.Now().UTC()
	if r.Watchdog != "" && !r.StopRequested {
		e = exit{1, "Watchdog", fmt.Sprintf("the guest stopped petting its %s watchdog, which did %s", watchdogModel(r), r.Watchdog)}
	}
	r.Watchdog = ""
	r.ExitCode, r.Reason, r.Message = e.code, e.reason, e.message
	r.StopRequested, r.Crashed = false, false
	for _, ch := range rc.h.stopped[r.Spec.ID] {
		close(ch)
	}
	delete(rc.h.stopped, r.Spec.ID)
	if t := rc.h.tailers[r.Spec.ID]; t != nil {
		delete(rc.h.tailers, r.Spec.ID)
		go t.close() // drains the last output
	}
	// Not here, under h.mu: closing takes consoles.mu, which OpenConsole
	// holds while it opens a stream (lock order).
	ended := r.runs
	r.runs++
	go rc.h.consoles.close(r.Spec.ID, ended)
}

// watchers are the subscribers of Watch. Their lock is taken alone, or
// with h.mu held (notify), never the other way round.
type watchers struct {
	log  logrus.FieldLogger
	mu   sync.Mutex
	subs map[chan ports.VMStatus]struct{}
}

// add subscribes a watcher until ctx ends.
func (w *watchers) add(ctx context.Context) <-chan ports.VMStatus {
	ch := make(chan ports.VMStatus, 64)
	w.mu.Lock()
	if w.subs == nil {
		w.subs = map[chan ports.VMStatus]struct{}{}
	}
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	go func() {
		<-ctx.Done()
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.subs[ch]; ok {
			delete(w.subs, ch)
			close(ch)
		}
	}()
	return ch
}

// notify sends a state change to the watchers; callers hold h.mu, so that
// changes go out in the order they were made. One that does not keep up
// is cut off (its channel closed) rather than skipped: a change it never
// hears of would stay unknown, while the end of its watch makes it
// resubscribe and resynchronise with List.
func (w *watchers) notify(st ports.VMStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		select {
		case ch <- st:
		default:
			w.log.WithField("vm", st.ID).Warn("a watcher fell behind; ending its watch so that it resynchronises")
			delete(w.subs, ch)
			close(ch)
		}
	}
}

// end ends every watch (the connection to libvirtd was lost).
func (w *watchers) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		close(ch)
	}
	w.subs = map[chan ports.VMStatus]struct{}{}
}
