// Package unixsock opens the daemon's unix sockets: the mode is set before
// anyone can connect, a stale socket file is replaced, and a socket another
// process still serves is left alone.
package unixsock

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Listen listens on the unix socket at path with the given file mode. The
// socket is bound in a private directory beside path (0700: nobody else
// can reach it there), given its mode, then linked into place, so that it
// is never reachable with another mode; the process-wide umask, which
// other goroutines' files depend on, is left alone.
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another process serves this socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	private, err := privateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// A link, not a rename: it fails if another starter got there
	// first, as bind would.
	if err := os.Link(tmp, path); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return &listener{UnixListener: ul, path: path}, nil
}

// privateDir makes a directory only its owner can enter, in dir, with a
// short name: a socket's path has at most 107 bytes.
func privateDir(dir string) (string, error) {
	for range 10 {
		var b [3]byte
		rand.Read(b[:])
		p := filepath.Join(dir, "."+hex.EncodeToString(b[:]))
		err := os.Mkdir(p, 0o700)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("no private directory could be made in %s", dir)
}

// listener removes its socket file when it closes.
type listener struct {
	*net.UnixListener
	path string
}

func (l *listener) Close() error {
	err := l.UnixListener.Close()
	os.Remove(l.path)
	return err
}
