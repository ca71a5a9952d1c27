package checkpointarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// layerOf rewrites an archive as an image layer made from its files
// would hold them: "./" first, names with "./", owners and modes of a
// build.
func layerOf(t *testing.T, archive string, extra ...tar.Header) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h.Name, h.Uid, h.Gid, h.Mode = "./"+h.Name, 1000, 1000, 0o644
		tw.WriteHeader(h)
		io.Copy(tw, tr)
	}
	for _, h := range extra {
		tw.WriteHeader(&h)
		tw.Write(make([]byte, h.Size))
	}
	tw.Close()
	return buf.Bytes()
}

func TestACheckpointImagesLayerIsStoredAsTheArchive(t *testing.T) {
	dir := t.TempDir()
	loc := filepath.Join(dir, "cp.tar")
	a := New(Options{Runtime: "virtlet", Version: "1", WorkDir: filepath.Join(dir, "restore"), Log: logrus.New()})
	if _, err := a.WriteCheckpoint(context.Background(), loc, meta, capture); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := FromLayer(bytes.NewReader(layerOf(t, loc)), &out); err != nil {
		t.Fatal(err)
	}
	stored := filepath.Join(dir, "stored.tar")
	if err := os.WriteFile(stored, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if !Recognise(stored) {
		t.Fatal("the stored layer is not recognised as a checkpoint archive")
	}
	m, cp, err := a.ReadCheckpoint(context.Background(), stored)
	if err != nil || m.PodName != "web-0" || m.VM.Name != meta.VM.Name || len(cp.Disks) != 1 {
		t.Fatalf("read %+v %+v %v", m, cp, err)
	}
	want, got := readTar(t, loc), readTar(t, stored)
	if len(got) != len(want) {
		t.Fatalf("stored %d members, the archive has %d", len(got), len(want))
	}
	for name, data := range want {
		if !bytes.Equal(got[name], data) {
			t.Errorf("%s differs", name)
		}
	}
}

// The layer comes from a registry: what a checkpoint does not hold is
// refused by name.
func TestHostileCheckpointLayersAreRefused(t *testing.T) {
	dir := t.TempDir()
	loc := filepath.Join(dir, "cp.tar")
	a := New(Options{Runtime: "virtlet", Version: "1", WorkDir: filepath.Join(dir, "restore"), Log: logrus.New()})
	if _, err := a.WriteCheckpoint(context.Background(), loc, meta, capture); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		layer []byte
		want  string
	}{
		{"a whiteout", layerOf(t, loc, tar.Header{Name: "./disks/.wh.root.qcow2", Typeflag: tar.TypeReg}), `"./disks/.wh.root.qcow2", which is not part`},
		{"a symlink", layerOf(t, loc, tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"}), `"etc", which is not part`},
		{"a file out of the layer", layerOf(t, loc, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}), `"../x", which is not part`},
		{"a member twice", layerOf(t, loc, tar.Header{Name: "config.dump", Typeflag: tar.TypeReg, Size: 3}), `"config.dump" twice`},
		{"a device as a disk", layerOf(t, loc, tar.Header{Name: "disks/data.raw", Typeflag: tar.TypeBlock}), "not a regular file"},
		{"no metadata", func() []byte {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			tw.WriteHeader(&tar.Header{Name: "config.dump", Typeflag: tar.TypeReg, Size: 2})
			tw.Write([]byte("{}"))
			tw.Close()
			return b.Bytes()
		}(), "has no checkpoint/virtlet.json"},
		{"not a tar", []byte(strings.Repeat("x", 1024)), "read the checkpoint image's layer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := FromLayer(bytes.NewReader(tc.layer), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
