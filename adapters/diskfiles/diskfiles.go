// Package diskfiles writes files into the root file system of a VM's disk
// before the VM boots (VirtletFilesFromDataSource) without the host ever
// mounting it: the file system is the image author's (or, on a persistent
// root, the previous guest's), and the kernel's file system drivers are not
// made to read crafted ones. e2fsprogs' debugfs edits an ext2/3/4 file
// system in user space; every tool that reads the disk (debugfs, qemu-img,
// qemu-io, blkid) runs through diskimage.Tool, as a user of no account, in
// namespaces of its own and bounded in memory and time.
//
// A raw disk (a file or block device, or a slice of one) is edited in
// place. A qcow2 overlay is read out to a sparse raw copy, edited there,
// and the chunks that changed are written back into the overlay, so the
// overlay stays thin and its base image is never written.
//
// Paths in the guest resolve inside the image: debugfs only ever opens
// the image's own inodes, and this package follows the image's symlinks
// itself, relative to the image's root.
package diskfiles

import (
	"context"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// Disk is the disk whose root file system receives the files.
type Disk struct {
	Path   string // image file or block device
	Format string // "qcow2" or "raw"
	// Offset and Size, when Offset is set, restrict a raw disk to a slice.
	Offset, Size int64
	// Backing is the base image of a qcow2 overlay, read (never written)
	// through it.
	Backing string
}

// Write writes files into the disk's root file system. workDir is a
// private directory for the raw copy of a qcow2 overlay and the files'
// contents; it is removed.
func Write(ctx context.Context, tool diskimage.Tool, disk Disk, files []ports.GuestFile, workDir string) (err error) {
	for _, f := range files {
		if _, err := guestPath(f.Path); err != nil {
			return fmt.Errorf("write %s: %w", describe(f), err)
		}
	}
	if err := os.RemoveAll(workDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(workDir), 0o711); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Dir(workDir), 0o711); err != nil {
		return err
	}
	// The tools' user searches it for the files granted to it, no more.
	if err := os.Mkdir(workDir, 0o711); err != nil {
		return err
	}
	defer os.RemoveAll(workDir)
	w := &writer{ctx: ctx, tool: tool, work: workDir}
	switch disk.Format {
	case "raw":
		return w.editRaw(disk.Path, disk.Offset, disk.Size, files)
	case "qcow2":
		return w.editOverlay(disk, files)
	default:
		return &ports.InvalidError{Field: "disk format", Value: disk.Format, Allowed: "qcow2 or raw"}
	}
}

// Cleanup removes what an interrupted Write left below workRoot (the
// parent of its work directories). Write mounts nothing and attaches no
// device, so its files are all there is.
func Cleanup(workRoot string) error { return os.RemoveAll(workRoot) }

type writer struct {
	ctx  context.Context
	tool diskimage.Tool
	work string
	n    int // names the work files
}

// editOverlay copies the overlay's disk to a sparse raw file, writes the
// files into the copy, and writes back what changed.
func (w *writer) editOverlay(disk Disk, files []ports.GuestFile) error {
	if disk.Backing == "" || !filepath.IsAbs(disk.Backing) {
		return fmt.Errorf("qcow2 overlay %s: its base image is not given: %w", disk.Path, ports.ErrInvalidArgument)
	}
	raw, err := w.file("disk.raw", nil)
	if err != nil {
		return err
	}
	if _, _, err := w.tool.Run(w.ctx, map[string]uint16{disk.Path: 4, disk.Backing: 4, raw: 6},
		"qemu-img", "convert", "-f", "qcow2", "-O", "raw", disk.Path, raw); err != nil {
		return fmt.Errorf("read the root disk: %w", err)
	}
	root, err := w.findRoot(raw, 0, 0)
	if err != nil {
		return err
	}
	before, err := chunkSums(raw, root.start, root.size)
	if err != nil {
		return err
	}
	if err := w.writeFiles(raw, root, files); err != nil {
		return err
	}
	after, err := chunkSums(raw, root.start, root.size)
	if err != nil {
		return err
	}
	return w.writeBack(disk, raw, changedRanges(before, after, root.start, root.size))
}

// editRaw writes the files straight into a raw disk (or its slice).
func (w *writer) editRaw(p string, offset, size int64, files []ports.GuestFile) error {
	root, err := w.findRoot(p, offset, size)
	if err != nil {
		return err
	}
	return w.writeFiles(p, root, files)
}

// chunk is the unit of write-back: a qcow2 cluster.
const chunk = 64 << 10

var crcTable = crc64.MakeTable(crc64.ECMA)

// chunkSums hashes each chunk of [start, start+size) of a file; a chunk
// that lies wholly in a hole has no sum (0 with ok false).
func chunkSums(p string, start, size int64) ([]uint64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	first := start / chunk * chunk
	n := (start + size - first + chunk - 1) / chunk
	sums := make([]uint64, n)
	buf := make([]byte, chunk)
	for off := first; off < start+size; {
		// Skip the holes: debugfs writing into one shows as a changed sum.
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		off = max(off, data/chunk*chunk)
		if off >= start+size {
			break
		}
		k, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		sums[(off-first)/chunk] = crc64.Checksum(buf[:k], crcTable) | 1 // never 0: 0 is a hole
		off += chunk
	}
	return sums, nil
}

type byteRange struct{ off, len int64 }

// changedRanges joins the chunks whose sums differ into ranges, clipped
// to [start, start+size).
func changedRanges(before, after []uint64, start, size int64) []byteRange {
	first := start / chunk * chunk
	var out []byteRange
	for i := range after {
		if before[i] == after[i] {
			continue
		}
		off := max(first+int64(i)*chunk, start)
		end := min(first+int64(i+1)*chunk, start+size)
		if n := len(out); n > 0 && out[n-1].off+out[n-1].len == off {
			out[n-1].len = end - out[n-1].off
			continue
		}
		out = append(out, byteRange{off, end - off})
	}
	return out
}

// writeBack writes the changed ranges of raw into the overlay with
// qemu-io, one source file per range.
func (w *writer) writeBack(disk Disk, raw string, ranges []byteRange) error {
	if len(ranges) == 0 {
		return nil
	}
	src, err := os.Open(raw)
	if err != nil {
		return err
	}
	defer src.Close()
	grants := map[string]uint16{disk.Path: 6, disk.Backing: 4}
	args := []string{"-f", "qcow2"}
	for _, r := range ranges {
		data := make([]byte, r.len)
		if _, err := src.ReadAt(data, r.off); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		p, err := w.file("range", data)
		if err != nil {
			return err
		}
		grants[p] = 4
		args = append(args, "-c", fmt.Sprintf("write -q -s %s %d %d", p, r.off, r.len))
	}
	out, stderr, err := w.tool.Run(w.ctx, grants, "qemu-io", append(args, disk.Path)...)
	if msg := strings.TrimSpace(string(out) + string(stderr)); err != nil || msg != "" {
		return fmt.Errorf("write the files back into the root disk: qemu-io: %v %s", err, msg)
	}
	return nil
}

// file makes a work file of root's that the tools' user is granted.
func (w *writer) file(name string, data []byte) (string, error) {
	w.n++
	p := filepath.Join(w.work, fmt.Sprintf("%d-%s", w.n, name))
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", err
	}
	return p, nil
}

// guestPath checks a file's path in the guest: absolute, clean once
// cleaned, and nothing debugfs's command parser would read as more than
// one argument.
func guestPath(p string) (string, error) {
	c := path.Clean(p)
	switch {
	case !strings.HasPrefix(p, "/") || c == "/":
		return "", &ports.InvalidError{Field: "file path", Value: p, Allowed: "an absolute path to a file"}
	case strings.ContainsAny(p, "\"\\") || strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "", &ports.InvalidError{Field: "file path", Value: strconv.Quote(p), Reason: "it holds a quote, a backslash or a control character"}
	}
	return c, nil
}

func describe(f ports.GuestFile) string {
	if f.Source != "" {
		return f.Path + " (" + f.Source + ")"
	}
	return f.Path
}
