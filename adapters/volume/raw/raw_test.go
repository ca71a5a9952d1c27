package raw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
	"github.com/virtlet/virtlet/testing/harness"
)

// loopDevice makes a loop device over a sparse file of size bytes,
// detached after the test. Tests using it need root.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	return harness.LoopDevice(t, size, nil)
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func configured(t *testing.T, globs ...string) *Volumes {
	t.Helper()
	v := New(quiet())
	cfg := `{"allowedPaths":["` + strings.Join(globs, `","`) + `"]}`
	if len(globs) == 0 {
		cfg = ""
	}
	if err := v.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg), StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	return v
}

func rawEnv(v ports.Volumes, dev string) volumetest.Env {
	return volumetest.Env{
		Volumes: v, Persistent: true, Shared: true,
		Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
			return ports.VolumeRequest{VMID: vmID, Name: name, Type: "raw", Options: map[string]string{"path": dev}}
		},
		Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
			return isBlock(att.Disks[0].Source.Path) == nil
		},
		Invalid: ports.VolumeRequest{VMID: "vm", Name: "data", Type: "raw", Options: map[string]string{"path": "/etc/passwd"}},
	}
}

func TestRawContract(t *testing.T) {
	dev := loopDevice(t, 8<<20)
	t.Run("in process", func(t *testing.T) { volumetest.Run(t, rawEnv(configured(t, "/dev/loop*"), dev)) })
	t.Run("over gRPC", func(t *testing.T) {
		volumetest.Run(t, rawEnv(volume.NewClient(sdktest.Conn(t, configured(t, "/dev/loop*"))), dev))
	})
}

// The operator's globs decide which devices raw flexvolumes may use; every
// refusal names the option and says what is allowed.
func TestRawPathChecks(t *testing.T) {
	dev := loopDevice(t, 8<<20)
	link := filepath.Join("/dev", "virtlet-test-link-"+filepath.Base(t.TempDir()))
	if err := os.Symlink("/etc/hostname", link); err == nil {
		t.Cleanup(func() { os.Remove(link) })
	}
	for _, tc := range []struct {
		name  string
		globs []string
		path  string
		want  string
	}{
		{"no globs configured", nil, dev, "allowedPaths lists no device globs"},
		{"outside the globs", []string{"/dev/mapper/*"}, dev, "does not allow this device"},
		{"not under /dev", []string{"/dev/*"}, "/etc/passwd", "not a clean path under /dev"},
		{"dot-dot", []string{"/dev/*"}, "/dev/../etc/passwd", "not a clean path"},
		{"missing", []string{"/dev/*"}, "/dev/virtlet-no-such-device", "no such file"},
		{"symlink out of /dev", []string{"/dev/*"}, link, "outside /dev"},
		{"not a block device", []string{"/dev/*"}, "/dev/null", "not a block device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := configured(t, tc.globs...)
			_, err := v.Validate(context.Background(), ports.VolumeRequest{Name: "raw", Type: "raw", Options: map[string]string{"path": tc.path}})
			if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "option path") {
				t.Fatalf("err %v, want %q naming the option", err, tc.want)
			}
		})
	}
}

// kubelet hands block volumes as a device node of its own (bind-mounted
// under the pod's directory); the disk names the node's /dev device.
func TestBlockVolumeUsesTheDevDevice(t *testing.T) {
	dev := loopDevice(t, 8<<20)
	node := filepath.Join(t.TempDir(), "pvc-0001")
	if out, err := exec.Command("mknod", node, "b", majorMinor(t, dev)[0], majorMinor(t, dev)[1]).CombinedOutput(); err != nil {
		t.Fatalf("mknod: %v: %s", err, out)
	}
	v := configured(t)
	att, err := v.Prepare(context.Background(), ports.VolumeRequest{VMID: "vm", Name: "pvc-0001", Type: ports.VolumeBlock, HostPath: node})
	if err != nil {
		t.Fatal(err)
	}
	if d := att.Disks[0]; d.Source.Path != dev || d.Source.Type != ports.SourceBlock {
		t.Fatalf("disk %+v, want %s", d, dev)
	}
	_, err = v.Prepare(context.Background(), ports.VolumeRequest{VMID: "vm", Name: "x", Type: ports.VolumeBlock, HostPath: "/etc/hostname"})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a block device") {
		t.Fatalf("a file as block volume: %v", err)
	}
}

func majorMinor(t *testing.T, dev string) [2]string {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return [2]string{strconv.Itoa(int(unix.Major(st.Rdev))), strconv.Itoa(int(unix.Minor(st.Rdev)))}
}

// image makes a qcow2 image with recognisable content and returns its path
// and its raw content.
func image(t *testing.T, fill string, size int64) (string, []byte) {
	t.Helper()
	dir := harness.SearchableTempDir(t)
	raw := bytes.Repeat([]byte(fill), int(size)/len(fill))
	rawPath := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(rawPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(dir, "img.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", rawPath, q).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	return q, raw
}

// The persistent root story: a blank device gets the image once behind
// its header; the guest's changes survive the next pod; another image is
// refused unless the pod asks to reinitialise; data that is not a root
// file system is never overwritten without asking; a device too small is
// refused up front.
func TestPersistentRootfs(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed")
	}
	dev := loopDevice(t, 8<<20)
	v := configured(t)
	ctx := context.Background()
	imgA, rawA := image(t, "image-A!", 2<<20)
	imgB, rawB := image(t, "image-B?", 2<<20)
	req := func(img, digest string, reinit bool) ports.VolumeRequest {
		return ports.VolumeRequest{VMID: "vm", Name: "root-pv", Type: ports.VolumeBlock, HostPath: dev,
			Rootfs: &ports.RootfsRequest{ImagePath: img, ImageFormat: "qcow2", ImageDigest: digest, ImageName: "virtlet.cloud/" + digest[7:],
				ImageVirtualSize: 2 << 20, Reinitialize: reinit}}
	}
	att, err := v.Prepare(ctx, req(imgA, "sha256:aaaa", false))
	if err != nil {
		t.Fatal(err)
	}
	d := att.Disks[0].Source
	if d.Offset != DataOffset || d.Size != 8<<20-DataOffset || d.Path != dev {
		t.Fatalf("disk source %+v", d)
	}
	if got := harness.ReadAt(t, dev, DataOffset, int64(len(rawA))); !bytes.Equal(got, rawA) {
		t.Fatal("the image is not behind the header")
	}
	if h := harness.ReadAt(t, dev, 0, 64); !bytes.HasPrefix(h, []byte(headerMagic+`{"image":"sha256:aaaa"`)) {
		t.Fatalf("header %q", h)
	}
	// The guest writes; the next pod with the same image keeps it.
	f, _ := os.OpenFile(dev, os.O_RDWR, 0)
	f.WriteAt([]byte("guest-was-here"), DataOffset+100)
	f.Close()
	if _, err := v.Prepare(ctx, req(imgA, "sha256:aaaa", false)); err != nil {
		t.Fatal(err)
	}
	if got := harness.ReadAt(t, dev, DataOffset+100, 14); string(got) != "guest-was-here" {
		t.Fatalf("the guest's change is gone: %q", got)
	}
	// Another image: refused, naming both, unless asked.
	_, err = v.Prepare(ctx, req(imgB, "sha256:bbbb", false))
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "sha256:aaaa") ||
		!strings.Contains(err.Error(), "sha256:bbbb") || !strings.Contains(err.Error(), "VirtletPersistentRootfsReinit") {
		t.Fatalf("another image: %v", err)
	}
	if _, err := v.Prepare(ctx, req(imgB, "sha256:bbbb", true)); err != nil {
		t.Fatal(err)
	}
	if got := harness.ReadAt(t, dev, DataOffset, int64(len(rawB))); !bytes.Equal(got, rawB) {
		t.Fatal("reinitialising did not write the new image")
	}
	// Foreign data (no header) is not overwritten without asking.
	foreign := loopDevice(t, 8<<20)
	f, _ = os.OpenFile(foreign, os.O_RDWR, 0)
	f.WriteAt([]byte("someone's file system"), 1024)
	f.Close()
	fr := req(imgA, "sha256:aaaa", false)
	fr.HostPath = foreign
	if _, err := v.Prepare(ctx, fr); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a Virtlet persistent root") {
		t.Fatalf("foreign data: %v", err)
	}
	if got := harness.ReadAt(t, foreign, 1024, 21); string(got) != "someone's file system" {
		t.Fatal("foreign data was touched")
	}
	// Too small for the image and the header.
	small := loopDevice(t, 2<<20)
	sr := req(imgA, "sha256:aaaa", false)
	sr.HostPath = small
	if _, err := v.Prepare(ctx, sr); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "needs") {
		t.Fatalf("small device: %v", err)
	}
	// Release never touches the data.
	if err := v.Release(ctx, req(imgB, "sha256:bbbb", false)); err != nil {
		t.Fatal(err)
	}
	if got := harness.ReadAt(t, dev, DataOffset, int64(len(rawB))); !bytes.Equal(got, rawB) {
		t.Fatal("release changed the device")
	}
}

// A persistent root written by Virtlet 1.x (its header in the first
// sector, the root file system from the second) gives the guest the whole
// device after that sector, as Virtlet's device-mapper table did, however
// large the image: a root the guest grew is used whole. It is used as it
// is while it holds the pod's image, and re-initialised unasked, as
// Virtlet did, when the image changed, keeping Virtlet's layout; a device
// smaller than the image is refused, and a metadata version Virtlet never
// wrote unless the pod asks to reinitialise.
func TestVirtlet1PersistentRootfs(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed")
	}
	v := configured(t)
	ctx := context.Background()
	imgA, _ := image(t, "image-A!", 2<<20)
	imgB, rawB := image(t, "image-B?", 2<<20)
	hashA, hashB := sha256.Sum256([]byte("image A")), sha256.Sum256([]byte("image B"))
	digestA, digestB := "sha256:"+hex.EncodeToString(hashA[:]), "sha256:"+hex.EncodeToString(hashB[:])
	header := func(version uint16, hash [32]byte) []byte {
		hdr := binary.BigEndian.AppendUint64(nil, 0x263dbe52ba576702)
		hdr = binary.BigEndian.AppendUint16(hdr, version)
		return append(hdr, hash[:]...)
	}
	const devSize = 8 << 20
	virtlet1 := func(size int64, version uint16, hash [32]byte) string {
		dev := loopDevice(t, size)
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for off, b := range map[int64][]byte{0: header(version, hash), 512: []byte("written-by-virtlet-1"),
			size - 16: []byte("grown-by-guest")} {
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
		return dev
	}
	req := func(dev, img, digest string) ports.VolumeRequest {
		return ports.VolumeRequest{VMID: "vm", Name: "root-pv", Type: ports.VolumeBlock, HostPath: dev,
			Rootfs: &ports.RootfsRequest{ImagePath: img, ImageFormat: "qcow2", ImageDigest: digest, ImageName: "virtlet.cloud/x", ImageVirtualSize: 2 << 20}}
	}
	wholeDevice := func(t *testing.T, att ports.VolumeAttachment, dev string) {
		t.Helper()
		if d := att.Disks[0].Source; d.Offset != 512 || d.Size != devSize-512 || d.Path != dev {
			t.Fatalf("disk source %+v, want offset 512, size %d (the device less its first sector)", d, devSize-512)
		}
	}

	// The same image: the guest's disk starts where Virtlet 1.x put it and
	// runs to the device's end, past the image's size; nothing is written.
	dev := virtlet1(devSize, 1, hashA)
	att, err := v.Prepare(ctx, req(dev, imgA, digestA))
	if err != nil {
		t.Fatal(err)
	}
	wholeDevice(t, att, dev)
	if got := harness.ReadAt(t, dev, 512, 20); string(got) != "written-by-virtlet-1" {
		t.Fatalf("the root file system was touched: %q", got)
	}
	if got := harness.ReadAt(t, dev, devSize-16, 14); string(got) != "grown-by-guest" {
		t.Fatalf("the grown root's end was touched: %q", got)
	}

	// Another image: re-initialised unasked, as Virtlet did, in Virtlet's
	// layout (its header naming the new image), the whole device again.
	att, err = v.Prepare(ctx, req(dev, imgB, digestB))
	if err != nil {
		t.Fatal(err)
	}
	wholeDevice(t, att, dev)
	if got := harness.ReadAt(t, dev, 512, int64(len(rawB))); !bytes.Equal(got, rawB) {
		t.Fatal("the new image was not written behind the first sector")
	}
	if h, want := harness.ReadAt(t, dev, 0, 512), append(header(1, hashB), make([]byte, 512-42)...); !bytes.Equal(h, want) {
		t.Fatalf("header %x, want %x", h, want)
	}
	// ... and used as it is by the next pod with that image.
	f, _ := os.OpenFile(dev, os.O_RDWR, 0)
	f.WriteAt([]byte("guest-was-here"), 512+100)
	f.Close()
	att, err = v.Prepare(ctx, req(dev, imgB, digestB))
	if err != nil {
		t.Fatal(err)
	}
	wholeDevice(t, att, dev)
	if got := harness.ReadAt(t, dev, 512+100, 14); string(got) != "guest-was-here" {
		t.Fatalf("the guest's change is gone: %q", got)
	}

	// A device smaller than the image and Virtlet's header, as Virtlet
	// refused it.
	small := virtlet1(2<<20, 1, hashA)
	if _, err := v.Prepare(ctx, req(small, imgA, digestA)); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "needs") {
		t.Fatalf("small device: %v", err)
	}

	// A metadata version Virtlet never wrote.
	odd := virtlet1(devSize, 7, hashA)
	if _, err := v.Prepare(ctx, req(odd, imgA, digestA)); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "metadata version 7") {
		t.Fatalf("version 7: %v", err)
	}
	if got := harness.ReadAt(t, odd, 512, 20); string(got) != "written-by-virtlet-1" {
		t.Fatal("a refused device was touched")
	}
	// ... overwritten when the pod asks, as its refusal says, in this
	// project's layout.
	asked := req(odd, imgB, digestB)
	asked.Rootfs.Reinitialize = true
	att, err = v.Prepare(ctx, asked)
	if err != nil {
		t.Fatalf("version 7, reinitialise: %v", err)
	}
	if d := att.Disks[0].Source; d.Offset != DataOffset || d.Size != devSize-DataOffset {
		t.Fatalf("disk source %+v", d)
	}
	if h := harness.ReadAt(t, odd, 0, 128); !bytes.HasPrefix(h, []byte(headerMagic+`{"image":"`+digestB+`"`)) {
		t.Fatalf("header %q", h)
	}
	if got := harness.ReadAt(t, odd, DataOffset, int64(len(rawB))); !bytes.Equal(got, rawB) {
		t.Fatal("the image was not written")
	}
}
