// Package diskimage recognises VM disk images without trusting them: a
// qcow2 image (version 2 or 3, no backing file) or a raw disk with a
// partition table. Everything else (an HTML error page, an empty file, a
// corrupt header) is refused, and a qcow2 image that names a backing file
// is refused too: QEMU would open that file on the host.
package diskimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Formats.
const (
	QCOW2 = "qcow2"
	Raw   = "raw"
)

// Info describes a disk image.
type Info struct {
	Format      string
	VirtualSize int64 // bytes the guest sees
}

// ErrNotADisk is wrapped by every refusal.
var ErrNotADisk = errors.New("not a VM disk image")

// Inspect reads the image at path.
func Inspect(path string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	return InspectReader(f, st.Size())
}

// InspectReader reads an image of the given size.
func InspectReader(r io.ReaderAt, size int64) (Info, error) {
	if size == 0 {
		return Info{}, fmt.Errorf("%w: the file is empty", ErrNotADisk)
	}
	head := make([]byte, 512)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Info{}, err
	}
	head = head[:n]
	if n >= 4 && string(head[:4]) == "QFI\xfb" {
		return qcow2(head, size)
	}
	if n < 512 || head[510] != 0x55 || head[511] != 0xaa {
		return Info{}, fmt.Errorf("%w: neither a qcow2 header nor a partition table (first bytes %q)", ErrNotADisk, printable(head, 16))
	}
	return Info{Format: Raw, VirtualSize: size}, nil
}

// qcow2 checks a qcow2 header (all fields big-endian).
func qcow2(h []byte, size int64) (Info, error) {
	if len(h) < 72 {
		return Info{}, fmt.Errorf("%w: truncated qcow2 header", ErrNotADisk)
	}
	version := binary.BigEndian.Uint32(h[4:8])
	backingOffset := binary.BigEndian.Uint64(h[8:16])
	clusterBits := binary.BigEndian.Uint32(h[20:24])
	virtual := binary.BigEndian.Uint64(h[24:32])
	switch {
	case version != 2 && version != 3:
		return Info{}, fmt.Errorf("%w: qcow2 version %d (want 2 or 3)", ErrNotADisk, version)
	case clusterBits < 9 || clusterBits > 21:
		return Info{}, fmt.Errorf("%w: corrupt qcow2 header (cluster bits %d)", ErrNotADisk, clusterBits)
	case virtual == 0 || virtual > 1<<50:
		return Info{}, fmt.Errorf("%w: corrupt qcow2 header (virtual size %d)", ErrNotADisk, virtual)
	case backingOffset != 0:
		return Info{}, fmt.Errorf("%w: the qcow2 image names a backing file; only self-contained images are accepted", ErrNotADisk)
	case size < 1<<clusterBits:
		return Info{}, fmt.Errorf("%w: truncated qcow2 image (%d bytes)", ErrNotADisk, size)
	}
	return Info{Format: QCOW2, VirtualSize: int64(virtual)}, nil
}

func printable(b []byte, max int) string {
	if len(b) > max {
		b = b[:max]
	}
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 32 || c > 126 {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}
