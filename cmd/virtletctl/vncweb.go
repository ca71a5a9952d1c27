package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

// DefaultNoVNCDir is where Debian's novnc package puts noVNC.
const DefaultNoVNCDir = "/usr/share/novnc"

// webIdle is how long vnc --web waits, once the last page has closed, for
// another (a reload reconnects at once) before it ends.
const webIdle = 10 * time.Second

// vncWeb serves noVNC and a WebSocket bridge to a VM's display: the page
// at the printed URL shows the display in a browser. Both are under a
// random path, so that another local user (the server listens on
// loopback) or another web page in the user's browser cannot reach the
// display; the bridge also refuses a WebSocket opened by a page of another
// origin. Each WebSocket is one VNC connection, through the pod's exec
// subresource to the daemon on the VM's node, as vnc's TCP connections are.
type vncWeb struct {
	k      *kube
	pod    *corev1.Pod
	dir    string
	secret string

	mu     sync.Mutex
	open   int       // WebSockets open
	seen   bool      // one has opened
	closed time.Time // when the last one closed
}

func newVNCWeb(k *kube, pod *corev1.Pod, dir string) (*vncWeb, error) {
	if _, err := os.Stat(filepath.Join(dir, "vnc_lite.html")); err != nil {
		return nil, fmt.Errorf("noVNC is not in %s (%v): install Debian's novnc package, or give noVNC's directory with --novnc-dir", dir, err)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return &vncWeb{k: k, pod: pod, dir: dir, secret: hex.EncodeToString(b)}, nil
}

// url is the page that shows the display, for a server at addr.
func (w *vncWeb) url(addr net.Addr) string {
	q := url.Values{"path": {w.secret + "/websockify"}, "scale": {"true"}}
	return fmt.Sprintf("http://%s/%s/vnc_lite.html?%s", addr, w.secret, q.Encode())
}

// serve serves on l until ctx ends or the page has been closed for
// webIdle.
func (w *vncWeb) serve(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	prefix := "/" + w.secret + "/"
	mux.Handle(prefix+"websockify", http.HandlerFunc(w.bridge))
	mux.Handle(prefix, http.StripPrefix(prefix, http.FileServer(http.Dir(w.dir))))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			srv.Close()
			return nil
		case err := <-done:
			return err
		case <-tick.C:
			if w.idle() {
				srv.Close()
				return nil
			}
		}
	}
}

func (w *vncWeb) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen && w.open == 0 && time.Since(w.closed) > webIdle
}

func (w *vncWeb) track(delta int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.open += delta
	w.seen = true
	if w.open == 0 {
		w.closed = time.Now()
	}
}

var upgrader = websocket.Upgrader{
	Subprotocols: []string{"binary"},
	// The page's own origin only: the request's Host.
	CheckOrigin: func(r *http.Request) bool {
		u, err := url.Parse(r.Header.Get("Origin"))
		return err == nil && u.Host == r.Host
	},
}

// bridge carries one WebSocket's binary messages to and from the VM's
// display.
func (w *vncWeb) bridge(rw http.ResponseWriter, r *http.Request) {
	ws, err := upgrader.Upgrade(rw, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	defer ws.Close()
	w.track(1)
	defer w.track(-1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	in := &wsReader{ws: ws, closed: cancel}
	out := &wsWriter{ws: ws}
	// The exec ends when the display's connection does; a closed page
	// ends the reader, which ends the exec's input.
	if err := w.k.exec(ctx, w.pod, []string{vmtools.VNC}, in, out, nil); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "VNC connection from the page at %s: %v\n", r.RemoteAddr, err)
	}
}

// wsReader reads a WebSocket's messages as one stream.
type wsReader struct {
	ws     *websocket.Conn
	cur    io.Reader
	closed func() // the page closed: end the exec
}

func (r *wsReader) Read(p []byte) (int, error) {
	for {
		if r.cur != nil {
			n, err := r.cur.Read(p)
			if err != io.EOF {
				return n, err
			}
			r.cur = nil
			if n > 0 {
				return n, nil
			}
		}
		typ, msg, err := r.ws.NextReader()
		if err != nil {
			r.closed()
			return 0, io.EOF
		}
		if typ == websocket.BinaryMessage {
			r.cur = msg
		}
	}
}

// wsWriter writes each chunk of the display's stream as one binary
// message.
type wsWriter struct {
	mu sync.Mutex
	ws *websocket.Conn
}

func (w *wsWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
