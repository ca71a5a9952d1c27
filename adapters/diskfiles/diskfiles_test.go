package diskfiles

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

func need(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the disk tools run as a user of no account, which needs root")
	}
	for _, tool := range []string{"qemu-img", "qemu-io", "sfdisk", "mkfs.ext4", "debugfs", "blkid", "prlimit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
}

var tool diskimage.Tool

func must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// disk makes a raw disk image like a cloud image: an MBR with a small
// non-Linux partition first and an ext4 root file system (with /etc, /usr
// and a symlink pointing out of the image) second. It returns the image
// and the root partition's byte offset.
func disk(t *testing.T, dir string) (string, int64) {
	t.Helper()
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "usr", "var"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("image\n"), 0o644)
	// A hostile image: following these on the host would write outside it.
	os.Symlink(dir, filepath.Join(root, "etc", "escape"))
	os.Symlink("/", filepath.Join(root, "var", "run"))
	rootImg := filepath.Join(dir, "root.img")
	must(t, "mkfs.ext4", "-q", "-F", "-L", "root", "-d", root, rootImg, "24M")
	img := filepath.Join(dir, "disk.raw")
	f, _ := os.Create(img)
	f.Truncate(32 << 20)
	f.Close()
	must(t, "sh", "-c", "printf 'start=2048, size=4096, type=e\\nstart=6144, type=83\\n' | sfdisk -q "+img)
	must(t, "dd", "if="+rootImg, "of="+img, "bs=512", "seek=6144", "conv=notrunc", "status=none")
	return img, 6144 * 512
}

// readFile reads a file of the ext4 file system at offset in image,
// without mounting it.
func readFile(t *testing.T, image string, offset int64, p string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	part := filepath.Join(dir, "part.img")
	must(t, "dd", "if="+image, "of="+part, "bs=512", "skip="+strconv.FormatInt(offset/512, 10), "status=none")
	out := filepath.Join(dir, "out")
	must(t, "debugfs", "-R", "dump "+p+" "+out, part)
	data, err := os.ReadFile(out)
	if err != nil {
		return "", ""
	}
	stat := must(t, "debugfs", "-R", "stat "+p, part)
	return string(data), stat
}

var files = []ports.GuestFile{
	{Path: "/etc/locale.conf", Data: []byte("LANG=pl_PL.UTF-8\n"), Mode: 0o644},
	{Path: "/root/.ssh/key", Data: []byte("secret"), Mode: 0o600},
}

func check(t *testing.T, image string, offset int64, outside string) {
	t.Helper()
	if data, stat := readFile(t, image, offset, "/etc/locale.conf"); data != "LANG=pl_PL.UTF-8\n" || !strings.Contains(stat, "Mode:  0644") {
		t.Errorf("/etc/locale.conf: %q\n%s", data, stat)
	}
	if data, stat := readFile(t, image, offset, "/root/.ssh/key"); data != "secret" || !strings.Contains(stat, "Mode:  0600") || !strings.Contains(stat, "User:     0   Group:     0") {
		t.Errorf("/root/.ssh/key: %q\n%s", data, stat)
	}
	if data, _ := readFile(t, image, offset, "/etc/hostname"); data != "image\n" {
		t.Errorf("the image's own file changed: %q", data)
	}
}

func leftovers(t *testing.T, work string) {
	t.Helper()
	if _, err := os.Stat(work); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work directory left: %v", err)
	}
}

// watchMounts fails the test if a file system of a disk image is mounted
// on the host until the returned function is called: one on a loop or NBD
// device, a FUSE file system, or any mount under dir (the test's own
// files). Other suites of make check mount network namespaces and bind 9p
// shares meanwhile: those are not this test's.
func watchMounts(t *testing.T, dir string) func() {
	t.Helper()
	read := func() map[string]bool {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		lines := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			lines[l] = true
		}
		return lines
	}
	before := read()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			for line := range read() {
				if !before[line] && imageMount(line, dir) {
					t.Errorf("a disk image's file system was mounted on the host while the files were written:\n%s", line)
					return
				}
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// imageMount says whether a line of /proc/self/mountinfo ("ID parent
// major:minor root mountpoint options … - type source options") mounts a
// disk image's file system, or mounts anything under dir.
func imageMount(line, dir string) bool {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return false
	}
	at, what := strings.Fields(pre), strings.Fields(post)
	if len(at) < 5 || len(what) < 2 {
		return false
	}
	point, fsType, source := at[4], what[0], what[1]
	return strings.HasPrefix(source, "/dev/loop") || strings.HasPrefix(source, "/dev/nbd") ||
		strings.HasPrefix(fsType, "fuse") || point == dir || strings.HasPrefix(point, dir+"/")
}

// The watch tells a disk image's mount from the mounts other suites make.
func TestImageMount(t *testing.T) {
	const dir = "/tmp/vt-1/TestWrite123/001"
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"50 27 7:3 / /mnt/x rw,relatime - ext4 /dev/loop3 rw", true},
		{"50 27 43:0 / /mnt/x rw,relatime - ext4 /dev/nbd0 rw", true},
		{"50 27 0:55 / /mnt/x rw,nosuid - fuse.guestmount /dev/fuse rw", true},
		{"50 27 254:0 /srv " + dir + "/work/vm/root rw - ext4 /dev/vda rw", true},
		{"46 43 0:4 net:[4026532179] /run/netns/vt59ce36n82-938386b047a7dbdb rw shared:2 - nsfs nsfs rw", false},
		{"44 27 254:0 /tmp/vt-1/shares /tmp/vt-1/virtlet-vm-3/state/plugins/ninep/shares rw,relatime - ext4 /dev/vda rw", false},
		{"50 27 254:0 / " + dir + "0 rw - ext4 /dev/vda rw", false},
	} {
		if got := imageMount(tc.line, dir); got != tc.want {
			t.Errorf("imageMount(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// Files reach the root file system of a qcow2 overlay (which stays thin,
// its base untouched), of a raw image, and of a raw slice behind a header,
// with no host mount and no tool run as root; a symlink in the image never
// leads a write out of it.
func TestWrite(t *testing.T) {
	need(t)
	ctx := context.Background()
	t.Run("qcow2 overlay", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		base, off := disk(t, dir)
		baseSum := must(t, "sha256sum", base)
		overlay := filepath.Join(dir, "overlay.qcow2")
		must(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay, "40M")
		os.Chmod(overlay, 0o600)
		work := filepath.Join(dir, "work", "vm")
		stop := watchMounts(t, dir)
		err := Write(ctx, tool, Disk{Path: overlay, Format: "qcow2", Backing: base}, files, work)
		stop()
		if err != nil {
			t.Fatal(err)
		}
		leftovers(t, work)
		flat := filepath.Join(dir, "flat.raw")
		must(t, "qemu-img", "convert", "-O", "raw", overlay, flat)
		check(t, flat, off, dir)
		if must(t, "sha256sum", base) != baseSum {
			t.Error("the base image was written")
		}
		// Only what changed went into the overlay: a few clusters, not
		// the file system.
		var info struct {
			ActualSize  int64 `json:"actual-size"`
			VirtualSize int64 `json:"virtual-size"`
		}
		json.Unmarshal([]byte(must(t, "qemu-img", "info", "--output=json", "-U", overlay)), &info)
		if info.VirtualSize != 40<<20 || info.ActualSize > 1<<20 {
			t.Errorf("overlay: virtual size %d, %d bytes on disk; want 40 MiB, under 1 MiB", info.VirtualSize, info.ActualSize)
		}
		if st, _ := os.Stat(overlay); st.Mode().Perm() != 0o600 {
			t.Errorf("overlay mode %o", st.Mode().Perm())
		}
	})
	t.Run("raw slice behind a header", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		img, off := disk(t, dir)
		dev := filepath.Join(dir, "device.raw")
		must(t, "sh", "-c", "head -c 1048576 /dev/zero > "+dev+" && cat "+img+" >> "+dev)
		work := filepath.Join(dir, "work", "vm")
		stop := watchMounts(t, dir)
		err := Write(ctx, tool, Disk{Path: dev, Format: "raw", Offset: 1 << 20, Size: 32 << 20}, files, work)
		stop()
		if err != nil {
			t.Fatal(err)
		}
		leftovers(t, work)
		check(t, dev, (1<<20)+off, dir)
	})
	// The image's symlinks resolve inside it: /var/run -> / leads to the
	// image's root; /etc/escape -> <a host directory> leads nowhere (the
	// image has no such directory), and the write fails.
	t.Run("symlinks in the image", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		img, off := disk(t, dir)
		work := filepath.Join(dir, "work", "vm")
		if err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, []ports.GuestFile{{Path: "/var/run/pwned", Data: []byte("in"), Mode: 0o644}}, work); err != nil {
			t.Fatal(err)
		}
		err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, []ports.GuestFile{{Path: "/etc/escape/pwned", Data: []byte("out"), Mode: 0o644}}, work)
		if err == nil || !strings.Contains(err.Error(), "/etc/escape/pwned") {
			t.Errorf("write through a symlink to a host path: %v", err)
		}
		leftovers(t, work)
		for _, p := range []string{filepath.Join(dir, "pwned"), "/pwned"} {
			if _, err := os.Stat(p); err == nil {
				os.Remove(p)
				t.Errorf("a symlink in the image led a write to the host's %s", p)
			}
		}
		if data, _ := readFile(t, img, off, "/pwned"); data != "in" {
			t.Errorf("/var/run/pwned did not land at the image's /pwned: %q", data)
		}
	})
	// A device node or a FIFO where a file goes: the image's author could
	// name a host disk there, or stall the plugin. Neither is opened.
	t.Run("special files in the image", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		target := filepath.Join(dir, "host-disk.img")
		os.WriteFile(target, make([]byte, 1<<20), 0o600)
		hostLoop := strings.TrimSpace(must(t, "losetup", "--find", "--show", target))
		defer exec.Command("losetup", "--detach", hostLoop).Run()
		var st unix.Stat_t
		unix.Stat(hostLoop, &st)
		root := filepath.Join(dir, "rootfs")
		os.MkdirAll(filepath.Join(root, "etc"), 0o755)
		os.MkdirAll(filepath.Join(root, "usr"), 0o755)
		if err := unix.Mknod(filepath.Join(root, "etc", "app.conf"), unix.S_IFBLK|0o644, int(st.Rdev)); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(filepath.Join(root, "etc", "fifo.conf"), 0o644); err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(dir, "special.img")
		must(t, "mkfs.ext4", "-q", "-F", "-d", root, img, "16M")
		work := filepath.Join(dir, "work", "vm")
		for _, p := range []string{"/etc/app.conf", "/etc/fifo.conf"} {
			err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, []ports.GuestFile{{Path: p, Data: []byte("WRITTEN-TO-HOST-DEVICE"), Source: "key x"}}, work)
			if err == nil || !strings.Contains(err.Error(), "write "+p+" (key x)") {
				t.Errorf("%s: %v", p, err)
			}
			leftovers(t, work)
		}
		if data, _ := os.ReadFile(target); strings.Contains(string(data), "WRITTEN") {
			t.Fatal("a device node in the image led a write to a host device")
		}
	})
	t.Run("no root file system", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		img := filepath.Join(dir, "blank.raw")
		f, _ := os.Create(img)
		f.Truncate(8 << 20)
		f.Close()
		work := filepath.Join(dir, "work", "vm")
		err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, files, work)
		if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no Linux root file system") {
			t.Fatalf("err %v", err)
		}
		leftovers(t, work)
	})
	// A root file system debugfs cannot edit is refused by name: writing
	// it would take a host mount.
	t.Run("xfs root", func(t *testing.T) {
		if _, err := exec.LookPath("mkfs.xfs"); err != nil {
			t.Skip("no mkfs.xfs")
		}
		dir := harness.SearchableTempDir(t)
		img := filepath.Join(dir, "xfs.raw")
		f, _ := os.Create(img)
		f.Truncate(320 << 20)
		f.Close()
		must(t, "mkfs.xfs", "-q", img)
		work := filepath.Join(dir, "work", "vm")
		err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, files, work)
		if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "the whole disk: a xfs file system, which only a host mount could write") {
			t.Fatalf("err %v", err)
		}
		leftovers(t, work)
	})
	// The tools run as a user of no account: a disk in a directory only
	// root may search is out of their reach.
	t.Run("tools are not root", func(t *testing.T) {
		dir := harness.SearchableTempDir(t)
		private := filepath.Join(dir, "private")
		os.Mkdir(private, 0o700)
		img, _ := disk(t, private)
		err := Write(ctx, tool, Disk{Path: img, Format: "raw"}, files, filepath.Join(dir, "work", "vm"))
		if err == nil || !strings.Contains(err.Error(), "cannot search "+private) {
			t.Fatalf("err %v, want the tools' user refused", err)
		}
	})
	t.Run("paths debugfs would misread", func(t *testing.T) {
		for _, p := range []string{`/etc/a"b`, "/etc/a\nb", `/etc/a\b`, "etc/relative", "/"} {
			err := Write(ctx, tool, Disk{Path: "/nonexistent", Format: "raw"}, []ports.GuestFile{{Path: p}}, filepath.Join(t.TempDir(), "w"))
			var invalid *ports.InvalidError
			if !errors.As(err, &invalid) {
				t.Errorf("%q: err %v, want invalid", p, err)
			}
		}
	})
}

// Cleanup removes what an interrupted Write left: its work files.
func TestCleanup(t *testing.T) {
	workRoot := filepath.Join(t.TempDir(), "inject")
	os.MkdirAll(filepath.Join(workRoot, "vm"), 0o711)
	os.WriteFile(filepath.Join(workRoot, "vm", "1-disk.raw"), []byte("x"), 0o600)
	if err := Cleanup(workRoot); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(workRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work directory left")
	}
}
