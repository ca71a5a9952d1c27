package diskimage_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/testing/harness"
)

// qemu-img check passes a sound image and refuses a corrupt one (its
// refcounts zeroed), naming the corruptions; the file's mode and ACL are
// as before either way.
func TestToolCheck(t *testing.T) {
	dir := harness.SearchableTempDir(t)
	p := func(n string) string { return filepath.Join(dir, n) }
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", p("sound.qcow2"), "1M")
	qemuIO(t, p("sound.qcow2"), "write -P 0x41 0 4k")
	data, _ := os.ReadFile(p("sound.qcow2"))
	// The first refcount block, from the refcount table at offset 48.
	table := binary.BigEndian.Uint64(data[48:56])
	block := binary.BigEndian.Uint64(data[table : table+8])
	copy(data[block:block+16], make([]byte, 16))
	os.WriteFile(p("corrupt.qcow2"), data, 0o600)
	os.Chmod(p("sound.qcow2"), 0o600)

	tool := diskimage.Tool{}
	for _, tt := range []struct{ file, want string }{
		{"sound.qcow2", ""},
		{"corrupt.qcow2", "qemu-img check found 12 corruptions"},
	} {
		info, err := diskimage.Inspect(p(tt.file))
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		err = tool.Check(context.Background(), p(tt.file), info)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.file, err)
		case tt.want != "" && (!errors.Is(err, diskimage.ErrNotADisk) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want a refusal containing %q", tt.file, err, tt.want)
		}
		st, _ := os.Stat(p(tt.file))
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v after the check, want -rw-------", tt.file, st.Mode())
		}
		if _, err := unix.Getxattr(p(tt.file), "system.posix_acl_access", make([]byte, 64)); !errors.Is(err, unix.ENODATA) {
			t.Errorf("%s: an ACL is left (%v)", tt.file, err)
		}
	}
}

// The tools run as a user of no account: through an image that names a
// root-only host file as its data file (one Inspect refuses), qemu-img is
// denied that file, while the image itself, granted for the run, opens.
func TestToolRunsUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the tools change user only when run by root")
	}
	dir := harness.SearchableTempDir(t)
	p := func(n string) string { return filepath.Join(dir, n) }
	secret := p("ca.key")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+secret+",data_file_raw=on", p("datafile.qcow2"), "1M")
	os.WriteFile(secret, []byte("secret"), 0o600)
	os.Chmod(secret, 0o600) // qemu-img made it, world-readable
	os.Chmod(p("datafile.qcow2"), 0o600)
	// qemu-img check opens the data file (info does not).
	err := diskimage.Tool{}.Check(context.Background(), p("datafile.qcow2"), diskimage.Info{Format: diskimage.QCOW2})
	if err == nil || !strings.Contains(err.Error(), "Permission denied") || !strings.Contains(err.Error(), "ca.key") {
		t.Fatalf("qemu-img check through a data file of root's: %v, want its open of ca.key denied", err)
	}
	qemuImg(t, "create", "-q", "-f", "qcow2", p("plain.qcow2"), "1M")
	os.Chmod(p("plain.qcow2"), 0o600)
	info, err := diskimage.Tool{}.Info(context.Background(), p("plain.qcow2"), "qcow2")
	if err != nil || info.Format != "qcow2" || info.VirtualSize != 1<<20 {
		t.Fatalf("qemu-img info of a root-only image granted for the run: %+v %v", info, err)
	}
}

// ConvertToFile writes an image's raw content into a root-only file the
// caller made, sparse where the image is empty, and leaves no ACL.
func TestToolConvertToFile(t *testing.T) {
	dir := harness.SearchableTempDir(t)
	p := func(n string) string { return filepath.Join(dir, n) }
	qemuImg(t, "create", "-q", "-f", "qcow2", p("img.qcow2"), "64M")
	qemuIO(t, p("img.qcow2"), "write -P 0x41 1M 64k")
	os.Chmod(p("img.qcow2"), 0o600)
	if err := os.WriteFile(p("out.raw"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (diskimage.Tool{UID: diskimage.CephToolUID}).ConvertToFile(context.Background(), p("img.qcow2"), "qcow2", p("out.raw")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p("out.raw"))
	if err != nil || len(data) != 64<<20 {
		t.Fatalf("raw copy of %d bytes (%v), want 64 MiB", len(data), err)
	}
	if data[1<<20] != 0x41 || data[1<<20+64<<10-1] != 0x41 || data[1<<20-1] != 0 || data[1<<20+64<<10] != 0 {
		t.Error("the raw copy does not hold the image's data where it was written")
	}
	var st unix.Stat_t
	if err := unix.Stat(p("out.raw"), &st); err != nil || st.Blocks*512 > 8<<20 {
		t.Errorf("the raw copy takes %d bytes on disk (%v): not sparse", st.Blocks*512, err)
	}
	for _, f := range []string{"img.qcow2", "out.raw"} {
		if _, err := unix.Getxattr(p(f), "system.posix_acl_access", make([]byte, 64)); !errors.Is(err, unix.ENODATA) {
			t.Errorf("%s: an ACL is left (%v)", f, err)
		}
	}
}
