// Package containerdisk makes containerDisk images (KubeVirt's convention:
// a VM disk at disk/<name> in an image layer) and runs a container registry
// on loopback, for tests of registry pulls.
package containerdisk

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containers/image/v5/pkg/blobinfocache/none"
	"github.com/containers/image/v5/types"
	digest "github.com/opencontainers/go-digest"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/virtlet/virtlet/adapters/checkpointarchive"
	"github.com/virtlet/virtlet/deploy/ociimage"
	"github.com/virtlet/virtlet/testing/testca"
	"golang.org/x/crypto/bcrypt"
)

// Files are what goes into the image's single layer: path → content.
type Files map[string][]byte

// DiskFiles is the layer of a containerDisk holding diskPath as
// disk/<name>.
func DiskFiles(diskPath, name string) (Files, error) {
	data, err := os.ReadFile(diskPath)
	if err != nil {
		return nil, err
	}
	return Files{"disk/" + name: data}, nil
}

// Push writes an image with one gzip layer of files to dest ("docker://…"
// or "oci:<dir>:<tag>"); insecure allows a plain-HTTP registry.
func Push(ctx context.Context, dest string, files Files, insecure bool) error {
	return PushAs(ctx, dest, files, &types.SystemContext{DockerInsecureSkipTLSVerify: optionalBool(insecure)})
}

func optionalBool(b bool) types.OptionalBool {
	if b {
		return types.OptionalBoolTrue
	}
	return types.OptionalBoolUndefined
}

// PushAs is Push with a full system context (credentials, CA directory).
func PushAs(ctx context.Context, dest string, files Files, sys *types.SystemContext) error {
	return pushLayer(ctx, dest, files, nil, sys)
}

// PushCheckpoint writes the checkpoint archive's files as a checkpoint
// image: one layer holding them, the manifest annotated with the
// container's name, as `buildah add` of the archive and `buildah commit`
// with the annotation make it for CRI-O.
func PushCheckpoint(ctx context.Context, dest, archive, container string, sys *types.SystemContext) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	files := Files{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue // directories come with their files
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
	}
	return pushLayer(ctx, dest, files, map[string]string{checkpointarchive.ImageAnnotation: container}, sys)
}

func pushLayer(ctx context.Context, dest string, files Files, annotations map[string]string, sys *types.SystemContext) error {
	var plain bytes.Buffer
	tw := tar.NewWriter(&plain)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Uid: 107, Gid: 107, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain.Bytes())
	zw.Close()
	config, _ := json.Marshal(imgspecv1.Image{
		Platform: imgspecv1.Platform{Architecture: "amd64", OS: "linux"},
		RootFS:   imgspecv1.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(plain.Bytes())}},
	})
	_, err := Write(ctx, dest, Image{Config: config, Layers: [][]byte{gz.Bytes()}, Annotations: annotations}, sys)
	return err
}

// Image is an image's config and its layers (gzip-compressed tars, lowest
// first), as Write stores it and Read returns it.
type Image = ociimage.Image

// Write stores img at dest ("docker://…" or "oci:<dir>:<name>") under an
// OCI manifest, and returns the manifest's digest.
func Write(ctx context.Context, dest string, img Image, sys *types.SystemContext) (digest.Digest, error) {
	return ociimage.Write(ctx, dest, img, sys)
}

// Read loads the image at src ("oci:<dir>:<name>" or "docker://…"),
// whose manifest must be an OCI manifest such as Write stores.
func Read(ctx context.Context, src string, sys *types.SystemContext) (Image, error) {
	ref, err := ociimage.Reference(src)
	if err != nil {
		return Image{}, err
	}
	s, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return Image{}, fmt.Errorf("%s: %w", src, err)
	}
	defer s.Close()
	data, mime, err := s.GetManifest(ctx, nil)
	if err != nil {
		return Image{}, fmt.Errorf("%s: manifest: %w", src, err)
	}
	if mime != imgspecv1.MediaTypeImageManifest {
		return Image{}, fmt.Errorf("%s: manifest of type %q, want %q", src, mime, imgspecv1.MediaTypeImageManifest)
	}
	var m imgspecv1.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Image{}, fmt.Errorf("%s: manifest: %w", src, err)
	}
	blob := func(desc imgspecv1.Descriptor) ([]byte, error) {
		r, _, err := s.GetBlob(ctx, types.BlobInfo{Digest: desc.Digest, Size: desc.Size}, none.NoCache)
		if err != nil {
			return nil, fmt.Errorf("%s: blob %s: %w", src, desc.Digest, err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			return nil, fmt.Errorf("%s: blob %s: %w", src, desc.Digest, err)
		}
		if digest.FromBytes(b) != desc.Digest {
			return nil, fmt.Errorf("%s: blob %s does not match its digest", src, desc.Digest)
		}
		return b, nil
	}
	var img Image
	if img.Config, err = blob(m.Config); err != nil {
		return Image{}, err
	}
	for _, l := range m.Layers {
		b, err := blob(l)
		if err != nil {
			return Image{}, err
		}
		img.Layers = append(img.Layers, b)
	}
	return img, nil
}

// Registry is Debian's docker-registry (distribution) serving on loopback.
type Registry struct {
	Addr   string // 127.0.0.1:port
	CAFile string // the test CA, when serving TLS
	cmd    *exec.Cmd
	dir    string
}

// RegistryOptions secure a registry: TLS with a test CA, and a user whose
// credentials every pull must present.
type RegistryOptions struct {
	TLS            bool
	User, Password string
}

// StartRegistry runs docker-registry with its storage in a fresh directory,
// listening on loopback only (its packaged config listens everywhere).
func StartRegistry(opts ...RegistryOptions) (*Registry, error) {
	var o RegistryOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	dir, err := os.MkdirTemp("", "virtlet-registry-")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf("version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\n",
		filepath.Join(dir, "data"))
	scheme := "http"
	if o.TLS {
		ca, err := testca.Write(dir)
		if err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("http: {addr: %q, tls: {certificate: %s, key: %s}}\n", addr, ca.Cert, ca.Key)
		scheme = "https"
	} else {
		cfg += fmt.Sprintf("http: {addr: %q}\n", addr)
	}
	if o.User != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(o.Password), bcrypt.DefaultCost)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(o.User+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("auth: {htpasswd: {realm: virtlet-test, path: %s}}\n", filepath.Join(dir, "htpasswd"))
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("docker-registry", "serve", filepath.Join(dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start docker-registry: %w", err)
	}
	r := &Registry{Addr: addr, cmd: cmd, dir: dir}
	if o.TLS {
		r.CAFile = filepath.Join(dir, "test-ca.pem")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := client.Get(scheme + "://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r, nil
			}
		}
	}
	r.Close()
	return nil, fmt.Errorf("docker-registry did not answer on %s", addr)
}

// Close stops the registry and removes its storage.
func (r *Registry) Close() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
	os.RemoveAll(r.dir)
}

// Sum returns the sha256 digest of data, as image IDs are written.
func Sum(data []byte) string {
	s := sha256.Sum256(data)
	return fmt.Sprintf("sha256:%x", s)
}
