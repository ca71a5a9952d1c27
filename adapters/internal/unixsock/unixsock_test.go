package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The socket has its mode from the moment it is reachable at its path, the
// process's umask is untouched, a served socket is left alone, a stale one
// is replaced, and nothing but the socket is left in its directory (none
// once closed).
func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "virtlet.sock")
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	l, err := Listen(path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	if mask := syscall.Umask(0o022); mask != 0o022 {
		t.Errorf("the umask is %o after Listen, want 022", mask)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o660 {
		t.Fatalf("socket %v %v, want a socket with mode 0660", st, err)
	}
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("dial: %v", err)
	} else {
		c.Close()
	}
	if _, err := Listen(path, 0o600); err == nil || !strings.Contains(err.Error(), "another process serves this socket") {
		t.Errorf("a second listener on a served socket: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %v, want the socket alone", entries)
	}
	l.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the socket outlives its listener: %v", err)
	}
	// A stale socket (its server gone without removing it) is replaced.
	stale, _ := net.Listen("unix", path)
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err = Listen(path, 0o600)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	defer l.Close()
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
}
