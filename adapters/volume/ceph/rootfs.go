package ceph

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/adapters/volume/internal/rootfsheader"
	"github.com/virtlet/virtlet/ports"
)

// A persistent root on RBD has the raw plugin's layout (package
// rootfsheader): the header in the image's first 4 KiB, the pod's image
// from 1 MiB on, and the VM boots a libvirt storage slice of the RBD image
// from there to its end (the rest of the image, as on a block device, so
// that a root the guest grew stays whole). The image is written once: a
// later pod with the same image boots what the guest left; another image
// is refused naming both unless the pod asks to reinitialise.
//
// The image is untrusted: qemu-img (diskimage.Tool, as a user of no
// account) converts it to a sparse raw file in the plugin's work
// directory, and the plugin streams that file's data into RBD with librbd,
// so that the cephx key reaches no other process, argument or file.

// workDirName is the work directory's name under the state directory.
const workDirName = "rootfs"

// makeWorkDir makes the work directory, empty (what an interrupted write
// left is dropped), under a state directory the disk tools' user may
// search but not list, as the work directory itself.
func makeWorkDir(stateDir string) (string, error) {
	work := filepath.Join(stateDir, workDirName)
	if err := os.RemoveAll(work); err != nil {
		return "", err
	}
	for _, d := range []string{stateDir, work} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return "", err
		}
	}
	return work, nil
}

// prepareRootfs makes sure the RBD image holds the pod's image and returns
// the slice the VM boots.
func (v *Volumes) prepareRootfs(ctx context.Context, ioctx *rados.IOContext, vol volume, name string, want ports.RootfsRequest, log logrus.FieldLogger) (offset, size int64, err error) {
	unlock := v.writing.Lock(vol.pool + "/" + vol.image)
	defer unlock()
	img, created, err := openRootfsImage(ioctx, vol, name, want)
	if err != nil {
		return 0, 0, err
	}
	defer img.Close()
	imgSize, err := img.GetSize()
	if err != nil {
		return 0, 0, fmt.Errorf("size of the image: %w", err)
	}
	first, err := readFirst(img, int64(imgSize))
	if err != nil {
		return 0, 0, err
	}
	h, ok := rootfsheader.Read(first)
	if ok && h.Image == want.ImageDigest {
		log.WithField("digest", h.Image).Info("persistent root on RBD holds the image")
		return h.DataOffset, int64(imgSize) - h.DataOffset, nil
	}
	if err := checkOverwrite(vol, name, want, h, ok, first); err != nil {
		return 0, 0, err
	}
	if err := checkRootfsSize(vol, name, want, int64(imgSize)); err != nil {
		return 0, 0, err
	}
	hb, err := rootfsheader.Header{Image: want.ImageDigest, Name: want.ImageName, VirtualSize: want.ImageVirtualSize,
		DataOffset: rootfsheader.DataOffset, Written: time.Now().UTC().Truncate(time.Second)}.Bytes()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	st, err := v.writeRootfs(ctx, img, want, !created, hb)
	if err != nil {
		return 0, 0, err
	}
	log.WithFields(logrus.Fields{"digest": want.ImageDigest, "millis": time.Since(start).Milliseconds(), "created": created,
		"overwrote": ok || !rootfsheader.Zero(first), "bytesWritten": st.written, "bytesZeroed": st.zeroed}).
		Info("image written to the persistent root on RBD")
	return rootfsheader.DataOffset, int64(imgSize) - rootfsheader.DataOffset, nil
}

// openRootfsImage opens the RBD image for writing, creating it when the
// volume asks (its capacity must then hold the header and the image).
func openRootfsImage(ioctx *rados.IOContext, vol volume, name string, want ports.RootfsRequest) (*rbd.Image, bool, error) {
	img, err := rbd.OpenImage(ioctx, vol.image, rbd.NoSnapshot)
	if err == nil {
		return img, false, nil
	}
	if !errors.Is(err, rbd.ErrNotFound) {
		return nil, false, fmt.Errorf("open the image: %w", err)
	}
	if !vol.create {
		return nil, false, fmt.Errorf("the image does not exist (the volume's options may ask to create it: create: \"true\" with a capacity of at least %d bytes): %w",
			rootfsNeed(want), ports.ErrNotFound)
	}
	if need := rootfsNeed(want); vol.capacity < need {
		return nil, false, schema.Invalid(name, "capacity", strconv.FormatInt(vol.capacity, 10)+" bytes",
			fmt.Sprintf("the persistent root needs %d bytes: image %s's virtual size %d and the %d-byte header",
				need, rootfsheader.NameOr(want.ImageName, want.ImageDigest), want.ImageVirtualSize, rootfsheader.DataOffset),
			fmt.Sprintf("at least %d bytes", need))
	}
	if err := createImage(ioctx, vol.image, vol.capacity); err != nil {
		return nil, false, err
	}
	img, err = rbd.OpenImage(ioctx, vol.image, rbd.NoSnapshot)
	if err != nil {
		return nil, false, fmt.Errorf("open the image just created: %w", err)
	}
	return img, true, nil
}

// rootfsNeed is the smallest RBD image that holds the header and the image.
func rootfsNeed(want ports.RootfsRequest) int64 {
	return rootfsheader.DataOffset + want.ImageVirtualSize
}

// readFirst reads what decides whether the image is blank or holds a
// root: its first ProbeSize bytes (fewer on a smaller image).
func readFirst(img *rbd.Image, size int64) ([]byte, error) {
	first := make([]byte, min(size, rootfsheader.ProbeSize))
	n, err := img.ReadAt(first, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read the image's header: %w", err)
	}
	return first[:n], nil
}

// checkOverwrite refuses to overwrite another image or data that is not a
// persistent root, unless the pod asks to reinitialise.
func checkOverwrite(vol volume, name string, want ports.RootfsRequest, h *rootfsheader.Header, isRoot bool, first []byte) error {
	if want.Reinitialize {
		return nil
	}
	field := "ceph volume " + name + " (persistent root file system)"
	reinit := "set the pod annotation VirtletPersistentRootfsReinit: \"true\" to overwrite it"
	switch {
	case isRoot:
		return &ports.InvalidError{Field: field, Value: vol.pool + "/" + vol.image,
			Reason: fmt.Sprintf("it holds image %s (%s), written %s; the pod's image is %s (%s)",
				rootfsheader.NameOr(h.Name, h.Image), h.Image, h.Written.Format(time.RFC3339),
				rootfsheader.NameOr(want.ImageName, want.ImageDigest), want.ImageDigest),
			Allowed: reinit}
	case !rootfsheader.Zero(first):
		return &ports.InvalidError{Field: field, Value: vol.pool + "/" + vol.image,
			Reason: "it holds data that is not a Virtlet persistent root file system", Allowed: reinit}
	}
	return nil
}

// checkRootfsSize refuses an RBD image too small for the header and the
// image.
func checkRootfsSize(vol volume, name string, want ports.RootfsRequest, size int64) error {
	need := rootfsNeed(want)
	if size >= need {
		return nil
	}
	return &ports.InvalidError{Field: "ceph volume " + name + " (persistent root file system)", Value: vol.pool + "/" + vol.image,
		Reason: fmt.Sprintf("the RBD image has %d bytes; image %s needs %d (its virtual size) + %d (the header)",
			size, rootfsheader.NameOr(want.ImageName, want.ImageDigest), want.ImageVirtualSize, rootfsheader.DataOffset),
		Allowed: fmt.Sprintf("an RBD image of at least %d bytes (rbd resize)", need)}
}

// writeRootfs writes the image behind the header, then the header hb. No
// valid header is in the RBD image while the image is written, so an
// interrupted write is never taken for a root holding the image: it is
// found blank and written again. zeroHoles: the RBD image may hold older
// data where the image reads as zeros (it was not created for this write),
// which is zeroed rather than skipped.
func (v *Volumes) writeRootfs(ctx context.Context, img *rbd.Image, want ports.RootfsRequest, zeroHoles bool, hb []byte) (streamStats, error) {
	if _, err := img.WriteAt(make([]byte, len(hb)), 0); err != nil {
		return streamStats{}, fmt.Errorf("clear the header: %w", err)
	}
	if err := img.Flush(); err != nil {
		return streamStats{}, fmt.Errorf("clear the header: %w", err)
	}
	raw, err := v.rawCopy(ctx, want)
	if err != nil {
		return streamStats{}, fmt.Errorf("image %s: %w", rootfsheader.NameOr(want.ImageName, want.ImageDigest), err)
	}
	defer os.Remove(raw)
	st, err := stream(ctx, img, raw, rootfsheader.DataOffset, zeroHoles)
	if err != nil {
		return st, fmt.Errorf("write image %s into RBD: %w", rootfsheader.NameOr(want.ImageName, want.ImageDigest), err)
	}
	if err := img.Flush(); err != nil {
		return st, fmt.Errorf("flush the image: %w", err)
	}
	if _, err := img.WriteAt(hb, 0); err != nil {
		return st, fmt.Errorf("write the header: %w", err)
	}
	if err := img.Flush(); err != nil {
		return st, fmt.Errorf("write the header: %w", err)
	}
	return st, nil
}

// rawCopy converts the image into a sparse raw file of the work directory
// (0600, the disk tools' user granted it for the run only) and returns its
// path; the caller removes it.
func (v *Volumes) rawCopy(ctx context.Context, want ports.RootfsRequest) (string, error) {
	if v.work == "" {
		return "", fmt.Errorf("the ceph plugin has no state directory for the image's raw copy: %w", ports.ErrFailedPrecondition)
	}
	if want.ImageFormat != "qcow2" && want.ImageFormat != "raw" {
		return "", &ports.InvalidError{Field: "image format", Value: want.ImageFormat, Allowed: "qcow2 or raw"}
	}
	// This package's parser reads the untrusted image's header again
	// before qemu-img does.
	info, err := diskimage.Inspect(want.ImagePath)
	if err != nil {
		return "", fmt.Errorf("%s: %v: %w", want.ImagePath, err, ports.ErrInvalidArgument)
	}
	if info.Format != want.ImageFormat {
		return "", &ports.InvalidError{Field: "image format", Value: want.ImageFormat, Reason: "the image file is " + info.Format, Allowed: info.Format}
	}
	if err := checkFreeSpace(v.work, want.ImagePath); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(v.work, "root-*.raw")
	if err != nil {
		return "", fmt.Errorf("raw copy: %w", err)
	}
	f.Close()
	if err := (diskimage.Tool{UID: diskimage.CephToolUID}).ConvertToFile(ctx, want.ImagePath, want.ImageFormat, f.Name()); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("raw copy in %s: %w", v.work, err)
	}
	return f.Name(), nil
}

// checkFreeSpace refuses a raw copy the work directory's file system has
// no room for: at least the image file's allocated bytes (a compressed
// image may need more, and qemu-img then fails saying so).
func checkFreeSpace(dir, image string) error {
	var img unix.Stat_t
	if err := unix.Stat(image, &img); err != nil {
		return fmt.Errorf("size of %s: %w", image, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("free space of %s: %w", dir, err)
	}
	need, free := img.Blocks*512, int64(fs.Bavail)*fs.Bsize
	if free < need {
		return fmt.Errorf("the image's raw copy needs about %d bytes in %s, which has %d free (the ceph plugin's state directory): %w",
			need, dir, free, ports.ErrUnavailable)
	}
	return nil
}

// Streaming: the raw copy is read extent by extent (SEEK_DATA/SEEK_HOLE)
// and in blocks; blocks of zeros are holes too.
const (
	zeroBlock  = 64 << 10 // the unit of zero detection
	writeChunk = 4 << 20  // the largest RBD write (an RBD object)
	zeroChunk  = 1 << 30  // the largest zeroing (write-same) at once
)

// streamStats is what a stream wrote.
type streamStats struct{ written, zeroed int64 }

// stream writes the raw file's data into the RBD image from base on,
// skipping its holes and zero blocks (zeroing them instead when
// zeroHoles), and checks ctx between writes.
func stream(ctx context.Context, img *rbd.Image, path string, base int64, zeroHoles bool) (streamStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return streamStats{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return streamStats{}, err
	}
	w := &rbdWriter{ctx: ctx, img: img, base: base, zeroHoles: zeroHoles}
	size, fd := st.Size(), int(f.Fd())
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size // a hole to the end
		} else if err != nil {
			return w.stats, fmt.Errorf("find data in the raw copy: %w", err)
		}
		if err := w.zeros(pos, data-pos); err != nil {
			return w.stats, err
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return w.stats, fmt.Errorf("find holes in the raw copy: %w", err)
		}
		if err := w.extent(f, data, hole); err != nil {
			return w.stats, err
		}
		pos = hole
	}
	err = w.flush()
	return w.stats, err
}

// rbdWriter gathers data into writes of up to writeChunk, and zeros into
// runs, writing each when what follows is not contiguous.
type rbdWriter struct {
	ctx       context.Context
	img       *rbd.Image
	base      int64
	zeroHoles bool
	buf       []byte // data pending, from bufAt
	bufAt     int64
	zeroAt    int64 // zeros pending, zeroLen bytes from zeroAt
	zeroLen   int64
	stats     streamStats
}

// extent reads the raw file's data extent [from, to) block by block.
func (w *rbdWriter) extent(f *os.File, from, to int64) error {
	block := make([]byte, zeroBlock)
	for at := from; at < to; at += zeroBlock {
		b := block[:min(zeroBlock, to-at)]
		if _, err := f.ReadAt(b, at); err != nil {
			return fmt.Errorf("read the raw copy: %w", err)
		}
		var err error
		if rootfsheader.Zero(b) {
			err = w.zeros(at, int64(len(b)))
		} else {
			err = w.data(at, b)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *rbdWriter) data(at int64, b []byte) error {
	if err := w.flushZeros(); err != nil {
		return err
	}
	if len(w.buf) > 0 && (w.bufAt+int64(len(w.buf)) != at || len(w.buf)+len(b) > writeChunk) {
		if err := w.flushData(); err != nil {
			return err
		}
	}
	if len(w.buf) == 0 {
		w.bufAt = at
	}
	w.buf = append(w.buf, b...)
	return nil
}

func (w *rbdWriter) zeros(at, n int64) error {
	if n <= 0 {
		return nil
	}
	if err := w.flushData(); err != nil {
		return err
	}
	if !w.zeroHoles {
		return nil
	}
	if w.zeroLen > 0 && w.zeroAt+w.zeroLen != at {
		if err := w.flushZeros(); err != nil {
			return err
		}
	}
	if w.zeroLen == 0 {
		w.zeroAt = at
	}
	w.zeroLen += n
	return nil
}

func (w *rbdWriter) flush() error {
	if err := w.flushData(); err != nil {
		return err
	}
	return w.flushZeros()
}

func (w *rbdWriter) flushData() error {
	if len(w.buf) == 0 {
		return nil
	}
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if _, err := w.img.WriteAt(w.buf, w.base+w.bufAt); err != nil {
		return fmt.Errorf("write %d bytes at %d: %w", len(w.buf), w.base+w.bufAt, err)
	}
	w.stats.written += int64(len(w.buf))
	w.buf = w.buf[:0]
	return nil
}

// flushZeros zeroes the pending run with librbd's write-same of zeros,
// which it turns into discards (objects dropped, parts of objects
// zeroed) rather than writes.
func (w *rbdWriter) flushZeros() error {
	for w.zeroLen > 0 {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		n := min(w.zeroLen, zeroChunk)
		pattern := make([]byte, 512)
		if n%512 != 0 {
			pattern = pattern[:1]
		}
		if _, err := w.img.WriteSame(uint64(w.base+w.zeroAt), uint64(n), pattern, 0); err != nil {
			return fmt.Errorf("zero %d bytes at %d: %w", n, w.base+w.zeroAt, err)
		}
		w.stats.zeroed += n
		w.zeroAt, w.zeroLen = w.zeroAt+n, w.zeroLen-n
	}
	return nil
}
