package libvirt

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// waitFor reads w until it reports id in state, failing after 5 s.
func waitFor(t *testing.T, w <-chan ports.VMStatus, id string, state ports.VMState) ports.VMStatus {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case st, ok := <-w:
			if !ok {
				t.Fatalf("the watch ended before VM %s was reported %s", id, state)
			}
			if st.ID == id && st.State == state {
				return st
			}
		case <-timeout:
			t.Fatalf("VM %s was never reported %s", id, state)
		}
	}
}

func lookupDomain(t *testing.T, r *record) *libvirt.Domain {
	t.Helper()
	dom, err := testConn(t).LookupDomainByUUIDString(r.Spec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dom.Free() })
	return dom
}

// A VM's stop event dropped because the event queue was full is recovered
// by the resynchronisation the overflow triggers: the VM is reported
// stopped, with the reason libvirt kept.
func TestEventsLostToAFullQueueAreRecovered(t *testing.T) {
	log, hook := test.NewNullLogger()
	h := configured(t, t.TempDir(), log)
	a := addVM(t, h, ports.VMRunning, true)
	w, err := h.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Stall the dispatcher on an event and fill the queue behind it.
	h.mu.Lock()
	junk := event{uuid: "00000000-0000-0000-0000-000000000000", kind: libvirt.DOMAIN_EVENT_STARTED}
	h.events.queued <- junk
	for full := false; !full; {
		select {
		case h.events.queued <- junk:
		default:
			full = true
		}
	}
	if err := lookupDomain(t, a).Destroy(); err != nil {
		h.mu.Unlock()
		t.Fatal(err)
	}
	dropped := false
	for deadline := time.Now().Add(5 * time.Second); !dropped && time.Now().Before(deadline); {
		for _, e := range hook.AllEntries() {
			dropped = dropped || e.Level == logrus.WarnLevel && strings.Contains(e.Message, "event queue full")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.mu.Unlock()
	if !dropped {
		t.Fatal("the stop event was not dropped: the test did not fill the queue")
	}
	st := waitFor(t, w, a.Spec.ID, ports.VMStopped)
	if st.Reason != "Killed" || st.ExitCode != 137 {
		t.Fatalf("recovered exit %+v, want the destroyed domain's 137 Killed", st)
	}
	if st, _ := h.Status(context.Background(), a.Spec.ID); st.State != ports.VMStopped {
		t.Fatalf("status after the resync %+v", st)
	}
}

// Without any event at all (one lost without the queue overflowing, in
// libvirt or on the wire), the periodic resynchronisation catches up.
func TestStatesAreResynchronisedPeriodically(t *testing.T) {
	h := configured(t, t.TempDir(), quietLog(), func(h *Hypervisor) { h.events.every = 100 * time.Millisecond })
	// a: running by its record, off in libvirt; b: the reverse.
	a := addVM(t, h, ports.VMRunning, false)
	b := addVM(t, h, ports.VMStopped, false)
	w, err := h.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Started behind the adapter's back: the event is dropped here.
	h.mu.Lock()
	delete(h.records, b.Spec.ID)
	h.mu.Unlock()
	if err := lookupDomain(t, b).Create(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	h.mu.Lock()
	h.records[b.Spec.ID] = b
	h.mu.Unlock()

	waitFor(t, w, a.Spec.ID, ports.VMStopped)
	if st := waitFor(t, w, b.Spec.ID, ports.VMRunning); st.StartedAt.IsZero() {
		t.Fatalf("b recovered as running without a start time: %+v", st)
	}
}

// A watcher that does not keep up is cut off rather than silently skipped:
// its channel closes, and the consumer resubscribes and lists (the core
// does so whenever a watch ends).
func TestSlowWatcherIsCutOff(t *testing.T) {
	h := New(quietLog())
	h.conn.ready, h.conn.open = true, testConn(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := h.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	for i := range cap(w) + 1 {
		h.watchers.notify(ports.VMStatus{ID: "0123456789abcdef", State: ports.VMRunning, ExitCode: int32(i)})
	}
	h.mu.Unlock()
	timeout := time.After(2 * time.Second)
	for n := 0; ; n++ {
		select {
		case _, ok := <-w:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("after %d statuses the watch stays open though one was dropped", n)
		}
	}
}

// A VM its watchdog powered off ends with reason Watchdog, naming the
// device and the action; a watchdog reset leaves the next stop's reason
// alone.
func TestWatchdogFiringIsTheExitReason(t *testing.T) {
	log, _ := test.NewNullLogger()
	h := configured(t, t.TempDir(), log)
	w, err := h.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		action, reason string
	}{
		{"poweroff", "Watchdog"},
		{"reset", "Killed"},
	} {
		r := addVM(t, h, ports.VMRunning, true)
		h.mu.Lock()
		r.Spec.Watchdog = &ports.Watchdog{Model: "i6300esb", Action: tc.action}
		h.mu.Unlock()
		h.events.queued <- event{uuid: r.Spec.UUID, watchdog: tc.action}
		h.events.queued <- event{uuid: r.Spec.UUID, kind: libvirt.DOMAIN_EVENT_STOPPED, detail: int(libvirt.DOMAIN_EVENT_STOPPED_DESTROYED)}
		st := waitFor(t, w, r.Spec.ID, ports.VMStopped)
		if st.Reason != tc.reason || (tc.reason == "Watchdog" && (st.ExitCode != 1 || !strings.Contains(st.Message, "i6300esb watchdog, which did poweroff"))) {
			t.Errorf("watchdog %s, then stopped: %d %s %q", tc.action, st.ExitCode, st.Reason, st.Message)
		}
	}
}
