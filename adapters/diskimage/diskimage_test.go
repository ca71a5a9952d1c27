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

// qemuIO runs a qemu-io command on a qcow2 image.
func qemuIO(t *testing.T, image, command string) {
	t.Helper()
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", command, image).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io %s: %v\n%s", command, err, out)
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

// patched writes a copy of the image src with bytes changed at offsets.
func patched(t *testing.T, src, dst string, at map[int][]byte) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for off, b := range at {
		copy(data[off:], b)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// An image whose data QEMU would read from a host file the image's author
// names (here a stand-in for /etc/kubernetes/pki/ca.key), or that needs
// anything of QEMU's this package has not vouched for, is refused; the
// features that change nothing of that are accepted.
func TestInspectRefusesImagesThatNameHostFiles(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	secret := p("ca.key")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+secret+",data_file_raw=on", p("datafile.qcow2"), "1M")
	// qemu-img made the data file; the secret is there before the image
	// is read, as on a node.
	if err := os.WriteFile(secret, []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600); err != nil || os.Chmod(secret, 0o600) != nil {
		t.Fatal(err)
	}
	// The threat is real: QEMU reads the host file as the guest's disk.
	out, err := exec.Command("qemu-io", "-r", "-f", "qcow2", "-c", "read -v 0 16", p("datafile.qcow2")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "42 45 47 49 4e") { // "BEGIN" in qemu-io's hex
		t.Fatalf("qemu-io did not read the data file through the image (the test's premise): %v\n%s", err, out)
	}
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", secret, p("backing.qcow2"), "1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", p("plain.qcow2"), "1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "extended_l2=on,compression_type=zstd", p("zstd.qcow2"), "1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", p("bitmap.qcow2"), "1M")
	qemuImg(t, "bitmap", "--add", p("bitmap.qcow2"), "b0")

	// Byte 79: the low byte of the incompatible features; 95: of the
	// autoclear ones; 112: the first header extension's type (a v3 header
	// of 112 bytes); 8..15: the backing file's offset.
	patched(t, p("datafile.qcow2"), p("autoclear-only.qcow2"), map[int][]byte{79: {0}})
	patched(t, p("datafile.qcow2"), p("extension-only.qcow2"), map[int][]byte{79: {0}, 95: {0}})
	patched(t, p("plain.qcow2"), p("dirty.qcow2"), map[int][]byte{79: {1}})
	// Byte 35: the low byte of the encryption method (a LUKS image takes
	// qemu-img seconds to make).
	patched(t, p("plain.qcow2"), p("aes.qcow2"), map[int][]byte{35: {1}})
	patched(t, p("plain.qcow2"), p("unknown-feature.qcow2"), map[int][]byte{79: {0x20}})
	patched(t, p("plain.qcow2"), p("unknown-extension.qcow2"), map[int][]byte{112: {0x12, 0x34, 0x56, 0x78}})
	patched(t, p("backing.qcow2"), p("backing-format-only.qcow2"), map[int][]byte{8: make([]byte, 8)})
	patched(t, p("plain.qcow2"), p("extensions-past-cluster.qcow2"), map[int][]byte{116: {0, 1, 0, 0}})

	for _, tt := range []struct{ file, reason string }{
		{"plain.qcow2", ""},
		{"zstd.qcow2", ""},
		{"bitmap.qcow2", ""},
		{"datafile.qcow2", "keeps its data in an external data file"},
		{"autoclear-only.qcow2", "its data is raw in an external data file"},
		{"extension-only.qcow2", "names an external data file"},
		{"backing.qcow2", "names a backing file"},
		{"backing-format-only.qcow2", "names a backing file's format"},
		{"aes.qcow2", "encrypted (method 1)"},
		{"dirty.qcow2", "marked dirty"},
		{"unknown-feature.qcow2", "incompatible features 0x20 that are not allowed"},
		{"unknown-extension.qcow2", "header extension of type 0x12345678"},
		{"extensions-past-cluster.qcow2", "run past the first cluster"},
	} {
		info, err := diskimage.Inspect(p(tt.file))
		switch {
		case tt.reason == "" && (err != nil || info.Format != "qcow2" || info.VirtualSize != 1<<20):
			t.Errorf("%s: %+v %v, want accepted", tt.file, info, err)
		case tt.reason != "" && (!errors.Is(err, diskimage.ErrNotADisk) || !strings.Contains(err.Error(), tt.reason)):
			t.Errorf("%s: %v, want refusal containing %q", tt.file, err, tt.reason)
		}
	}
}

// A checkpoint's root disk copy names a backing file, which is replaced
// without being opened; nothing else an image could name is allowed.
func TestInspectOverlay(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	secret := p("ca.key")
	os.WriteFile(secret, []byte("secret"), 0o600)
	qemuImg(t, "create", "-q", "-f", "qcow2", p("base.qcow2"), "1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", p("base.qcow2"), p("overlay.qcow2"))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", secret, p("overlay-of-a-secret.qcow2"), "1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+p("data"), "-F", "qcow2", "-b", p("base.qcow2"), p("overlay-datafile.qcow2"))
	raw := make([]byte, 1<<20)
	raw[510], raw[511] = 0x55, 0xaa
	os.WriteFile(p("disk.raw"), raw, 0o644)
	for _, tt := range []struct{ file, reason string }{
		{"overlay.qcow2", ""},
		{"base.qcow2", ""},
		// Its backing name is replaced before any tool opens it.
		{"overlay-of-a-secret.qcow2", ""},
		{"overlay-datafile.qcow2", "external data file"},
		{"disk.raw", "not a qcow2 overlay"},
	} {
		info, err := diskimage.InspectOverlay(p(tt.file))
		switch {
		case tt.reason == "" && (err != nil || info.Format != diskimage.QCOW2):
			t.Errorf("%s: %+v %v", tt.file, info, err)
		case tt.reason != "" && (err == nil || !errors.Is(err, diskimage.ErrNotADisk) || !strings.Contains(err.Error(), tt.reason)):
			t.Errorf("%s: %v, want %q", tt.file, err, tt.reason)
		}
	}
}
