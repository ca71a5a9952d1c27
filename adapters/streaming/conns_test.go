package streaming

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// hijackingServer is a Server whose handler does what the streaming
// library does with a stream's connection: it hijacks it, and runs the
// session with the request's context (sessionContext) until it ends.
func hijackingServer(t *testing.T, sessions chan<- context.Context) *Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	set := &conns{open: map[*clientConn]struct{}{}}
	log := logrus.New()
	log.SetOutput(io.Discard)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprint(buf, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		buf.Flush()
		// Like SPDY, keep reading the connection through the server's
		// buffered reader.
		go io.Copy(io.Discard, buf)
		ctx, cancel := sessionContext(r.Context())
		defer cancel()
		sessions <- ctx
		<-ctx.Done()
	})
	return &Server{listener: &trackingListener{Listener: l, set: set}, conns: set, log: log,
		http: &http.Server{Handler: handler, ConnContext: withConn}}
}

func upgrade(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /exec/x HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n", addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return c
}

func ended(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatalf("%s: the session's context did not end", what)
	}
}

// http.Server.Close leaves hijacked connections open: Serve closes them
// too when it stops, and their sessions end.
func TestServeClosesHijackedStreams(t *testing.T) {
	sessions := make(chan context.Context, 1)
	s := hijackingServer(t, sessions)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	client := upgrade(t, s.listener.Addr().String())
	defer client.Close()
	session := <-sessions
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	client.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the hijacked stream after Serve stopped: read %v, want EOF (closed by the server)", err)
	}
	ended(t, session, "server stopped")
	if n := s.conns.count(); n != 0 {
		t.Fatalf("%d connections still tracked", n)
	}
}

// A session ends when its client's connection goes.
func TestSessionEndsWithItsConnection(t *testing.T) {
	sessions := make(chan context.Context, 1)
	s := hijackingServer(t, sessions)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go s.Serve(ctx)
	client := upgrade(t, s.listener.Addr().String())
	session := <-sessions
	select {
	case <-session.Done():
		t.Fatal("the session ended while its client was connected")
	case <-time.After(200 * time.Millisecond):
	}
	client.Close()
	ended(t, session, "client gone")
}
