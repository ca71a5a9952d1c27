package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

// vnc --web serves noVNC and its WebSocket under the URL's random path
// only, and refuses a WebSocket that a page of another origin opens.
func TestVNCWebServesOnlyUnderItsSecretPath(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "vnc_lite.html"), []byte("<title>noVNC</title>"), 0o644)
	os.MkdirAll(filepath.Join(dir, "core"), 0o755)
	os.WriteFile(filepath.Join(dir, "core", "rfb.js"), []byte("export default class RFB {}"), 0o644)
	if _, err := newVNCWeb(nil, nil, t.TempDir()); err == nil || !strings.Contains(err.Error(), "novnc package") {
		t.Errorf("without noVNC: %v", err)
	}
	w, err := newVNCWeb(nil, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.serve(ctx, l)
	url := w.url(l.Addr())
	base := "http://" + l.Addr().String() + "/"
	get := func(u string) (int, string) {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(url); code != 200 || !strings.Contains(body, "noVNC") {
		t.Errorf("the page: %d %q", code, body)
	}
	if code, _ := get(base + w.secret + "/core/rfb.js"); code != 200 {
		t.Errorf("noVNC's modules: %d", code)
	}
	for _, u := range []string{base + "vnc_lite.html", base + "core/rfb.js", base + strings.Repeat("0", 32) + "/vnc_lite.html"} {
		if code, _ := get(u); code != 404 {
			t.Errorf("%s: %d, want 404", u, code)
		}
	}
	// Another origin's page may not open the display.
	wsURL := "ws://" + l.Addr().String() + "/" + w.secret + "/websockify"
	_, resp, err := websocket.DefaultDialer.Dial(wsURL, http.Header{"Origin": {"http://evil.example.com"}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("a WebSocket from another origin: %v %v", resp, err)
	}
}
