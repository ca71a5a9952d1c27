// Package diskimage recognises VM disk images without trusting them: a
// self-contained qcow2 image (version 2 or 3) or a raw disk with a
// partition table. Everything else (an HTML error page, an empty file, a
// corrupt header) is refused. So is a qcow2 image that would make QEMU
// open another file on the host, or that this package cannot vouch for:
// a backing file, an external data file (the data of a qcow2 v3 image may
// live in a file it names, /etc/kubernetes/pki/ca.key as well as any),
// encryption, an incompatible feature or a header extension it does not
// know. The header is read by this code alone; no QEMU tool parses an
// image before it has passed here.
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
func Inspect(path string) (Info, error) { return inspectFile(path, InspectReader) }

// inspectFile opens path and has inspect read it.
func inspectFile(path string, inspect func(r io.ReaderAt, size int64) (Info, error)) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	return inspect(f, st.Size())
}

// InspectOverlay reads a qcow2 image at path held to every rule Inspect
// holds images to but one: it may name a backing file (which the caller
// replaces with qemu-img rebase -u, which opens no backing file). A
// self-contained qcow2 image passes too; anything else, a raw disk
// included, is refused.
func InspectOverlay(path string) (Info, error) {
	return inspectFile(path, func(r io.ReaderAt, size int64) (Info, error) {
		head, err := qcow2Head(r, size)
		if err != nil {
			return Info{}, err
		}
		if len(head) < 4 || string(head[:4]) != "QFI\xfb" {
			return Info{}, fmt.Errorf("%w: not a qcow2 overlay (first bytes %q)", ErrNotADisk, printable(head, 16))
		}
		virtual, reason := qcow2Check(head, size, true)
		if reason != "" {
			return Info{}, fmt.Errorf("%w: %s", ErrNotADisk, reason)
		}
		return Info{Format: QCOW2, VirtualSize: int64(virtual)}, nil
	})
}

// qcow2Head reads the first 512 bytes of an image, or of a qcow2 image
// its header and extensions, the first cluster (at most 2 MiB); or as
// much of them as the file has.
func qcow2Head(r io.ReaderAt, size int64) ([]byte, error) {
	head := make([]byte, 512)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	head = head[:n]
	if n >= 24 && string(head[:4]) == "QFI\xfb" {
		if bits := binary.BigEndian.Uint32(head[20:24]); bits >= 9 && bits <= 21 {
			first := make([]byte, min(int64(1)<<bits, size))
			m, err := r.ReadAt(first, 0)
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			head = first[:m]
		}
	}
	return head, nil
}

// InspectReader reads an image of the given size.
func InspectReader(r io.ReaderAt, size int64) (Info, error) {
	if size == 0 {
		return Info{}, fmt.Errorf("%w: the file is empty", ErrNotADisk)
	}
	head, err := qcow2Head(r, size)
	if err != nil {
		return Info{}, err
	}
	if len(head) >= 4 && string(head[:4]) == "QFI\xfb" {
		return qcow2(head, size)
	}
	if len(head) < 512 || head[510] != 0x55 || head[511] != 0xaa {
		return Info{}, fmt.Errorf("%w: neither a qcow2 header nor a partition table (first bytes %q)", ErrNotADisk, printable(head, 16))
	}
	return Info{Format: Raw, VirtualSize: size}, nil
}

// The qcow2 header's fields (docs/interop/qcow2.txt in QEMU's tree), all
// big-endian.
const (
	qcow2V2HeaderLen = 72
	qcow2V3HeaderLen = 104

	// Incompatible features: QEMU refuses an image with a bit it does not
	// know, and so does this package with a bit it does not allow.
	incompatDirty       = 1 << 0 // refcounts may be stale: QEMU repairs the image as it opens it
	incompatCorrupt     = 1 << 1
	incompatDataFile    = 1 << 2 // the guest's data is in the file the header extension names
	incompatCompression = 1 << 3 // a compression type other than zlib (zstd)
	incompatExtendedL2  = 1 << 4 // subclusters
	allowedIncompat     = incompatCompression | incompatExtendedL2

	// Autoclear features: bit 1 says the external data file holds the
	// guest's data as raw.
	autoclearDataFileRaw = 1 << 1

	// Header extensions.
	extEnd          = 0x00000000
	extBackingFmt   = 0xe2792aca
	extFeatureNames = 0x6803f857
	extBitmaps      = 0x23852875
	extEncryption   = 0x0537be77
	extDataFile     = 0x44415441
)

// qcow2Refusal is the reason the header h of a qcow2 image of size bytes
// is refused, or "" for a self-contained image. h holds the image's first
// cluster, or its whole if smaller (the header and its extensions must lie
// in the first cluster).
func qcow2Refusal(h []byte, size int64) (virtual uint64, reason string) {
	return qcow2Check(h, size, false)
}

// qcow2Check is qcow2Refusal, which allows a backing file (its name and
// format) when backing is set.
func qcow2Check(h []byte, size int64, backing bool) (virtual uint64, reason string) {
	if len(h) < qcow2V2HeaderLen {
		return 0, "truncated qcow2 header"
	}
	be := binary.BigEndian
	version := be.Uint32(h[4:8])
	backingOffset := be.Uint64(h[8:16])
	clusterBits := be.Uint32(h[20:24])
	virtual = be.Uint64(h[24:32])
	crypt := be.Uint32(h[32:36])
	switch {
	case version != 2 && version != 3:
		return 0, fmt.Sprintf("qcow2 version %d (want 2 or 3)", version)
	case clusterBits < 9 || clusterBits > 21:
		return 0, fmt.Sprintf("corrupt qcow2 header (cluster bits %d)", clusterBits)
	case virtual == 0 || virtual > 1<<50:
		return 0, fmt.Sprintf("corrupt qcow2 header (virtual size %d)", virtual)
	case backingOffset != 0 && !backing:
		return 0, "the qcow2 image names a backing file; only self-contained images are accepted"
	case crypt != 0:
		return 0, fmt.Sprintf("the qcow2 image is encrypted (method %d); only plain images are accepted", crypt)
	case size < 1<<clusterBits:
		return 0, fmt.Sprintf("truncated qcow2 image (%d bytes)", size)
	}
	cluster := uint64(1) << clusterBits
	extStart := uint64(qcow2V2HeaderLen)
	if version == 3 {
		if len(h) < qcow2V3HeaderLen {
			return 0, "truncated qcow2 v3 header"
		}
		incompat := be.Uint64(h[72:80])
		autoclear := be.Uint64(h[88:96])
		headerLen := uint64(be.Uint32(h[100:104]))
		switch {
		case incompat&incompatDataFile != 0:
			return 0, "the qcow2 image keeps its data in an external data file; only self-contained images are accepted"
		case incompat&incompatDirty != 0:
			return 0, "the qcow2 image is marked dirty (QEMU would repair it as it opens it); run qemu-img check -r all on it before publishing it"
		case incompat&incompatCorrupt != 0:
			return 0, "the qcow2 image is marked corrupt"
		case incompat&^allowedIncompat != 0:
			return 0, fmt.Sprintf("the qcow2 image needs incompatible features %#x that are not allowed (allowed: compression type, extended L2 entries)", incompat&^allowedIncompat)
		case autoclear&autoclearDataFileRaw != 0:
			return 0, "the qcow2 image says its data is raw in an external data file; only self-contained images are accepted"
		case headerLen < qcow2V3HeaderLen || headerLen%8 != 0 || headerLen > cluster || headerLen > uint64(len(h)):
			return 0, fmt.Sprintf("corrupt qcow2 header (header length %d)", headerLen)
		case incompat&incompatCompression != 0 && (headerLen < qcow2V3HeaderLen+8 || h[104] > 1):
			return 0, "corrupt qcow2 header (compression type)"
		}
		extStart = headerLen
	}
	// The header extensions, each (type, length, data padded to 8 bytes),
	// up to the end marker, within the first cluster.
	limit := min(cluster, uint64(len(h)))
	for off := extStart; ; {
		if off+8 > limit {
			return 0, "corrupt qcow2 header (its extensions run past the first cluster)"
		}
		typ, n := be.Uint32(h[off:off+4]), uint64(be.Uint32(h[off+4:off+8]))
		switch typ {
		case extEnd:
			return virtual, ""
		case extBackingFmt:
			if !backing {
				return 0, "the qcow2 image names a backing file's format; only self-contained images are accepted"
			}
		case extDataFile:
			return 0, "the qcow2 image names an external data file; only self-contained images are accepted"
		case extEncryption:
			return 0, "the qcow2 image has an encryption header; only plain images are accepted"
		case extFeatureNames, extBitmaps:
		default:
			return 0, fmt.Sprintf("the qcow2 image has a header extension of type %#08x that is not allowed", typ)
		}
		off += 8 + (n+7)/8*8
	}
}

// qcow2 checks a qcow2 image's header.
func qcow2(h []byte, size int64) (Info, error) {
	virtual, reason := qcow2Refusal(h, size)
	if reason != "" {
		return Info{}, fmt.Errorf("%w: %s", ErrNotADisk, reason)
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
