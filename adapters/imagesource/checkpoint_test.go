package imagesource_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/virtlet/virtlet/adapters/checkpointarchive"
	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// A checkpoint image (CRI-O's: one layer holding a checkpoint archive's
// files, the manifest annotated) is stored as the checkpoint archive, for
// CreateContainer to restore from; one that is not a VM checkpoint's is
// refused by name.
func TestCheckpointImagesAreStoredAsTheirArchive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	archive := filepath.Join(dir, "cp.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range []struct{ name, data string }{
		{"config.dump", `{"id":"x"}`}, {"checkpoint/virtlet.json", `{"formatVersion":1}`}, {"checkpoint/memory.save", "LibvirtQemudSave"},
	} {
		tw.WriteHeader(&tar.Header{Name: m.name, Typeflag: tar.TypeReg, Size: int64(len(m.data)), Mode: 0o600})
		tw.Write([]byte(m.data))
	}
	tw.Close()
	if err := os.WriteFile(archive, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	layout := t.TempDir()
	if err := containerdisk.PushCheckpoint(ctx, "oci:"+layout+":good", archive, "vm", nil); err != nil {
		t.Fatal(err)
	}
	// Two layers, and a layer with a whiteout.
	layer := func(files map[string]string) []byte {
		var plain, gz bytes.Buffer
		tw := tar.NewWriter(&plain)
		for name, data := range files {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: int64(len(data)), Mode: 0o644})
			tw.Write([]byte(data))
		}
		tw.Close()
		zw := gzip.NewWriter(&gz)
		zw.Write(plain.Bytes())
		zw.Close()
		return gz.Bytes()
	}
	config, _ := json.Marshal(imgspecv1.Image{Platform: imgspecv1.Platform{Architecture: "amd64", OS: "linux"},
		RootFS: imgspecv1.RootFS{Type: "layers", DiffIDs: []digest.Digest{}}})
	annotated := map[string]string{checkpointarchive.ImageAnnotation: "vm"}
	good := layer(map[string]string{"checkpoint/virtlet.json": "{}"})
	for tag, img := range map[string]containerdisk.Image{
		"two-layers": {Config: config, Layers: [][]byte{good, good}, Annotations: annotated},
		"whiteout":   {Config: config, Layers: [][]byte{layer(map[string]string{"checkpoint/virtlet.json": "{}", "disks/.wh.root.qcow2": ""})}, Annotations: annotated},
	} {
		if _, err := containerdisk.Write(ctx, "oci:"+layout+":"+tag, img, nil); err != nil {
			t.Fatal(err)
		}
	}
	s := imagesource.New(quiet())
	for _, tc := range []struct {
		name, tag, want string
	}{
		{"a checkpoint image", "good", ""},
		{"of two layers", "two-layers", "is a checkpoint image (annotation io.kubernetes.cri-o.annotations.checkpoint.name) of 2 layers"},
		{"with a whiteout", "whiteout", `holds "disks/.wh.root.qcow2", which is not part of a VM checkpoint`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(harness.SearchableTempDir(t), "d")
			res, err := s.Fetch(ctx, ports.FetchRequest{Name: "virtlet.cloud/x", Location: "oci:" + layout + ":" + tc.tag, Dest: dest})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ports.ErrInvalidArgument) {
					t.Fatalf("err %v, want an invalid argument containing %q", err, tc.want)
				}
				return
			}
			if err != nil || res.Format != ports.ImageFormatCheckpoint || res.ManifestDigest == "" {
				t.Fatalf("%+v %v, want a checkpoint", res, err)
			}
			if !checkpointarchive.Recognise(dest) {
				t.Fatal("the stored image is not a checkpoint archive")
			}
			f, err := os.Open(dest)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := map[string]string{}
			tr := tar.NewReader(f)
			for h, err := tr.Next(); err == nil; h, err = tr.Next() {
				data, _ := io.ReadAll(tr)
				got[h.Name] = string(data)
			}
			if len(got) != 3 || got["checkpoint/memory.save"] != "LibvirtQemudSave" || got["config.dump"] != `{"id":"x"}` {
				t.Fatalf("stored %q, want the archive's three files", got)
			}
		})
	}
}
