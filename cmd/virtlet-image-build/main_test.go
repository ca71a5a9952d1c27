package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The layer holds the stage below /opt/virtlet/stage and the installer,
// with their modes and links, and depends on their content only: a second
// build of a copy made later gives the same bytes and the same digest.
func TestLayerIsTheStageAndDependsOnContentOnly(t *testing.T) {
	stage := func() string {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "usr/local/bin"), 0o755)
		os.WriteFile(filepath.Join(dir, "usr/local/bin/virtlet"), []byte("daemon"), 0o755)
		os.MkdirAll(filepath.Join(dir, "etc/virtlet"), 0o755)
		os.WriteFile(filepath.Join(dir, "etc/virtlet/virtlet.yaml"), []byte("listen: x\n"), 0o644)
		os.Symlink("virtlet", filepath.Join(dir, "usr/local/bin/link"))
		return dir
	}
	installer := filepath.Join(t.TempDir(), "virtlet-installer")
	os.WriteFile(installer, []byte("installer"), 0o755)
	a, err := layerTar(stage(), installer)
	if err != nil {
		t.Fatal(err)
	}
	b, err := layerTar(stage(), installer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same content differ")
	}
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = string(rune(h.Typeflag)) + " " + os.FileMode(h.Mode).String() + " " + string(data) + h.Linkname
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
	}
	for name, want := range map[string]string{
		"opt/virtlet/stage/usr/local/bin/virtlet":    "0 -rwxr-xr-x daemon",
		"opt/virtlet/stage/etc/virtlet/virtlet.yaml": "0 -rw-r--r-- listen: x\n",
		"opt/virtlet/stage/usr/local/bin/link":       "2 -rwxrwxrwx virtlet",
		"usr/bin/virtlet-installer":                  "0 -rwxr-xr-x installer",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	for name := range got {
		if !strings.HasPrefix(name, "opt/") && !strings.HasPrefix(name, "usr/") {
			t.Errorf("%s: outside /opt/virtlet and /usr/bin", name)
		}
	}
	// Written to an OCI layout, its digest is the same each time.
	dir := t.TempDir()
	d1, err := build(context.Background(), stage(), installer, "v1", "oci:"+dir+":v1", false)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := build(context.Background(), stage(), installer, "v1", "oci:"+dir+":v1-again", false)
	if err != nil || d1 != d2 {
		t.Errorf("digests %s and %s (%v), want one", d1, d2, err)
	}
}
