package imagesource_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// A registry that lies is refused, naming what did not match: a manifest
// of another image for the digest the name pins, a platform's manifest
// that is not the one its index names, a layer with one byte changed, one
// byte longer or shorter than its descriptor. The same server, honest,
// serves the same pulls.
func TestLyingRegistryIsRefused(t *testing.T) {
	ctx := context.Background()
	reg, disk := registryWith(t, map[string]containerdisk.Files{"disks/other:v1": {"disk/other.img": raw()}})
	liar := containerdisk.NewLiar(reg.Addr)
	defer liar.Close()
	tiny, err := liar.Manifest("disks/tiny", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if liar.Swap, err = liar.Manifest("disks/other", "v1"); err != nil {
		t.Fatal(err)
	}
	var m struct {
		Layers []struct {
			Digest string
			Size   int64
		} `json:"layers"`
	}
	if err := json.Unmarshal(tiny, &m); err != nil || len(m.Layers) != 1 {
		t.Fatalf("tiny's manifest: %v %s", err, tiny)
	}
	layer, tinyDigest, otherDigest := m.Layers[0].Digest, containerdisk.Sum(tiny), containerdisk.Sum(liar.Swap)
	index, err := liar.Index("disks/tiny")
	if err != nil {
		t.Fatal(err)
	}
	pinned := func(lie string) string { return "docker://" + liar.Addr + "/" + lie + "/disks/tiny@" + tinyDigest }
	insecure, _ := json.Marshal(ports.TransportConfig{TLS: &ports.TransportTLS{Insecure: true}})
	s := imagesource.New(quiet())
	// A layer larger than the node allows an image is refused before it
	// is read.
	_, err = s.Fetch(ctx, ports.FetchRequest{Name: "virtlet.cloud/x", Location: pinned("honest"), TransportConfig: insecure,
		Dest: filepath.Join(harness.SearchableTempDir(t), "d"), MaxBytes: m.Layers[0].Size - 1})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "layer "+layer+" is ") || !strings.Contains(err.Error(), "(maxImageSize)") {
		t.Errorf("a layer above maxImageSize: %v", err)
	}
	for _, tc := range []struct {
		name, location string
		want           string // an error fragment, or "" for an honest pull
		manifest       string // the honest pull's repo digest
	}{
		{"honest by digest", pinned("honest"), "", tinyDigest},
		// The index's digest: what the tag resolved to.
		{"honest index", "docker://" + liar.Addr + "/honest/disks/tiny:multi", "", containerdisk.Sum(index)},
		{"another manifest for the pinned digest", pinned("swapped"),
			fmt.Sprintf("the registry sent a manifest of digest %s, not %s, the digest the name pins", otherDigest, tinyDigest), ""},
		{"another platform manifest than the index names", "docker://" + liar.Addr + "/swapped/disks/tiny:multi",
			fmt.Sprintf("linux/amd64 the registry sent a manifest of digest %s, not %s, its entry in the image index", otherDigest, tinyDigest), ""},
		{"a layer byte changed", pinned("flipped"), "blob " + layer + ": the registry sent data of another digest", ""},
		// The decompressor's error comes first; the mismatch is named.
		{"a layer byte changed mid-stream", pinned("garbled"), "blob " + layer + ": the registry sent data of another digest", ""},
		{"a layer one byte longer", pinned("longer"), "blob " + layer + " is longer than the", ""},
		{"a layer one byte shorter", pinned("shorter"), "blob " + layer + " is ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(harness.SearchableTempDir(t), "d")
			res, err := s.Fetch(ctx, ports.FetchRequest{Name: "virtlet.cloud/x", Location: tc.location, TransportConfig: insecure, Dest: dest})
			if tc.want == "" {
				if err != nil || res.Digest != containerdisk.Sum(disk) || res.ManifestDigest != tc.manifest {
					t.Fatalf("%+v %v, want the disk's digest %s and the manifest's %s", res, err, containerdisk.Sum(disk), tc.manifest)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("err %v, want an invalid-argument error containing %q", err, tc.want)
			}
		})
	}
}
