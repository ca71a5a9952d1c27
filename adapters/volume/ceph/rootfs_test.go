package ceph

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/virtlet/virtlet/adapters/volume/internal/rootfsheader"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/cephcluster"
	"github.com/virtlet/virtlet/testing/harness"
)

// configuredForRoots is configured with a state directory the disk tools'
// user may search, as the daemon's plugin state directories are.
func configuredForRoots(t *testing.T) *Volumes {
	t.Helper()
	return configuredIn(t, harness.SearchableTempDir(t))
}

// adminPool opens the rbd pool as the cluster's admin, to look at what
// the plugin wrote.
func adminPool(t *testing.T, c *cephcluster.Cluster) *rados.IOContext {
	t.Helper()
	conn, err := rados.NewConnWithUser("admin")
	if err != nil {
		t.Fatal(err)
	}
	conn.ReadConfigFile(c.Conf)
	if err := conn.Connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Shutdown)
	ioctx, err := conn.OpenIOContext("rbd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ioctx.Destroy)
	return ioctx
}

// readRBD reads n bytes of an RBD image at off.
func readRBD(t *testing.T, ioctx *rados.IOContext, name string, off, n int64) []byte {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	b := make([]byte, n)
	if _, err := img.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b
}

func writeRBD(t *testing.T, ioctx *rados.IOContext, name string, off int64, b []byte) {
	t.Helper()
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := img.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// qcow2Image makes a qcow2 image of size bytes whose only data are the
// qemu-io writes given, and returns its path and the sha256 of its raw
// content (qemu-img's own conversion).
func qcow2Image(t *testing.T, name string, size int64, writes ...string) (string, [32]byte) {
	t.Helper()
	dir := harness.SearchableTempDir(t)
	q := filepath.Join(dir, name+".qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", q, fmt.Sprint(size))
	for _, w := range writes {
		run(t, "qemu-io", "-f", "qcow2", "-c", w, q)
	}
	os.Chmod(q, 0o644) // as the image store keeps images
	raw := filepath.Join(dir, name+".raw")
	run(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", q, raw)
	defer os.Remove(raw)
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return q, sum(t, f, size)
}

// sum is the sha256 of n bytes of r, read without holding them.
func sum(t *testing.T, r io.Reader, n int64) [32]byte {
	t.Helper()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, io.LimitReader(r, n), make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// sumRBD is the sha256 of n bytes of an RBD image from off.
func sumRBD(t *testing.T, ioctx *rados.IOContext, name string, off, n int64) [32]byte {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	return sum(t, io.NewSectionReader(img, off, n), n)
}

func run(t *testing.T, prog string, args ...string) {
	t.Helper()
	if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// The persistent root on RBD, against a real cluster: the first pod's
// Prepare creates the RBD image and writes the image's raw content behind
// the header, returning the slice the VM boots; the next pod with the same
// image boots what the guest left, unwritten; another image is refused
// naming both unless the pod asks to reinitialise, which rewrites it
// (zeroing what the old image left where the new one is empty); an
// interrupted write is written again; foreign data, a capacity too small
// and a read-only root are refused; a mostly empty 3 GiB image writes only
// its data.
func TestPersistentRootAgainstARealCluster(t *testing.T) {
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	c := cephcluster.Start(t)
	key := user(t, c, "libvirt")
	admin := adminPool(t, c)
	ctx := context.Background()
	v := configuredForRoots(t)
	const imgSize = 8 << 20
	imgA, sumA := qcow2Image(t, "a", imgSize, "write -P 0x41 0 64k", "write -P 0x61 3M 300k")
	imgB, sumB := qcow2Image(t, "b", imgSize, "write -P 0x42 5M 128k")
	req := func(volume, img, digest string, reinit bool, kv ...string) ports.VolumeRequest {
		o := opts(key, append([]string{"volume", volume, "rootfs", "true"}, kv...)...)
		return ports.VolumeRequest{VMID: "0123abcd", PodUID: "uid-r", Name: "root", Type: "ceph", Options: o,
			Rootfs: &ports.RootfsRequest{ImagePath: img, ImageFormat: "qcow2", ImageDigest: digest, ImageName: "virtlet.cloud/" + digest[7:],
				ImageVirtualSize: imgSize, Reinitialize: reinit}}
	}
	content := func(name string) [32]byte { return sumRBD(t, admin, name, rootfsheader.DataOffset, imgSize) }
	header := func(name string) string { return string(readRBD(t, admin, name, 0, 256)) }

	// First pod: the image is created and written, the header last.
	att, err := v.Prepare(ctx, req("root", imgA, "sha256:aaaa", false, "create", "true", "capacity", "16MiB"))
	if err != nil {
		t.Fatal(err)
	}
	d := att.Disks[0]
	if d.Source.Type != ports.SourceNetwork || d.Source.Name != "rbd/root" || d.Source.Format != "raw" || d.ReadOnly ||
		d.Source.Offset != rootfsheader.DataOffset || d.Source.Size != 16<<20-rootfsheader.DataOffset || att.Format != "" {
		t.Fatalf("attachment %+v", att)
	}
	if content("root") != sumA {
		t.Fatal("the bytes behind the header are not the image's raw content")
	}
	h := header("root")
	if !strings.HasPrefix(h, rootfsheader.Magic+`{"image":"sha256:aaaa","name":"virtlet.cloud/aaaa","virtualSize":8388608,"dataOffset":1048576`) {
		t.Fatalf("header %q", h)
	}
	if status := c.Run(t, "rbd", "status", "rbd/root"); !strings.Contains(status, "Watchers: none") {
		t.Errorf("the plugin left a watch on the image:\n%s", status)
	}

	// The guest writes; the next pod with the same image keeps it, and
	// nothing is written (the header keeps its time).
	writeRBD(t, admin, "root", rootfsheader.DataOffset+100, []byte("guest-was-here"))
	time.Sleep(1100 * time.Millisecond) // a rewrite would show in the header's time
	if _, err := v.Prepare(ctx, req("root", imgA, "sha256:aaaa", false)); err != nil {
		t.Fatal(err)
	}
	if got := readRBD(t, admin, "root", rootfsheader.DataOffset+100, 14); string(got) != "guest-was-here" {
		t.Fatalf("the guest's change is gone: %q", got)
	}
	if header("root") != h {
		t.Fatalf("the header was rewritten:\n%q\n%q", header("root"), h)
	}

	// Another image: refused naming both, unless the pod asks.
	_, err = v.Prepare(ctx, req("root", imgB, "sha256:bbbb", false))
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "sha256:aaaa") ||
		!strings.Contains(err.Error(), "sha256:bbbb") || !strings.Contains(err.Error(), "VirtletPersistentRootfsReinit") {
		t.Fatalf("another image: %v", err)
	}
	if _, err := v.Prepare(ctx, req("root", imgB, "sha256:bbbb", true)); err != nil {
		t.Fatal(err)
	}
	if content("root") != sumB {
		t.Fatal("reinitialising did not leave the new image's raw content (zeros where the old image had data)")
	}
	if !strings.HasPrefix(header("root"), rootfsheader.Magic+`{"image":"sha256:bbbb"`) {
		t.Fatalf("header %q", header("root"))
	}

	// An interrupted write (the header cleared first, part of the image
	// written) is found blank and written again, without asking.
	writeRBD(t, admin, "root", 0, make([]byte, rootfsheader.Size))
	if _, err := v.Prepare(ctx, req("root", imgA, "sha256:aaaa", false)); err != nil {
		t.Fatalf("after an interrupted write: %v", err)
	}
	if content("root") != sumA {
		t.Fatal("the rewrite after an interrupted write left the other image's data")
	}

	// Data that is not a persistent root is never overwritten unasked.
	c.Run(t, "rbd", "create", "--size", "16M", "rbd/foreign")
	writeRBD(t, admin, "foreign", 1024, []byte("someone's file system"))
	if _, err := v.Prepare(ctx, req("foreign", imgA, "sha256:aaaa", false)); !errors.Is(err, ports.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "not a Virtlet persistent root") {
		t.Fatalf("foreign data: %v", err)
	}
	if got := readRBD(t, admin, "foreign", 1024, 21); string(got) != "someone's file system" {
		t.Fatal("foreign data was touched")
	}

	// Too small: a capacity, or an existing image, without room for the
	// header and the image.
	if _, err := v.Prepare(ctx, req("small", imgA, "sha256:aaaa", false, "create", "true", "capacity", "8MiB")); !errors.Is(err, ports.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "option capacity") || !strings.Contains(err.Error(), "at least 9437184 bytes") {
		t.Fatalf("small capacity: %v", err)
	}
	c.Run(t, "rbd", "create", "--size", "8M", "rbd/small")
	if _, err := v.Prepare(ctx, req("small", imgA, "sha256:aaaa", false)); !errors.Is(err, ports.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "the RBD image has 8388608 bytes") {
		t.Fatalf("small image: %v", err)
	}

	// A read-only root, and the option without the runtime's request.
	ro := req("root", imgA, "sha256:aaaa", false)
	ro.ReadOnly = true
	if _, err := v.Prepare(ctx, ro); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "option rootfs") {
		t.Fatalf("read-only: %v", err)
	}
	bare := req("root", imgA, "sha256:aaaa", false)
	bare.Rootfs = nil
	if _, err := v.Prepare(ctx, bare); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("rootfs without a request: %v", err)
	}

	// A mostly empty 3 GiB image: only its data reach the cluster.
	const bigSize = 3 << 30
	big, sumBig := qcow2Image(t, "big", bigSize, "write -P 0x43 0 1M", "write -P 0x44 2G 1M")
	bigReq := req("big", big, "sha256:cccc", false, "create", "true", "capacity", "3073MiB")
	bigReq.Rootfs.ImageVirtualSize = bigSize
	start := time.Now()
	if _, err := v.Prepare(ctx, bigReq); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	var du struct {
		Images []struct {
			Name string `json:"name"`
			Used int64  `json:"used_size"`
		} `json:"images"`
	}
	// rbd warns on stderr that the image has no fast-diff map.
	out, err := exec.Command("rbd", "-c", c.Conf, "du", "--format", "json", "rbd/big").Output()
	if err != nil {
		t.Fatalf("rbd du: %v", err)
	}
	if err := json.Unmarshal(out, &du); err != nil || len(du.Images) != 1 || du.Images[0].Used > 32<<20 {
		t.Fatalf("rbd du %s: %+v %v: more than the image's data was written", out, du, err)
	}
	if sumRBD(t, admin, "big", rootfsheader.DataOffset, bigSize) != sumBig {
		t.Fatal("the 3 GiB image's raw content differs")
	}
	t.Logf("3 GiB image with 2 MiB of data written in %s, %d bytes used in RBD", took.Round(time.Millisecond), du.Images[0].Used)
	// Reinitialised, the RBD image's holes are zeroed as discards, not
	// written.
	bigReq.Rootfs.ImageDigest, bigReq.Rootfs.Reinitialize = "sha256:dddd", true
	start = time.Now()
	if _, err := v.Prepare(ctx, bigReq); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 GiB image reinitialised in %s", time.Since(start).Round(time.Millisecond))
	if out, err = exec.Command("rbd", "-c", c.Conf, "du", "--format", "json", "rbd/big").Output(); err != nil {
		t.Fatalf("rbd du: %v", err)
	}
	if err := json.Unmarshal(out, &du); err != nil || len(du.Images) != 1 || du.Images[0].Used > 32<<20 {
		t.Fatalf("rbd du after reinitialising %s: %+v %v: the holes were written", out, du, err)
	}
	if entries, _ := os.ReadDir(v.work); len(entries) != 0 {
		t.Errorf("raw copies left in the work directory: %v", entries)
	}
	if strings.Contains(c.Logs(), key) {
		t.Error("the key is in the cluster's logs")
	}
}

// The rootfs option is checked like the others, naming it.
func TestRootfsOption(t *testing.T) {
	v := configured(t)
	key := "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	_, err := v.Validate(context.Background(), ports.VolumeRequest{PodUID: "u", Name: "root", Type: "ceph", Options: opts(key, "rootfs", "yes")})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "ceph volume root option rootfs") {
		t.Fatalf("rootfs: yes: %v", err)
	}
	kept, err := v.Validate(context.Background(), ports.VolumeRequest{PodUID: "u", Name: "root", Type: "ceph", Options: opts(key, "rootfs", "true")})
	if err != nil || kept["rootfs"] != "true" {
		t.Fatalf("rootfs: true: %v %v", kept, err)
	}
	if info := v.PluginInfo(); len(info.RootfsTypes) != 1 || info.RootfsTypes[0] != "ceph" {
		t.Fatalf("the plugin does not declare ceph volumes able to hold a root: %+v", info)
	}
}
