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

// dial opens a connection to the configured libvirtd, with keepalives
// (what names it in the log).
func (h *Hypervisor) dial(what string) (*libvirt.Connect, string, error) {
	h.mu.Lock()
	uri := h.cfg.URI
	h.mu.Unlock()
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, uri, err
	}
	if err := conn.SetKeepAlive(5, 3); err != nil {
		h.log.WithError(err).WithField("connection", what).Warn("libvirt keepalive")
	}
	return conn, uri, nil
}

// connect opens the libvirt connection and subscribes to lifecycle events.
func (h *Hypervisor) connect() error {
	conn, uri, err := h.dial("main")
	if err != nil {
		h.setConnErr(err)
		return fmt.Errorf("connect to libvirtd at %s: %v: %w", uri, err, ports.ErrUnavailable)
	}
	id, err := conn.DomainEventLifecycleRegister(nil, h.onLifecycle)
	if err != nil {
		conn.Close()
		return fmt.Errorf("subscribe to libvirt events: %w", err)
	}
	wid, err := conn.DomainEventWatchdogRegister(nil, h.onWatchdog)
	if err != nil {
		conn.DomainEventDeregister(id)
		conn.Close()
		return fmt.Errorf("subscribe to libvirt watchdog events: %w", err)
	}
	if err := conn.RegisterCloseCallback(h.onClose); err != nil {
		h.log.WithError(err).Warn("libvirt close callback")
	}
	h.mu.Lock()
	old, oldIDs := h.conn, h.callbackIDs
	h.conn, h.callbackIDs, h.connErr = conn, []int{id, wid}, nil
	h.mu.Unlock()
	if old != nil {
		h.hangUp(old, oldIDs)
	}
	h.log.WithField("uri", uri).Info("connected to libvirtd")
	return nil
}

func (h *Hypervisor) setConnErr(err error) {
	h.mu.Lock()
	h.conn, h.connErr = nil, err
	h.mu.Unlock()
}

// onClose runs (on libvirt's event loop) when libvirtd goes away: the
// watchers are ended (the core then resynchronises), and in the background
// the dead connection is released and a new one opened.
func (h *Hypervisor) onClose(_ *libvirt.Connect, reason libvirt.ConnectCloseReason) {
	h.mu.Lock()
	old, oldIDs := h.conn, h.callbackIDs
	h.conn, h.connErr = nil, fmt.Errorf("the connection closed (reason %d)", reason)
	already := h.reconnecting
	h.reconnecting = true
	h.mu.Unlock()
	if already {
		return
	}
	h.log.WithField("reason", reason).Error("lost the libvirtd connection; reconnecting")
	h.endWatches()
	go func() {
		if old != nil {
			h.hangUp(old, oldIDs)
		}
		for backoff := 200 * time.Millisecond; ; backoff = min(backoff*2, 10*time.Second) {
			time.Sleep(backoff)
			if err := h.connect(); err == nil {
				h.mu.Lock()
				h.reconnecting = false
				h.mu.Unlock()
				h.resume()
				h.sweepPool()
				h.syncGrants()
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
func (h *Hypervisor) hangUp(conn *libvirt.Connect, callbackIDs []int) {
	for _, id := range callbackIDs {
		if err := conn.DomainEventDeregister(id); err != nil {
			h.log.WithError(err).Debug("deregister events of the old libvirt connection")
		}
	}
	if err := conn.UnregisterCloseCallback(); err != nil {
		h.log.WithError(err).Debug("unregister the close callback of the old libvirt connection")
	}
	// Domains still held by calls in flight keep it referenced until
	// they are freed.
	if refs, err := conn.Close(); err != nil || refs > 0 {
		h.log.WithError(err).WithField("references", refs).Debug("old libvirt connection still referenced")
	}
}

// connection returns the live connection or says why there is none.
func (h *Hypervisor) connection() (*libvirt.Connect, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		if !h.ready && h.connErr == nil {
			return nil, fmt.Errorf("the libvirt plugin is not configured yet: %w", ports.ErrUnavailable)
		}
		return nil, fmt.Errorf("libvirtd at %s is unreachable: %v: %w", h.cfg.URI, h.connErr, ports.ErrUnavailable)
	}
	return h.conn, nil
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
