package libvirt

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
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
// h.mu and must not wait for consoles.mu (which OpenConsole holds while it
// opens the stream), or every plugin call hangs behind h.mu.
func TestVMStopDoesNotWaitForTheConsoleLock(t *testing.T) {
	h := New(quietLog())
	r := &record{Spec: ports.VMSpec{ID: "0123456789abcdef", Name: "virtlet-0123456789ab-lock"}, State: ports.VMRunning}
	h.records[r.Spec.ID] = r
	h.consoles.mu.Lock() // a viewer is attaching
	done := make(chan struct{})
	go func() {
		h.mu.Lock()
		h.reconciler.exitLocked(r, exit{code: 0, reason: "Completed"})
		h.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		h.consoles.mu.Unlock()
		<-done
		t.Fatal("recording a VM's end (under h.mu) waited for consoles.mu: lock-order inversion with OpenConsole")
	}
	h.consoles.mu.Unlock()
}

// stubStream stands in for a libvirt console stream and records misuse:
// any call after Free is a use after free in libvirt.
type stubStream struct {
	mu     sync.Mutex
	freed  bool
	misuse []string
	sent   bytes.Buffer
	output chan []byte
	ended  chan struct{}
	once   sync.Once
}

func newStubStream() *stubStream {
	return &stubStream{output: make(chan []byte, 16), ended: make(chan struct{})}
}

func (s *stubStream) check(call string) {
	if s.freed {
		s.misuse = append(s.misuse, call+" after Free")
	}
}

// end finishes the stream as libvirt does when the VM stops.
func (s *stubStream) end() { s.once.Do(func() { close(s.ended) }) }

func (s *stubStream) Recv(p []byte) (int, error) {
	select {
	case b := <-s.output:
		return copy(p, b), nil
	case <-s.ended:
		return 0, nil
	}
}

func (s *stubStream) Send(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check("Send")
	return s.sent.Write(p)
}

func (s *stubStream) Abort() error {
	s.mu.Lock()
	s.check("Abort")
	s.mu.Unlock()
	s.end()
	return nil
}

func (s *stubStream) Free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check("Free")
	s.freed = true
	return nil
}

func (s *stubStream) misused() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.misuse...)
}

func (s *stubStream) isFreed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freed
}

const stubVM = "0123456789abcdef"

func attachStub(t *testing.T, h *Hypervisor, s *stubStream) *consoleViewer {
	t.Helper()
	v, err := h.consoles.attach(stubVM, 0, quietLog(), func() (consoleStream, error) { return s, nil })
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// readEnds reads v until it ends and reports the error (nil for EOF), or
// fails the test when it does not end in time.
func readEnds(t *testing.T, v io.Reader, what string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, v)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the viewer's output never ended", what)
		return nil
	}
}

// A viewer typing while the VM stops: the stream is freed by the reader,
// and no Send (or Abort) may reach it afterwards.
func TestConsoleWriteNeverTouchesAFreedStream(t *testing.T) {
	for i := 0; i < 300; i++ {
		h := New(quietLog())
		s := newStubStream()
		v := attachStub(t, h, s)
		typing := make(chan error, 1)
		go func() {
			for {
				if _, err := v.Write([]byte("x")); err != nil {
					typing <- err
					return
				}
			}
		}()
		s.end() // the VM stops
		select {
		case <-typing:
		case <-time.After(5 * time.Second):
			t.Fatal("writes to the console of a stopped VM never failed")
		}
		if err := readEnds(t, v, "stopped VM"); err != nil {
			t.Fatalf("a viewer of a stopped VM: %v, want EOF", err)
		}
		v.Close()
		deadline := time.Now().Add(5 * time.Second)
		for !s.isFreed() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if m := s.misused(); len(m) > 0 || !s.isFreed() {
			t.Fatalf("round %d: stream misused %v (freed %v)", i, m, s.isFreed())
		}
	}
}

// Viewers attaching while the hub closes (its last viewer left, the VM
// stopped): none lands in a closed hub, where it would wait forever.
func TestConsoleViewerNeverJoinsAClosedHub(t *testing.T) {
	h := New(quietLog())
	var mu sync.Mutex
	var streams []*stubStream
	open := func() (consoleStream, error) {
		s := newStubStream()
		mu.Lock()
		streams = append(streams, s)
		mu.Unlock()
		return s, nil
	}
	var viewers []*consoleViewer
	stop := make(chan struct{})
	closer := make(chan struct{})
	go func() {
		defer close(closer)
		for {
			select {
			case <-stop:
				return
			default:
				h.consoles.close(stubVM, allRuns)
				runtime.Gosched()
			}
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				v, err := h.consoles.attach(stubVM, 0, quietLog(), open)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				viewers = append(viewers, v)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-closer
	h.consoles.close(stubVM, allRuns)
	for i, v := range viewers {
		if err := readEnds(t, v, fmt.Sprintf("viewer %d", i)); err != nil {
			t.Fatalf("viewer %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range streams {
		if m := s.misused(); len(m) > 0 {
			t.Fatalf("stream misused: %v", m)
		}
	}
}

// waitHubGone waits until the VM has no hub and its stream was freed.
func waitHubGone(t *testing.T, h *Hypervisor, s *stubStream, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.consoles.mu.Lock()
		hub := h.consoles.hubs[stubVM]
		h.consoles.mu.Unlock()
		if hub == nil && s.isFreed() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the hub is still open (in the map: %v, stream freed: %v)", what, hub != nil, s.isFreed())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A viewer that stops reading is dropped; when it was the last one, the
// hub and its libvirt stream close (else `virsh console` stays refused
// until the VM stops), whether or not its owner closes it.
func TestConsoleLaggingLastViewerClosesTheHub(t *testing.T) {
	for _, closes := range []bool{true, false} {
		h := New(quietLog())
		s := newStubStream()
		v := attachStub(t, h, s)
		go func() {
			for i := 0; i <= viewerBacklog+1; i++ {
				select {
				case s.output <- []byte("line\r\n"):
				case <-s.ended:
					return
				}
			}
		}()
		deadline := time.Now().Add(5 * time.Second)
		for {
			select {
			case <-v.gone:
			default:
				if time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
					continue
				}
				t.Fatal("a viewer that never reads was not dropped")
			}
			break
		}
		_, err := io.Copy(io.Discard, v)
		if err == nil || !strings.Contains(err.Error(), "fell too far behind") {
			t.Fatalf("the lagging viewer's end: %v", err)
		}
		if closes {
			v.Close()
		}
		waitHubGone(t, h, s, fmt.Sprintf("lagging viewer dropped (closed by its owner: %v)", closes))
		if m := s.misused(); len(m) > 0 {
			t.Fatalf("stream misused: %v", m)
		}
	}
}

// A lagging viewer dropped while another watches leaves the hub open for
// the other.
func TestConsoleLaggingViewerLeavesOthersWatching(t *testing.T) {
	h := New(quietLog())
	s := newStubStream()
	lagging := attachStub(t, h, s)
	other := attachStub(t, h, s)
	got := make(chan int, 1)
	go func() {
		n, _ := io.Copy(io.Discard, other)
		got <- int(n)
	}()
	// The other viewer drains its backlog before the lagging one's
	// overflows: a reader the scheduler has not run yet lags too.
	for i := 0; i < viewerBacklog; i++ {
		s.output <- []byte("x")
	}
	for deadline := time.Now().Add(5 * time.Second); len(other.out) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watching viewer never read its backlog")
		}
	}
	s.output <- []byte("x")
	s.output <- []byte("x")
	<-lagging.gone
	lagging.Close()
	time.Sleep(50 * time.Millisecond)
	h.consoles.mu.Lock()
	hub := h.consoles.hubs[stubVM]
	h.consoles.mu.Unlock()
	if hub == nil || s.isFreed() {
		t.Fatal("the hub closed while a viewer still watches")
	}
	other.Close()
	if n := <-got; n < viewerBacklog {
		t.Fatalf("the watching viewer got %d bytes", n)
	}
	waitHubGone(t, h, s, "the last viewer left")
}
