// Package ociimage writes an OCI image (a config and gzip layers) to an
// OCI layout or a registry through containers/image: what make image
// builds the node installer's image with (cmd/virtlet-image-build), and
// what the tests build theirs with (testing/containerdisk).
package ociimage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containers/image/v5/docker"
	"github.com/containers/image/v5/oci/layout"
	"github.com/containers/image/v5/pkg/blobinfocache/none"
	"github.com/containers/image/v5/types"
	digest "github.com/opencontainers/go-digest"
	imgspec "github.com/opencontainers/image-spec/specs-go"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image is an image's config and its layers (gzip-compressed tars, lowest
// first), as Write stores it and Read returns it.
type Image struct {
	Config      []byte
	Layers      [][]byte
	Annotations map[string]string // the manifest's
}

// Manifest is img's OCI manifest.
func (img Image) Manifest() []byte {
	m := imgspecv1.Manifest{
		Versioned: imgspec.Versioned{SchemaVersion: 2}, MediaType: imgspecv1.MediaTypeImageManifest,
		Config: imgspecv1.Descriptor{MediaType: imgspecv1.MediaTypeImageConfig, Digest: digest.FromBytes(img.Config), Size: int64(len(img.Config))},
		Layers: []imgspecv1.Descriptor{}, Annotations: img.Annotations,
	}
	for _, l := range img.Layers {
		m.Layers = append(m.Layers, imgspecv1.Descriptor{MediaType: imgspecv1.MediaTypeImageLayerGzip, Digest: digest.FromBytes(l), Size: int64(len(l))})
	}
	data, _ := json.Marshal(m)
	return data
}

// Reference parses "docker://…" or "oci:<dir>:<name>".
func Reference(name string) (types.ImageReference, error) {
	switch {
	case strings.HasPrefix(name, "docker://"):
		return docker.ParseReference(strings.TrimPrefix(name, "docker:"))
	case strings.HasPrefix(name, "oci:"):
		return layout.ParseReference(strings.TrimPrefix(name, "oci:"))
	}
	return nil, fmt.Errorf("unknown image location %q (want docker://… or oci:…)", name)
}

// Write stores img at dest ("docker://…" or "oci:<dir>:<name>") under an
// OCI manifest, and returns the manifest's digest.
func Write(ctx context.Context, dest string, img Image, sys *types.SystemContext) (digest.Digest, error) {
	ref, err := Reference(dest)
	if err != nil {
		return "", err
	}
	d, err := ref.NewImageDestination(ctx, sys)
	if err != nil {
		return "", fmt.Errorf("%s: %w", dest, err)
	}
	defer d.Close()
	for i, l := range img.Layers {
		if _, err := d.PutBlob(ctx, bytes.NewReader(l), types.BlobInfo{Digest: digest.FromBytes(l), Size: int64(len(l))}, none.NoCache, false); err != nil {
			return "", fmt.Errorf("%s: push layer %d: %w", dest, i, err)
		}
	}
	if _, err := d.PutBlob(ctx, bytes.NewReader(img.Config), types.BlobInfo{Digest: digest.FromBytes(img.Config), Size: int64(len(img.Config))}, none.NoCache, true); err != nil {
		return "", fmt.Errorf("%s: push config: %w", dest, err)
	}
	man := img.Manifest()
	if err := d.PutManifest(ctx, man, nil); err != nil {
		return "", fmt.Errorf("%s: push manifest: %w", dest, err)
	}
	if err := d.Commit(ctx, nil); err != nil {
		return "", fmt.Errorf("%s: commit: %w", dest, err)
	}
	return digest.FromBytes(man), nil
}
