package libvirt

import (
	"fmt"
	"sync"

	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// sideConn is a libvirt connection of its own for one kind of call that
// must not share the main connection (guest-agent commands, which hold
// libvirtd's per-connection request slots; console streams, whose failure
// as a domain stops can cost libvirtd the connection that carries them),
// opened on first use and again once libvirtd has dropped it. Its lock
// guards the connection; the connection's lock may be taken inside it,
// h.mu never is.
type sideConn struct {
	what  string // "guest agent", "console"
	dial  func(what string) (*libvirt.Connect, string, error)
	ready func() bool

	mu   sync.Mutex
	conn *libvirt.Connect
}

// get returns the connection, opening it when needed, with a reference
// the caller releases with Close.
func (s *sideConn) get() (*libvirt.Connect, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		if alive, err := s.conn.IsAlive(); err != nil || !alive {
			s.conn.Close()
			s.conn = nil
		}
	}
	if s.conn == nil {
		// A call that began before close opens nothing after it.
		if !s.ready() {
			return nil, fmt.Errorf("the libvirt plugin is not configured or is closing: %w", ports.ErrUnavailable)
		}
		conn, uri, err := s.dial(s.what)
		if err != nil {
			return nil, fmt.Errorf("connect to libvirtd at %s for %s calls: %v: %w", uri, s.what, err, ports.ErrUnavailable)
		}
		s.conn = conn
	}
	if err := s.conn.Ref(); err != nil {
		return nil, libvirtError("reference the "+s.what+" connection", err)
	}
	return s.conn, nil
}

// domain returns the VM's domain on this connection.
func (s *sideConn) domain(r *record) (*libvirt.Domain, error) {
	conn, err := s.get()
	if err != nil {
		return nil, err
	}
	// The lookup may wait behind other calls on that connection: it runs
	// outside s.mu, with a reference of its own on it.
	defer conn.Close()
	dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
	if err != nil {
		return nil, libvirtError("look up domain "+r.Spec.Name+" for its "+s.what, err)
	}
	return dom, nil
}

// hangUp closes the connection (the adapter is closing); calls still in
// flight hold their own references.
func (s *sideConn) hangUp() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}
