package dialer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A unix socket is dialled as the file at its path, never through a
// symlink (which a VM's QEMU user could put where its display's socket
// was, pointing at a socket of root's), and only if it is a socket.
func TestDialUnixRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "vnc.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("RFB 003.008\n"))
			c.Close()
		}
	}()
	c, err := Host{}.Dial(context.Background(), "unix", sock)
	if err != nil {
		t.Fatalf("the socket itself: %v", err)
	}
	banner := make([]byte, 12)
	if _, err := c.Read(banner); err != nil || !strings.HasPrefix(string(banner), "RFB") {
		t.Errorf("read %q %v", banner, err)
	}
	c.Close()
	link := filepath.Join(dir, "link.sock")
	os.Symlink(sock, link)
	if _, err := (Host{}).Dial(context.Background(), "unix", link); err == nil {
		t.Error("dialled through a symlink")
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := (Host{}).Dial(context.Background(), "unix", file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("a regular file: %v", err)
	}
	if _, err := (Host{}).Dial(context.Background(), "udp", "127.0.0.1:1"); err == nil {
		t.Error("dialled udp")
	}
}
