package diskimage_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/diskimage"
)

// qemuImg makes images with the real qemu-img.
func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	qemuImg(t, "create", "-q", "-f", "qcow2", p("v3.qcow2"), "64M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "compat=0.10", p("v2.qcow2"), "1G")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", p("v3.qcow2"), p("overlay.qcow2"))
	raw := make([]byte, 1<<20)
	raw[510], raw[511] = 0x55, 0xaa
	os.WriteFile(p("disk.raw"), raw, 0o644)
	os.WriteFile(p("page.html"), []byte("<html><body>404 Not Found</body></html>"), 0o644)
	os.WriteFile(p("empty"), nil, 0o644)
	os.WriteFile(p("zeros"), make([]byte, 4096), 0o644)
	head, _ := os.ReadFile(p("v3.qcow2"))
	bad := append([]byte(nil), head...)
	bad[7] = 9 // version 9
	os.WriteFile(p("badversion.qcow2"), bad, 0o644)
	os.WriteFile(p("truncated.qcow2"), head[:40], 0o644)

	for _, tt := range []struct {
		file   string
		format string
		size   int64
		reason string
	}{
		{"v3.qcow2", "qcow2", 64 << 20, ""},
		{"v2.qcow2", "qcow2", 1 << 30, ""},
		{"disk.raw", "raw", 1 << 20, ""},
		{"overlay.qcow2", "", 0, "names a backing file"},
		{"page.html", "", 0, "neither a qcow2 header nor a partition table"},
		{"empty", "", 0, "empty"},
		{"zeros", "", 0, "neither a qcow2 header"},
		{"badversion.qcow2", "", 0, "qcow2 version 9"},
		{"truncated.qcow2", "", 0, "truncated"},
	} {
		info, err := diskimage.Inspect(p(tt.file))
		if tt.reason == "" {
			if err != nil || info.Format != tt.format || info.VirtualSize != tt.size {
				t.Errorf("%s: %+v %v", tt.file, info, err)
			}
			continue
		}
		if !errors.Is(err, diskimage.ErrNotADisk) || !strings.Contains(err.Error(), tt.reason) {
			t.Errorf("%s: %v, want refusal containing %q", tt.file, err, tt.reason)
		}
	}
}
