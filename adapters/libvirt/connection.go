// The connection to libvirtd: dialled at Configure, redialled when it
// closes, each connection with its event callbacks; libvirt's errors
// mapped to the ports' kinds.

package libvirt

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

var eventLoopOnce sync.Once

// startEventLoop runs libvirt's event loop, once per process; it must run
// before a connection is opened for the connection's events to arrive.
func startEventLoop(log logrus.FieldLogger) {
	eventLoopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			log.WithError(err).Error("register libvirt event loop")
			return
		}
		go func() {
			for {
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					log.WithError(err).Error("libvirt event loop")
					time.Sleep(time.Second)
				}
			}
		}()
	})
}

// connection is the adapter's connection to libvirtd. It owns its lock,
// taken alone: no other lock is taken while it is held.
type connection struct {
	log logrus.FieldLogger
	// onLifecycle and onWatchdog receive each connection's domain events;
	// lost runs when the connection closes, restored once a new one is up.
	onLifecycle libvirt.DomainEventLifecycleCallback
	onWatchdog  libvirt.DomainEventWatchdogCallback
	lost        func()
	restored    func()

	mu    sync.Mutex
	uri   string
	open  *libvirt.Connect
	err   error // why open is nil
	ready bool  // configured, and not closing
	// callbackIDs are open's event callbacks (lifecycle, watchdog);
	// reconnecting is set while a lost connection is being replaced.
	callbackIDs  []int
	reconnecting bool
}

// configure sets the URI the next dial opens.
func (c *connection) configure(uri string) {
	c.mu.Lock()
	c.uri = uri
	c.mu.Unlock()
}

// setReady marks the adapter configured (Configure is over).
func (c *connection) setReady() {
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
}

// isReady reports whether the adapter is configured and not closing.
func (c *connection) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

// dial opens a connection to the configured libvirtd, with keepalives
// (what names it in the log).
func (c *connection) dial(what string) (*libvirt.Connect, string, error) {
	c.mu.Lock()
	uri := c.uri
	c.mu.Unlock()
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, uri, err
	}
	if err := conn.SetKeepAlive(5, 3); err != nil {
		c.log.WithError(err).WithField("connection", what).Warn("libvirt keepalive")
	}
	return conn, uri, nil
}

// connect opens the libvirt connection and subscribes to lifecycle events.
func (c *connection) connect() error {
	conn, uri, err := c.dial("main")
	if err != nil {
		c.setErr(err)
		return fmt.Errorf("connect to libvirtd at %s: %v: %w", uri, err, ports.ErrUnavailable)
	}
	id, err := conn.DomainEventLifecycleRegister(nil, c.onLifecycle)
	if err != nil {
		conn.Close()
		return fmt.Errorf("subscribe to libvirt events: %w", err)
	}
	wid, err := conn.DomainEventWatchdogRegister(nil, c.onWatchdog)
	if err != nil {
		conn.DomainEventDeregister(id)
		conn.Close()
		return fmt.Errorf("subscribe to libvirt watchdog events: %w", err)
	}
	if err := conn.RegisterCloseCallback(c.onClose); err != nil {
		c.log.WithError(err).Warn("libvirt close callback")
	}
	c.mu.Lock()
	old, oldIDs := c.open, c.callbackIDs
	c.open, c.callbackIDs, c.err = conn, []int{id, wid}, nil
	c.mu.Unlock()
	if old != nil {
		c.hangUp(old, oldIDs)
	}
	c.log.WithField("uri", uri).Info("connected to libvirtd")
	return nil
}

func (c *connection) setErr(err error) {
	c.mu.Lock()
	c.open, c.err = nil, err
	c.mu.Unlock()
}

// onClose runs (on libvirt's event loop) when libvirtd goes away: lost
// runs (the watchers are ended, and the core resynchronises), and in the
// background the dead connection is released, a new one opened, and
// restored runs.
func (c *connection) onClose(_ *libvirt.Connect, reason libvirt.ConnectCloseReason) {
	c.mu.Lock()
	old, oldIDs := c.open, c.callbackIDs
	c.open, c.err = nil, fmt.Errorf("the connection closed (reason %d)", reason)
	already := c.reconnecting
	c.reconnecting = true
	c.mu.Unlock()
	if already {
		return
	}
	c.log.WithField("reason", reason).Error("lost the libvirtd connection; reconnecting")
	c.lost()
	go func() {
		if old != nil {
			c.hangUp(old, oldIDs)
		}
		for backoff := 200 * time.Millisecond; ; backoff = min(backoff*2, 10*time.Second) {
			time.Sleep(backoff)
			if err := c.connect(); err == nil {
				c.mu.Lock()
				c.reconnecting = false
				c.mu.Unlock()
				c.restored()
				return
			}
		}
	}()
}

// hangUp releases a connection the adapter no longer uses. Its callbacks
// hold references to it: without deregistering them, Close would leave
// the connection, its socket and the callbacks alive, and a later
// connection's events would arrive twice. On a dead connection the
// deregistrations fail after dropping the callbacks locally, which is all
// that is needed.
func (c *connection) hangUp(conn *libvirt.Connect, callbackIDs []int) {
	for _, id := range callbackIDs {
		if err := conn.DomainEventDeregister(id); err != nil {
			c.log.WithError(err).Debug("deregister events of the old libvirt connection")
		}
	}
	if err := conn.UnregisterCloseCallback(); err != nil {
		c.log.WithError(err).Debug("unregister the close callback of the old libvirt connection")
	}
	// Domains still held by calls in flight keep it referenced until
	// they are freed.
	if refs, err := conn.Close(); err != nil || refs > 0 {
		c.log.WithError(err).WithField("references", refs).Debug("old libvirt connection still referenced")
	}
}

// current returns the live connection or says why there is none.
func (c *connection) current() (*libvirt.Connect, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		if !c.ready && c.err == nil {
			return nil, fmt.Errorf("the libvirt plugin is not configured yet: %w", ports.ErrUnavailable)
		}
		return nil, fmt.Errorf("libvirtd at %s is unreachable: %v: %w", c.uri, c.err, ports.ErrUnavailable)
	}
	return c.open, nil
}

// drop forgets the connection and marks the adapter not ready (it is
// closing); the caller hangs the connection up.
func (c *connection) drop() (*libvirt.Connect, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, ids := c.open, c.callbackIDs
	c.open, c.ready = nil, false
	return conn, ids
}

// libvirtError classifies libvirt's errors into port error kinds.
func libvirtError(op string, err error) error {
	var le libvirt.Error
	if errors.As(err, &le) {
		msg := fmt.Sprintf("%s: %s", op, le.Message)
		switch le.Code {
		case libvirt.ERR_NO_DOMAIN:
			return fmt.Errorf("%s: %w", msg, ports.ErrNotFound)
		case libvirt.ERR_XML_ERROR, libvirt.ERR_CONFIG_UNSUPPORTED, libvirt.ERR_INVALID_ARG, libvirt.ERR_XML_DETAIL:
			return fmt.Errorf("%s: %w", msg, ports.ErrInvalidArgument)
		case libvirt.ERR_OPERATION_INVALID:
			return fmt.Errorf("%s: %w", msg, ports.ErrFailedPrecondition)
		case libvirt.ERR_SYSTEM_ERROR, libvirt.ERR_NO_CONNECT, libvirt.ERR_INTERNAL_ERROR:
			if strings.Contains(le.Message, "already exists") {
				return fmt.Errorf("%s: %w", msg, ports.ErrAlreadyExists)
			}
		}
		// The connection to libvirtd is gone: the caller may retry.
		if le.Domain == libvirt.FROM_RPC || le.Code == libvirt.ERR_NO_CONNECT || le.Code == libvirt.ERR_INVALID_CONN || le.Code == libvirt.ERR_RPC {
			return fmt.Errorf("%s (libvirtd unreachable): %w", msg, ports.ErrUnavailable)
		}
		if strings.Contains(le.Message, "already exists") {
			return fmt.Errorf("%s: %w", msg, ports.ErrAlreadyExists)
		}
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %w", op, err)
}
