package imagesource

import (
	"fmt"
	"io"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

// freeBytes is the space unprivileged writers have left on dir's file
// system.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// checkLimits refuses a download of size bytes (-1: unknown) that the
// request's limits forbid before it starts.
func checkLimits(req ports.FetchRequest, where string, size int64) error {
	if req.MaxBytes > 0 && size > req.MaxBytes {
		return fmt.Errorf("download %s: %d bytes, more than the %d the node allows an image (maxImageSize): %w", where, size, req.MaxBytes, ports.ErrInvalidArgument)
	}
	if req.KeepFreeBytes > 0 {
		free, err := freeBytes(filepath.Dir(req.Dest))
		if err != nil {
			return err
		}
		if need := max(size, 0) + req.KeepFreeBytes; free < need {
			return fmt.Errorf("download %s: the image store has %d bytes free; the node keeps %d free (keepFreeSpace) and the image needs %d: %w",
				where, free, req.KeepFreeBytes, max(size, 0), ports.ErrUnavailable)
		}
	}
	return nil
}

// limitCheckEvery is how often, in bytes, a download looks at the free
// space left.
const limitCheckEvery = 64 << 20

// limited reads a download, failing once it passes the request's limits.
type limited struct {
	r            io.Reader
	req          ports.FetchRequest
	n, nextCheck int64
}

func (l *limited) Read(p []byte) (int, error) {
	k, err := l.r.Read(p)
	l.n += int64(k)
	if l.req.MaxBytes > 0 && l.n > l.req.MaxBytes {
		return k, fmt.Errorf("more than the %d bytes the node allows an image (maxImageSize): %w", l.req.MaxBytes, ports.ErrInvalidArgument)
	}
	if l.req.KeepFreeBytes > 0 && l.n >= l.nextCheck {
		l.nextCheck = l.n + limitCheckEvery
		free, ferr := freeBytes(filepath.Dir(l.req.Dest))
		if ferr != nil {
			return k, ferr
		}
		if free < l.req.KeepFreeBytes {
			return k, fmt.Errorf("the image store is down to %d bytes free; the node keeps %d free (keepFreeSpace): %w", free, l.req.KeepFreeBytes, ports.ErrUnavailable)
		}
	}
	return k, err
}
