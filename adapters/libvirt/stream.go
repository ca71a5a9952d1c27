package libvirt

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"libvirt.org/go/libvirt"
)

// serialStream is a console stream whose libvirt calls never overlap. A
// libvirt stream is not safe for concurrent use: an Abort while another
// goroutine is blocked in Recv on it can upset the remote client, which
// then closes the whole connection ("client socket is closed"), taking
// every call of the plugin down with it. So the stream is non-blocking,
// every call on it holds mu, and Recv waits for data outside the lock:
// woken by libvirt's readable event, by Abort, or by a short poll.
type serialStream struct {
	mu       sync.Mutex
	s        *libvirt.Stream
	done     bool // aborted, or ended: Recv reports the end
	freed    bool
	readable chan struct{}
	aborted  chan struct{}
	once     sync.Once
	// conn, when set, is the stream's own connection, closed by Free;
	// lost is set when it closed under the stream.
	conn *libvirt.Connect
	lost atomic.Bool
}

// errConnectionLost is what Recv and Send return once the stream's own
// connection closed: libvirt's stream calls on it would only report that
// they would block.
var errConnectionLost = errors.New("libvirtd closed the console's connection")

// ownConnection makes conn the stream's own: Free closes it, and when
// libvirtd closes it first (its close callback, on libvirt's event loop)
// Recv and Send end.
func (ss *serialStream) ownConnection(conn *libvirt.Connect) {
	ss.conn = conn
	// Were it refused, a dropped connection would show only as a stream
	// that stays silent until the VM stops.
	lost := func() {
		ss.lost.Store(true)
		ss.once.Do(func() { close(ss.aborted) })
	}
	_ = conn.RegisterCloseCallback(func(*libvirt.Connect, libvirt.ConnectCloseReason) { lost() })
	// A connection that closed before the callback was registered never
	// calls it.
	if alive, err := conn.IsAlive(); err != nil || !alive {
		lost()
	}
}

// pollEvery bounds how long Recv waits for a readable event that did not
// come.
const pollEvery = 250 * time.Millisecond

// newSerialStream opens a non-blocking stream on conn; open connects it
// (the console), then the stream watches for data.
func newSerialStream(conn *libvirt.Connect, open func(*libvirt.Stream) error) (*serialStream, error) {
	s, err := conn.NewStream(libvirt.STREAM_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if err := open(s); err != nil {
		s.Free()
		return nil, err
	}
	ss := &serialStream{s: s, readable: make(chan struct{}, 1), aborted: make(chan struct{})}
	// The callback runs on libvirt's event loop: it only signals.
	if err := s.EventAddCallback(libvirt.STREAM_EVENT_READABLE|libvirt.STREAM_EVENT_HANGUP|libvirt.STREAM_EVENT_ERROR,
		func(*libvirt.Stream, libvirt.StreamEventType) {
			select {
			case ss.readable <- struct{}{}:
			default:
			}
		}); err != nil {
		// Without events Recv polls.
		ss.readable = nil
	}
	return ss, nil
}

// Recv returns what the console sent, (0, nil) once the stream ended or
// was aborted, or libvirt's error.
func (ss *serialStream) Recv(p []byte) (int, error) {
	for {
		if ss.lost.Load() {
			return 0, errConnectionLost
		}
		ss.mu.Lock()
		if ss.done || ss.freed {
			ss.mu.Unlock()
			return 0, nil
		}
		n, err := ss.s.Recv(p)
		if n == 0 && err != nil {
			ss.done = true
		}
		ss.mu.Unlock()
		if n != -2 {
			return max(n, 0), err
		}
		select {
		case <-ss.readable:
		case <-ss.aborted:
		case <-time.After(pollEvery):
		}
	}
}

// Send writes p, waiting while the stream would block.
func (ss *serialStream) Send(p []byte) (int, error) {
	for {
		if ss.lost.Load() {
			return 0, errConnectionLost
		}
		ss.mu.Lock()
		if ss.done || ss.freed {
			ss.mu.Unlock()
			return 0, libvirt.Error{Code: libvirt.ERR_RPC, Message: "the console stream ended"}
		}
		n, err := ss.s.Send(p)
		ss.mu.Unlock()
		if n != -2 {
			return n, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Abort ends the stream; a Recv waiting returns its end.
func (ss *serialStream) Abort() error {
	ss.mu.Lock()
	var err error
	if !ss.done && !ss.freed {
		ss.done = true
		err = ss.s.Abort()
	}
	ss.mu.Unlock()
	ss.once.Do(func() { close(ss.aborted) })
	return err
}

// Free releases the stream (aborting it first unless it ended), then
// its own connection, if it has one.
func (ss *serialStream) Free() error {
	ss.mu.Lock()
	if ss.freed {
		ss.mu.Unlock()
		return nil
	}
	if ss.readable != nil {
		ss.s.EventRemoveCallback()
	}
	if !ss.done {
		ss.s.Abort()
		ss.done = true
	}
	ss.freed = true
	err := ss.s.Free()
	ss.mu.Unlock()
	if ss.conn != nil {
		// Outside mu: the close callback may be running. Its
		// registration holds a reference that Close alone would keep.
		ss.conn.UnregisterCloseCallback()
		ss.conn.Close()
	}
	return err
}

var _ consoleStream = (*serialStream)(nil)
