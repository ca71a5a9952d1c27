package streaming

import (
	"context"
	"errors"
	"net"
	"sync"
)

// The streaming library hijacks each stream's connection from the HTTP
// server: http.Server.Close then no longer closes it, and the server no
// longer watches it. The listener below tracks every accepted connection
// so that the server closes them all when it stops, and so that a
// session's context ends when its connection does (the client went, or
// the server stopped), whatever net/http does with the request's context
// of a hijacked connection.

// conns tracks the server's open client connections.
type conns struct {
	mu     sync.Mutex
	open   map[*clientConn]struct{}
	closed bool
}

// clientConn is one client connection; gone is closed when a read fails
// for another reason than a deadline (the client went) or it is closed.
type clientConn struct {
	net.Conn
	set  *conns
	gone chan struct{}
	once sync.Once
}

func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		// A timeout is net/http aborting its own background read when
		// the connection is hijacked, not the client leaving.
		c.end()
	}
	return n, err
}

func (c *clientConn) Close() error {
	c.end()
	return c.Conn.Close()
}

func (c *clientConn) end() {
	c.once.Do(func() {
		close(c.gone)
		c.set.mu.Lock()
		delete(c.set.open, c)
		c.set.mu.Unlock()
	})
}

// closeAll closes every open connection, and any accepted later.
func (s *conns) closeAll() {
	s.mu.Lock()
	s.closed = true
	open := make([]*clientConn, 0, len(s.open))
	for c := range s.open {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// count is the number of open connections.
func (s *conns) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// trackingListener wraps the accepted connections into clientConns.
type trackingListener struct {
	net.Listener
	set *conns
}

func (l *trackingListener) Accept() (net.Conn, error) {
	raw, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &clientConn{Conn: raw, set: l.set, gone: make(chan struct{})}
	l.set.mu.Lock()
	closed := l.set.closed
	if !closed {
		l.set.open[c] = struct{}{}
	}
	l.set.mu.Unlock()
	if closed {
		raw.Close()
		return nil, net.ErrClosed
	}
	return c, nil
}

type connKey struct{}

// withConn is the HTTP server's ConnContext: requests carry their
// connection.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*clientConn); ok {
		return context.WithValue(ctx, connKey{}, cc)
	}
	return ctx
}

// sessionContext is ctx, also ended when the request's connection ends.
func sessionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if c, ok := ctx.Value(connKey{}).(*clientConn); ok {
		go func() {
			select {
			case <-c.gone:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}
