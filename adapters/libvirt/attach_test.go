package libvirt

import (
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// A VM that stops while a viewer is attaching: the event handler holds
// h.mu and must not wait for consoleMu (which OpenConsole holds while it
// opens the stream), or every plugin call hangs behind h.mu.
func TestVMStopDoesNotWaitForTheConsoleLock(t *testing.T) {
	h := New(quietLog())
	r := &record{Spec: ports.VMSpec{ID: "0123456789abcdef", Name: "virtlet-0123456789ab-lock"}, State: ports.VMRunning}
	h.records[r.Spec.ID] = r
	h.consoleMu.Lock() // a viewer is attaching
	done := make(chan struct{})
	go func() {
		h.mu.Lock()
		h.exitLocked(r, exit{code: 0, reason: "Completed"})
		h.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		h.consoleMu.Unlock()
		<-done
		t.Fatal("recording a VM's end (under h.mu) waited for consoleMu: lock-order inversion with OpenConsole")
	}
	h.consoleMu.Unlock()
}
