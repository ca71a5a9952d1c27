package raw

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/adapters/volume/internal/rootfsheader"
	"github.com/virtlet/virtlet/ports"
)

// A persistent root file system's device starts with a header (the first
// 4 KiB, package rootfsheader) saying which image it holds; the VM sees the
// device from DataOffset on.
const (
	headerMagic = rootfsheader.Magic
	// DataOffset is where the image starts.
	DataOffset = rootfsheader.DataOffset
	probeSize  = rootfsheader.ProbeSize
)

// Virtlet 1.x wrote its own header in the device's first sector (its
// pkg/blockdev): a big-endian magic number, a metadata version (1) and the
// sha256 of the image. Its guest saw the rest of the device, every whole
// sector after the first (a device-mapper linear map), however large the
// image, so that a root the guest grew to fill the device (cloud-init's
// growpart) is still whole when the device is used again. When the image
// changed, Virtlet wrote the new image's hash in its header, the image
// behind it, and mapped the whole device again. This package does the
// same for such a device, keeping Virtlet's layout (not moving it to this
// package's header) so that a node still running Virtlet 1.x reads the
// device as its own rather than overwriting it unasked.
//
// This package's own header gives the guest the whole device after it as
// well: the two layouts differ only in where the root starts.
const (
	virtlet1Magic      = 0x263dbe52ba576702
	virtlet1Version    = 1
	virtlet1HeaderSize = 8 + 2 + sha256.Size
	virtlet1SectorSize = 512
	virtlet1DataOffset = virtlet1SectorSize
	virtlet1DigestAlgo = "sha256:"
)

// virtlet1Header is Virtlet 1.x's header, if first starts with one.
type virtlet1Header struct {
	version uint16
	image   string // "sha256:<hex>"
}

func readVirtlet1Header(first []byte) (*virtlet1Header, bool) {
	if len(first) < virtlet1HeaderSize || binary.BigEndian.Uint64(first) != virtlet1Magic {
		return nil, false
	}
	return &virtlet1Header{version: binary.BigEndian.Uint16(first[8:]),
		image: virtlet1DigestAlgo + hex.EncodeToString(first[10:virtlet1HeaderSize])}, true
}

// virtlet1HeaderBytes is the first sector of a Virtlet 1.x device holding
// the image of digest ("sha256:<hex>").
func virtlet1HeaderBytes(digest string) ([]byte, error) {
	hash, err := hex.DecodeString(strings.TrimPrefix(digest, virtlet1DigestAlgo))
	if !strings.HasPrefix(digest, virtlet1DigestAlgo) || err != nil || len(hash) != sha256.Size {
		return nil, fmt.Errorf("image digest %q cannot be written in a Virtlet 1.x header, which holds a sha256", digest)
	}
	b := make([]byte, virtlet1SectorSize)
	binary.BigEndian.PutUint64(b, virtlet1Magic)
	binary.BigEndian.PutUint16(b[8:], virtlet1Version)
	copy(b[10:], hash)
	return b, nil
}

// virtlet1Size is how much of a device of devSize bytes Virtlet 1.x's
// guest saw: its whole sectors but the first.
func virtlet1Size(devSize int64) int64 {
	return devSize/virtlet1SectorSize*virtlet1SectorSize - virtlet1DataOffset
}

// prepareRootfs makes sure dev holds the image: a device holding it already
// is used as it is (the guest's changes kept); a blank device gets it; a
// device holding another image or other data is overwritten only when the
// pod asks. It returns the slice the VM boots from.
func prepareRootfs(ctx context.Context, dev, volume string, want ports.RootfsRequest, log logrus.FieldLogger) (offset, size int64, err error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("block volume %s: open %s: %w", volume, dev, err)
	}
	defer f.Close()
	devSize, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, 0, fmt.Errorf("block volume %s: size of %s: %w", volume, dev, err)
	}
	first := make([]byte, probeSize)
	n, err := f.ReadAt(first, 0)
	if err != nil && err != io.EOF {
		return 0, 0, fmt.Errorf("block volume %s: read %s: %w", volume, dev, err)
	}
	first = first[:n]
	field := "block volume " + volume + " (persistent root file system)"
	reinit := "set the pod annotation VirtletPersistentRootfsReinit: \"true\" to overwrite it"
	v1, isV1 := readVirtlet1Header(first)
	// A metadata version Virtlet never wrote is overwritten only when the
	// pod asks, and then in this package's layout, which Virtlet 1.x could
	// not have read either.
	if isV1 && v1.version != virtlet1Version && !want.Reinitialize {
		return 0, 0, &ports.InvalidError{Field: field, Value: dev,
			Reason:  fmt.Sprintf("it holds a Virtlet 1.x persistent root of metadata version %d, which neither Virtlet 1.x nor this node reads", v1.version),
			Allowed: reinit}
	}
	if isV1 && v1.version == virtlet1Version {
		size := virtlet1Size(devSize)
		if size < want.ImageVirtualSize {
			return 0, 0, &ports.InvalidError{Field: field, Value: dev,
				Reason: fmt.Sprintf("it holds a Virtlet 1.x persistent root on a device of %d bytes; image %s needs %d (its virtual size) + %d (the header)",
					devSize, nameOr(want.ImageName, want.ImageDigest), want.ImageVirtualSize, virtlet1DataOffset),
				Allowed: fmt.Sprintf("a device of at least %d bytes", virtlet1DataOffset+want.ImageVirtualSize)}
		}
		fields := logrus.Fields{"volume": volume, "device": dev, "image": v1.image, "size": size}
		if v1.image == want.ImageDigest {
			log.WithFields(fields).Info("persistent root file system written by Virtlet 1.x holds the image; used as Virtlet used it")
			return virtlet1DataOffset, size, nil
		}
		// Virtlet re-initialised a root whose image changed, unasked, in
		// its own layout.
		hb, err := virtlet1HeaderBytes(want.ImageDigest)
		if err != nil {
			return 0, 0, fmt.Errorf("block volume %s: %v: %w", volume, err, ports.ErrInvalidArgument)
		}
		fields["podImage"] = want.ImageDigest
		log.WithFields(fields).Info("persistent root file system written by Virtlet 1.x holds another image; re-initialising it, as Virtlet did")
		start := time.Now()
		if err := writeRootfs(ctx, f, dev, volume, want, virtlet1DataOffset, size, hb); err != nil {
			return 0, 0, err
		}
		fields["millis"] = time.Since(start).Milliseconds()
		log.WithFields(fields).Info("image written to the persistent root file system in Virtlet 1.x's layout")
		return virtlet1DataOffset, size, nil
	}
	h, ok := rootfsheader.Read(first)
	switch {
	case ok && h.Image == want.ImageDigest:
		log.WithFields(logrus.Fields{"volume": volume, "device": dev, "image": h.Image}).Info("persistent root file system holds the image")
		return h.DataOffset, devSize - h.DataOffset, nil
	case ok && !want.Reinitialize:
		return 0, 0, &ports.InvalidError{Field: field, Value: dev,
			Reason: fmt.Sprintf("it holds image %s (%s), written %s; the pod's image is %s (%s)",
				nameOr(h.Name, h.Image), h.Image, h.Written.Format(time.RFC3339), nameOr(want.ImageName, want.ImageDigest), want.ImageDigest),
			Allowed: reinit}
	case !ok && !zero(first) && !want.Reinitialize:
		return 0, 0, &ports.InvalidError{Field: field, Value: dev,
			Reason: "it holds data that is not a Virtlet persistent root file system", Allowed: reinit}
	}
	if need := int64(DataOffset) + want.ImageVirtualSize; devSize < need {
		return 0, 0, &ports.InvalidError{Field: field, Value: dev,
			Reason: fmt.Sprintf("the device has %d bytes; image %s needs %d (its virtual size) + %d (the header)",
				devSize, nameOr(want.ImageName, want.ImageDigest), want.ImageVirtualSize, DataOffset),
			Allowed: fmt.Sprintf("a device of at least %d bytes", need)}
	}
	hb, err := rootfsheader.Header{Image: want.ImageDigest, Name: want.ImageName, VirtualSize: want.ImageVirtualSize,
		DataOffset: DataOffset, Written: time.Now().UTC().Truncate(time.Second)}.Bytes()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := writeRootfs(ctx, f, dev, volume, want, DataOffset, devSize-DataOffset, hb); err != nil {
		return 0, 0, err
	}
	log.WithFields(logrus.Fields{"volume": volume, "device": dev, "image": want.ImageDigest,
		"millis": time.Since(start).Milliseconds(), "overwrote": ok || !zero(first)}).Info("image written to the persistent root file system")
	return DataOffset, devSize - DataOffset, nil
}

// writeRootfs writes the image into the size bytes of the device from
// offset on, then the header hb at its start. No valid header is on the
// device while the image is written, so an interrupted write is never
// taken for a root holding the image: it is found without a header and
// written again (with the pod's consent when what it left is not blank, as
// a Virtlet 1.x layout's is not, its root starting in the probed first
// MiB). Virtlet 1.x wrote its header first.
func writeRootfs(ctx context.Context, f *os.File, dev, volume string, want ports.RootfsRequest, offset, size int64, hb []byte) error {
	if _, err := f.WriteAt(make([]byte, len(hb)), 0); err != nil {
		return fmt.Errorf("block volume %s: clear the header: %w", volume, err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := writeImage(ctx, want, dev, offset, size); err != nil {
		return fmt.Errorf("block volume %s: write image %s: %w", volume, nameOr(want.ImageName, want.ImageDigest), err)
	}
	if _, err := f.WriteAt(hb, 0); err != nil {
		return fmt.Errorf("block volume %s: write the header: %w", volume, err)
	}
	return f.Sync()
}

// writeImage copies the image (qcow2 or raw) as raw data into the device
// behind the header (the size bytes from offset on), with qemu-img run
// unprivileged.
func writeImage(ctx context.Context, want ports.RootfsRequest, dev string, offset, size int64) error {
	if want.ImageFormat != "qcow2" && want.ImageFormat != "raw" {
		return &ports.InvalidError{Field: "image format", Value: want.ImageFormat, Allowed: "qcow2 or raw"}
	}
	target := "driver=raw,offset=" + strconv.FormatInt(offset, 10) + ",size=" + strconv.FormatInt(size, 10) +
		",file.driver=host_device,file.filename=" + dev
	if strings.Contains(dev, ",") {
		return fmt.Errorf("device path %q has a comma, which qemu-img's options cannot hold", dev)
	}
	// The image is untrusted: this package's parser reads its header
	// again, and qemu-img copies it as a user of no account, given the
	// image and the device for the copy alone.
	info, err := diskimage.Inspect(want.ImagePath)
	if err != nil {
		return fmt.Errorf("image %s: %v: %w", want.ImagePath, err, ports.ErrInvalidArgument)
	}
	if info.Format != want.ImageFormat {
		return &ports.InvalidError{Field: "image format", Value: want.ImageFormat, Reason: "the image file is " + info.Format, Allowed: info.Format}
	}
	if err := (diskimage.Tool{UID: diskimage.VolumeToolUID}).Convert(ctx, want.ImagePath, want.ImageFormat, dev, target); err != nil {
		return err
	}
	// qemu-img flushes; make sure the device's cache reached it too.
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fsync(int(f.Fd()))
}

var (
	zero   = rootfsheader.Zero
	nameOr = rootfsheader.NameOr
)
