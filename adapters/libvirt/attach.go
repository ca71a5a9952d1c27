package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// Attaching to the serial console. libvirt gives one console stream per
// domain at a time (a second open fails unless it forces the first off),
// so the plugin holds one stream per VM and fans it out: every viewer sees
// all output from the moment it attached, and what any viewer types goes
// to the console. The stream reads the same pty whose output virtlogd
// also writes to the raw log, so the CRI log keeps growing while viewers
// are attached. The last viewer to leave closes the stream (QEMU then
// discards output nobody reads, and the log still gets all of it). The
// stream's libvirt calls never overlap (serialStream): an Abort racing a
// blocked Recv made libvirt close the plugin's whole connection. Each
// stream also has a libvirt connection of its own: libvirtd still, rarely,
// closes a client's connection when a console is opened on a domain that
// is stopping, and that must cost the console, not the calls that stop
// and start VMs.
//
// Locks, always taken in this order and never h.mu with any of them:
// consoles.mu (its hubs) → hub.mu (its viewers, closed) → hub.sendMu (one
// writer at a time) → hub.streamMu (the stream's life: users hold it
// shared, Free exclusively).

// viewerBacklog is how much output (in chunks) a viewer may fall behind
// before it is detached; a serial line at 115200 baud cannot outrun a
// viewer that reads at all.
const viewerBacklog = 1024

// consoleStream is what the hub uses of a libvirt stream.
type consoleStream interface {
	Recv(p []byte) (int, error)
	Send(p []byte) (int, error)
	Abort() error
	Free() error
}

// consoles holds the console hubs, one per VM whose console is open
// (OpenConsole).
type consoles struct {
	log logrus.FieldLogger
	vms vmSource
	// live says whether the adapter is connected (configured and not
	// closing); dial opens a console's own connection.
	live func() (*libvirt.Connect, error)
	dial func(what string) (*libvirt.Connect, string, error)

	mu   sync.Mutex
	hubs map[string]*consoleHub
}

type consoleHub struct {
	set *consoles
	id  string
	run uint64 // the VM's run (record.runs) the stream belongs to
	log logrus.FieldLogger

	stream consoleStream
	sendMu sync.Mutex
	// streamMu guards the stream's life: Send and Abort hold it shared
	// and check freed; the reader frees the stream holding it alone.
	streamMu sync.RWMutex
	freed    bool

	mu      sync.Mutex
	viewers map[*consoleViewer]struct{}
	closed  bool
}

type consoleViewer struct {
	hub       *consoleHub
	out       chan []byte
	gone      chan struct{}
	err       error // why the viewer was detached (nil: EOF)
	once      sync.Once
	closeOnce sync.Once
	buf       []byte
}

// OpenConsole attaches a viewer to the running VM's serial console.
//
// Lock order: h.mu is never held while c.mu is taken, nor c.mu while h.mu
// is taken (a VM's end is recorded under h.mu and closes its console
// asynchronously): everything needed from h.mu is read first.
func (c *consoles) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	r, dom, err := c.vms.lookup(id)
	if err != nil {
		return nil, err
	}
	defer dom.Free()
	if state, _, err := dom.GetState(); err != nil || state != libvirt.DOMAIN_RUNNING {
		return nil, fmt.Errorf("console of VM %s: the VM is not running: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	uuid, err := dom.GetUUIDString()
	if err != nil {
		return nil, libvirtError("console of "+r.Spec.Name, err)
	}
	if _, err := c.live(); err != nil {
		return nil, err
	}
	var run uint64
	c.vms.locked(func() { run = r.runs })
	return c.attach(id, run, c.log.WithField("vm", r.Spec.Name), func() (consoleStream, error) {
		return openConsoleStream(c.dial, r.Spec.Name, uuid)
	})
}

// consoleOpenTimeout bounds libvirtd's answer to opening a console: a
// domain that stops at that moment can leave the call unanswered (seen
// with libvirt 9.0), and the console lock is held meanwhile.
const consoleOpenTimeout = 15 * time.Second

// openConsoleStream opens the console stream of the VM (name, its
// domain's uuid) on a connection of its own, which the stream's Free
// closes; it takes no lock of the adapter's. libvirtd's answer is awaited
// for consoleOpenTimeout at most: a call it never answers then ends in an
// error, and a stream it opens after that is closed.
func openConsoleStream(dial func(string) (*libvirt.Connect, string, error), name, uuid string) (consoleStream, error) {
	type opened struct {
		stream  *serialStream
		err     error
		reached bool
	}
	done := make(chan opened, 1)
	go func() {
		var o opened
		defer func() { done <- o }()
		conn, uri, err := dial("console of " + name)
		if err != nil {
			o.err = fmt.Errorf("connect to libvirtd at %s for the console of %s: %v: %w", uri, name, err, ports.ErrUnavailable)
			return
		}
		dom, err := conn.LookupDomainByUUIDString(uuid)
		if err != nil {
			conn.Close()
			o.err = libvirtError("console of "+name, err)
			return
		}
		defer dom.Free()
		o.stream, err = newSerialStream(conn, func(s *libvirt.Stream) error {
			o.reached = true
			// SAFE: refuse rather than take the console from someone
			// else (an operator's virsh console).
			return dom.OpenConsole("", s, libvirt.DOMAIN_CONSOLE_SAFE)
		})
		if err != nil {
			conn.Close()
			o.err = libvirtError("console stream of "+name, err)
			if o.reached {
				o.err = fmt.Errorf("%w (another console session, e.g. virsh console, may hold it)",
					libvirtError("open the serial console of "+name, err))
			}
			return
		}
		o.stream.ownConnection(conn)
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return nil, o.err
		}
		return o.stream, nil
	case <-time.After(consoleOpenTimeout):
		go func() {
			if late := <-done; late.stream != nil {
				late.stream.Free() // aborts it and closes its connection
			}
		}()
		return nil, fmt.Errorf("console of VM %s: libvirtd did not open it within %s: %w", name, consoleOpenTimeout, ports.ErrUnavailable)
	}
}

// attach adds a viewer to the VM's hub, opening one (open) when there is
// none or the one there closed. A viewer joins a hub only while the hub
// is open: a hub closing at the same moment is replaced.
func (c *consoles) attach(id string, run uint64, log logrus.FieldLogger, open func() (consoleStream, error)) (*consoleViewer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		hub := c.hubs[id]
		if hub == nil || hub.isClosed() {
			stream, err := open()
			if err != nil {
				return nil, err
			}
			hub = &consoleHub{set: c, id: id, run: run, stream: stream, viewers: map[*consoleViewer]struct{}{}, log: log}
			if c.hubs == nil {
				c.hubs = map[string]*consoleHub{}
			}
			c.hubs[id] = hub
			go hub.read()
		}
		v := &consoleViewer{hub: hub, out: make(chan []byte, viewerBacklog), gone: make(chan struct{})}
		if n, ok := hub.add(v); ok {
			hub.log.WithField("viewers", n).Info("console viewer attached")
			return v, nil
		}
		// The hub closed after the check above: open another.
	}
}

// add joins v to the hub unless it closed; it returns the viewer count.
func (hub *consoleHub) add(v *consoleViewer) (int, bool) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.closed {
		return 0, false
	}
	hub.viewers[v] = struct{}{}
	return len(hub.viewers), true
}

// read copies the console's output to every viewer until the stream ends
// (the VM stopped) or the hub closes (the last viewer left), then frees
// the stream: only this goroutine frees it, once Recv returned.
func (hub *consoleHub) read() {
	buf := make([]byte, 32<<10)
	var err error
	for {
		var n int
		n, err = hub.stream.Recv(buf)
		if n > 0 {
			hub.broadcast(buf[:n])
			continue
		}
		if err == nil {
			err = io.EOF // the stream finished: the VM stopped
		}
		break
	}
	if !hub.isClosed() && !errors.Is(err, io.EOF) {
		hub.log.WithError(err).Info("console stream ended")
		err = fmt.Errorf("the console stream ended: %w", err)
	}
	hub.close(err) // no-op when closed because nobody watches
	hub.streamMu.Lock()
	hub.freed = true
	hub.stream.Free()
	hub.streamMu.Unlock()
}

func (hub *consoleHub) broadcast(p []byte) {
	hub.mu.Lock()
	dropped := false
	for v := range hub.viewers {
		select {
		case v.out <- append([]byte(nil), p...):
		default:
			delete(hub.viewers, v)
			v.detach(errors.New("detached: this viewer fell too far behind the console's output"))
			dropped = true
		}
	}
	hub.mu.Unlock()
	if dropped {
		hub.log.Warn("console viewer dropped: it fell too far behind")
		hub.closeIfUnwatched()
	}
}

func (hub *consoleHub) isClosed() bool {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return hub.closed
}

// close ends the stream and every viewer (err nil: end of output).
func (hub *consoleHub) close(err error) { hub.shutdown(err, false) }

// closeIfUnwatched closes the hub when no viewer is attached: checked and
// done under hub.mu, so a viewer joining meanwhile keeps it open.
func (hub *consoleHub) closeIfUnwatched() { hub.shutdown(io.EOF, true) }

func (hub *consoleHub) shutdown(err error, onlyUnwatched bool) {
	hub.mu.Lock()
	if hub.closed || (onlyUnwatched && len(hub.viewers) > 0) {
		hub.mu.Unlock()
		return
	}
	hub.closed = true
	viewers := hub.viewers
	hub.viewers = map[*consoleViewer]struct{}{}
	hub.mu.Unlock()
	for v := range viewers {
		v.detach(err)
	}
	hub.abort() // wakes read, which frees the stream
	hub.set.mu.Lock()
	if hub.set.hubs[hub.id] == hub {
		delete(hub.set.hubs, hub.id)
	}
	hub.set.mu.Unlock()
}

// abort aborts the stream unless it was freed already.
func (hub *consoleHub) abort() {
	hub.streamMu.RLock()
	defer hub.streamMu.RUnlock()
	if !hub.freed {
		hub.stream.Abort()
	}
}

// send writes p to the console; a freed stream is a closed pipe.
func (hub *consoleHub) send(p []byte) (int, error) {
	hub.sendMu.Lock()
	defer hub.sendMu.Unlock()
	hub.streamMu.RLock()
	defer hub.streamMu.RUnlock()
	if hub.freed {
		return 0, io.ErrClosedPipe
	}
	written := 0
	for written < len(p) {
		n, err := hub.stream.Send(p[written:])
		if err != nil {
			return written, libvirtError("write to the console", err)
		}
		written += n
	}
	return written, nil
}

// leave takes v out (it may be out already: dropped for lagging) and
// closes the hub when nobody watches any more.
func (hub *consoleHub) leave(v *consoleViewer) {
	hub.mu.Lock()
	delete(hub.viewers, v)
	hub.mu.Unlock()
	hub.log.Info("console viewer detached")
	hub.closeIfUnwatched()
}

func (v *consoleViewer) detach(err error) {
	v.once.Do(func() {
		if err != io.EOF {
			v.err = err
		}
		close(v.gone)
	})
}

func (v *consoleViewer) Read(p []byte) (int, error) {
	for len(v.buf) == 0 {
		select {
		case b := <-v.out:
			v.buf = b
		case <-v.gone:
			select {
			case b := <-v.out: // output that arrived before the end
				v.buf = b
				continue
			default:
			}
			if v.err != nil {
				return 0, v.err
			}
			return 0, io.EOF
		}
	}
	n := copy(p, v.buf)
	v.buf = v.buf[n:]
	return n, nil
}

func (v *consoleViewer) Write(p []byte) (int, error) {
	select {
	case <-v.gone:
		return 0, io.ErrClosedPipe
	default:
	}
	return v.hub.send(p)
}

// Close detaches the viewer; it always leaves the hub, even when the
// viewer was dropped already, so that the last one out closes it.
func (v *consoleViewer) Close() error {
	v.closeOnce.Do(func() {
		v.detach(io.EOF)
		v.hub.leave(v)
	})
	return nil
}

// allRuns closes a VM's console whichever run it belongs to.
const allRuns = ^uint64(0)

// close ends the console stream of a VM that stopped (run: the run that
// ended; a stream of a later run is left alone) or went. It takes c.mu:
// callers must not hold h.mu (exitLocked runs it in a goroutine).
func (c *consoles) close(id string, run uint64) {
	c.mu.Lock()
	hub := c.hubs[id]
	c.mu.Unlock()
	if hub != nil && hub.run <= run {
		hub.close(io.EOF)
	}
}

// closeAll ends every console (the adapter is closing).
func (c *consoles) closeAll() {
	c.mu.Lock()
	hubs := make([]*consoleHub, 0, len(c.hubs))
	for _, hub := range c.hubs {
		hubs = append(hubs, hub)
	}
	c.mu.Unlock()
	for _, hub := range hubs {
		hub.close(io.EOF)
	}
}

// viewers counts the viewers of the VM's console, if it is open.
func (c *consoles) viewers(id string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hub := c.hubs[id]
	if hub == nil {
		return 0, false
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return len(hub.viewers), true
}

var _ ports.ConsoleOpener = (*Hypervisor)(nil)
