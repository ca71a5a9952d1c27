package imagesource

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containers/image/v5/docker"
	"github.com/containers/image/v5/docker/reference"
	"github.com/containers/image/v5/manifest"
	"github.com/containers/image/v5/oci/layout"
	"github.com/containers/image/v5/pkg/blobinfocache/none"
	"github.com/containers/image/v5/pkg/compression"
	"github.com/containers/image/v5/types"
	"github.com/opencontainers/go-digest"

	"github.com/virtlet/virtlet/adapters/checkpointarchive"
	"github.com/virtlet/virtlet/ports"
)

// registryDisk opens the VM disk inside a container image: a docker://
// reference (a registry) or an oci:<dir>[:<tag>] layout on the node. The
// disk is KubeVirt's containerDisk convention, a regular file
// disk/<name>.qcow2 or disk/<name>.img in a layer (the last layer holding
// one wins). The caller reads the returned stream once and closes it.
//
// Nothing the registry sends is trusted: the manifest must have the digest
// the name pins, a platform's manifest the digest its index gives, and the
// config and every layer read the digest and size their descriptors give,
// checked as they stream; the disk's stream ends in an error, not io.EOF,
// when its layer does not match (its rest is read first), so the image
// never enters the store. The returned digest is the manifest's the name
// resolved to (the list's, for a multi-platform image).
func (s *Source) registryDisk(ctx context.Context, req ports.FetchRequest, tc ports.TransportConfig) (io.ReadCloser, int64, string, error) {
	var ref types.ImageReference
	var err error
	switch {
	case strings.HasPrefix(req.Location, "docker://"):
		ref, err = docker.ParseReference(strings.TrimPrefix(req.Location, "docker:"))
	case strings.HasPrefix(req.Location, "oci:"):
		ref, err = layout.ParseReference(strings.TrimPrefix(req.Location, "oci:"))
	default:
		err = errors.New("not a registry location")
	}
	if err != nil {
		return nil, 0, "", &ports.InvalidError{Field: "image location", Value: req.Location, Reason: err.Error(),
			Allowed: "docker://<registry>/<repository>[:<tag>|@<digest>] or oci:<directory>[:<tag>]"}
	}
	sys, cleanup, err := systemContext(req, tc)
	if err != nil {
		return nil, 0, "", err
	}
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		cleanup()
		return nil, 0, "", registryError(req.Location, err)
	}
	fail := func(err error) (io.ReadCloser, int64, string, error) {
		src.Close()
		cleanup()
		return nil, 0, "", err
	}
	raw, mime, err := src.GetManifest(ctx, nil)
	if err != nil {
		return fail(registryError(req.Location, err))
	}
	resolved, err := manifest.Digest(raw)
	if err != nil {
		return fail(fmt.Errorf("%s: manifest digest: %w", req.Location, err))
	}
	if named := ref.DockerReference(); named != nil {
		if pinned, ok := named.(reference.Canonical); ok {
			if err := matchManifest(raw, pinned.Digest(), "the digest the name pins"); err != nil {
				return fail(fmt.Errorf("%s: %w", req.Location, err))
			}
		}
	}
	if manifest.MIMETypeIsMultiImage(mime) {
		list, err := manifest.ListFromBlob(raw, mime)
		if err != nil {
			return fail(fmt.Errorf("%s: manifest list: %w", req.Location, err))
		}
		instance, err := list.ChooseInstance(&types.SystemContext{ArchitectureChoice: "amd64", OSChoice: "linux"})
		if err != nil {
			return fail(fmt.Errorf("%s: no linux/amd64 image: %v: %w", req.Location, err, ports.ErrNotFound))
		}
		if raw, mime, err = src.GetManifest(ctx, &instance); err != nil {
			return fail(registryError(req.Location, err))
		}
		if err := matchManifest(raw, instance, "its entry in the image index"); err != nil {
			return fail(fmt.Errorf("%s: linux/amd64 %w", req.Location, err))
		}
	}
	m, err := manifest.FromBlob(raw, mime)
	if err != nil {
		return fail(fmt.Errorf("%s: manifest: %v: %w", req.Location, err, ports.ErrInvalidArgument))
	}
	if err := checkConfig(ctx, src, m.ConfigInfo()); err != nil {
		return fail(fmt.Errorf("%s: config %s: %w", req.Location, m.ConfigInfo().Digest, err))
	}
	layers := m.LayerInfos()
	// Every layer is read whole (to check it): none may be larger than
	// the node allows an image, and the descriptors bound what is read.
	for _, l := range layers {
		if req.MaxBytes > 0 && (l.Size < 0 || l.Size > req.MaxBytes) {
			return fail(fmt.Errorf("%s: layer %s is %d bytes, more than the %d the node allows an image (maxImageSize): %w",
				req.Location, l.Digest, l.Size, req.MaxBytes, ports.ErrInvalidArgument))
		}
	}
	if oci, ok := m.(*manifest.OCI1); ok && oci.Annotations[checkpointarchive.ImageAnnotation] != "" {
		// A checkpoint image: its one layer holds the checkpoint
		// archive's files, stored as the archive they were.
		if len(layers) != 1 {
			return fail(&ports.InvalidError{Field: "image", Value: req.Name,
				Reason:  fmt.Sprintf("%s is a checkpoint image (annotation %s) of %d layers", req.Location, checkpointarchive.ImageAnnotation, len(layers)),
				Allowed: "one layer, holding the checkpoint archive's files"})
		}
		rc, err := checkpointInLayer(ctx, src, layers[0].BlobInfo)
		if err != nil {
			return fail(fmt.Errorf("%s: layer %s: %w", req.Location, layers[0].Digest, err))
		}
		s.log.WithField("image", req.Name).Info("checkpoint image: its layer is stored as the checkpoint archive")
		return &closers{ReadCloser: rc, after: func() { src.Close(); cleanup() }}, -1, resolved.String(), nil
	}
	for i := len(layers) - 1; i >= 0; i-- {
		rc, size, name, err := diskInLayer(ctx, src, layers[i].BlobInfo)
		if err != nil {
			return fail(fmt.Errorf("%s: layer %s: %w", req.Location, layers[i].Digest, err))
		}
		if rc != nil {
			s.log.WithField("image", req.Name).WithField("file", name).Info("disk found in the image's layers")
			return &closers{ReadCloser: rc, after: func() { src.Close(); cleanup() }}, size, resolved.String(), nil
		}
	}
	return fail(&ports.InvalidError{Field: "image", Value: req.Name,
		Reason:  fmt.Sprintf("%s has no VM disk in its %d layer(s)", req.Location, len(layers)),
		Allowed: "a containerDisk image: a layer with disk/<name>.qcow2 or disk/<name>.img"})
}

// matchManifest fails unless raw has digest want (what named it).
func matchManifest(raw []byte, want digest.Digest, what string) error {
	ok, err := manifest.MatchesDigest(raw, want)
	if err != nil {
		return fmt.Errorf("manifest digest %s: %v: %w", want, err, ports.ErrInvalidArgument)
	}
	if !ok {
		got, _ := manifest.Digest(raw)
		return fmt.Errorf("the registry sent a manifest of digest %s, not %s, %s: %w", got, want, what, ports.ErrInvalidArgument)
	}
	return nil
}

// maxConfigSize bounds an image config read to check it.
const maxConfigSize = 4 << 20

// checkConfig reads the image's config blob and checks it against its
// descriptor. The config itself is not used.
func checkConfig(ctx context.Context, src types.ImageSource, blob types.BlobInfo) error {
	if blob.Digest == "" {
		return nil // a schema 1 manifest has no config blob
	}
	if blob.Size > maxConfigSize {
		return fmt.Errorf("%d bytes, more than the %d a config may have: %w", blob.Size, maxConfigSize, ports.ErrInvalidArgument)
	}
	v, err := openVerified(ctx, src, blob)
	if err != nil {
		return err
	}
	defer v.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(v, maxConfigSize+1)); err != nil {
		return err
	}
	return v.check()
}

// verifiedBlob reads a blob, hashing it, and checks it against its
// descriptor: a read past the descriptor's size fails, and so does its
// end when the length or the digest differ.
type verifiedBlob struct {
	rc       io.ReadCloser
	want     types.BlobInfo
	verifier digest.Verifier
	n        int64
	err      error // the first mismatch
	// closePlain closes the decompressor reading the blob (once): its
	// read-ahead must end before explain reads the blob itself.
	closePlain func()
}

func openVerified(ctx context.Context, src types.ImageSource, blob types.BlobInfo) (*verifiedBlob, error) {
	if err := blob.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("descriptor digest %q: %v: %w", blob.Digest, err, ports.ErrInvalidArgument)
	}
	rc, _, err := src.GetBlob(ctx, blob, none.NoCache)
	if err != nil {
		return nil, err
	}
	return &verifiedBlob{rc: rc, want: blob, verifier: blob.Digest.Verifier()}, nil
}

func (v *verifiedBlob) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.rc.Read(p)
	v.verifier.Write(p[:n])
	v.n += int64(n)
	if v.want.Size >= 0 && v.n > v.want.Size {
		v.err = fmt.Errorf("blob %s is longer than the %d bytes its descriptor gives: %w", v.want.Digest, v.want.Size, ports.ErrInvalidArgument)
		return n, v.err
	}
	if err == io.EOF {
		if cerr := v.check(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// check tells whether what was read so far is the whole blob, as its
// descriptor gives it.
func (v *verifiedBlob) check() error {
	switch {
	case v.err != nil:
	case v.want.Size >= 0 && v.n != v.want.Size:
		v.err = fmt.Errorf("blob %s is %d bytes, its descriptor gives %d: %w", v.want.Digest, v.n, v.want.Size, ports.ErrInvalidArgument)
	case !v.verifier.Verified():
		v.err = fmt.Errorf("blob %s: the registry sent data of another digest: %w", v.want.Digest, ports.ErrInvalidArgument)
	}
	return v.err
}

func (v *verifiedBlob) Close() error { return v.rc.Close() }

// explain returns, for an error met decompressing or unpacking the blob,
// the blob's mismatch with its descriptor if it has one (the rest of the
// raw blob is read to know): a changed or cut stream's first symptom may
// be the decompressor's. Otherwise err.
func (v *verifiedBlob) explain(err error) error {
	if v.closePlain != nil {
		v.closePlain()
	}
	io.Copy(io.Discard, v)
	if merr := v.check(); merr != nil {
		return merr
	}
	return err
}

// drain reads the rest of the blob, through the decompressed stream and
// then the raw one, and checks it.
func (v *verifiedBlob) drain(plain io.Reader) error {
	// Read, not WriteTo: pgzip's WriteTo panics once the stream has
	// ended.
	if _, err := io.Copy(io.Discard, struct{ io.Reader }{plain}); err != nil {
		return v.explain(err)
	}
	if _, err := io.Copy(io.Discard, v); err != nil {
		return err
	}
	return v.check()
}

// diskInLayer streams a layer (decompressing it, checking it against its
// descriptor) and stops at its disk file. A layer without one is read to
// its end and checked all the same.
func diskInLayer(ctx context.Context, src types.ImageSource, blob types.BlobInfo) (io.ReadCloser, int64, string, error) {
	v, err := openVerified(ctx, src, blob)
	if err != nil {
		return nil, 0, "", err
	}
	plain, _, err := compression.AutoDecompress(v)
	if err != nil {
		v.Close()
		return nil, 0, "", err
	}
	v.closePlain = sync.OnceFunc(func() { plain.Close() })
	tr := tar.NewReader(plain)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			err = v.drain(plain)
			v.closePlain()
			v.Close()
			return nil, 0, "", err
		}
		if err != nil {
			err = v.explain(fmt.Errorf("read layer: %w", err))
			v.Close()
			return nil, 0, "", err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if h.Typeflag == tar.TypeReg && path.Dir(name) == "disk" && (strings.HasSuffix(name, ".qcow2") || strings.HasSuffix(name, ".img")) {
			disk := &checkedEnd{r: tr, end: func() error { return v.drain(plain) }, explain: v.explain}
			return &closers{ReadCloser: io.NopCloser(disk), after: func() { v.closePlain(); v.Close() }}, h.Size, name, nil
		}
	}
}

// checkpointInLayer streams the checkpoint archive that the checkpoint
// image's layer holds (checkpointarchive.FromLayer), checking the layer
// against its descriptor as it goes: the stream ends in an error, not
// io.EOF, when the layer is not a checkpoint's or not what the
// descriptor gives.
func checkpointInLayer(ctx context.Context, src types.ImageSource, blob types.BlobInfo) (io.ReadCloser, error) {
	v, err := openVerified(ctx, src, blob)
	if err != nil {
		return nil, err
	}
	plain, _, err := compression.AutoDecompress(v)
	if err != nil {
		v.Close()
		return nil, err
	}
	v.closePlain = sync.OnceFunc(func() { plain.Close() })
	pr, pw := io.Pipe()
	done := make(chan struct{})
	var closed atomic.Bool // the reader left before the end
	go func() {
		defer close(done)
		err := checkpointarchive.FromLayer(plain, pw)
		switch {
		case closed.Load():
			// No one reads on: neither the rest of the blob is read
			// nor its mismatch looked for.
		case err != nil:
			err = v.explain(fmt.Errorf("%v: %w", err, ports.ErrInvalidArgument))
		default:
			err = v.drain(plain)
		}
		pw.CloseWithError(err)
	}()
	return &closers{ReadCloser: pr, after: func() {
		closed.Store(true)
		pr.CloseWithError(errors.New("closed"))
		// A read from the registry under way ends with its stream.
		v.rc.Close()
		<-done
		v.closePlain()
		v.Close()
	}}, nil
}

// checkedEnd is a stream whose end is io.EOF only once end() passes;
// its other errors go through explain.
type checkedEnd struct {
	r       io.Reader
	end     func() error
	explain func(error) error
}

func (c *checkedEnd) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	switch {
	case err == io.EOF:
		if eerr := c.end(); eerr != nil {
			return n, eerr
		}
	case err != nil:
		return n, c.explain(err)
	}
	return n, err
}

type closers struct {
	io.ReadCloser
	after func()
}

func (c *closers) Close() error {
	err := c.ReadCloser.Close()
	c.after()
	return err
}

// systemContext carries the pull secret and the transport's TLS settings.
func systemContext(req ports.FetchRequest, tc ports.TransportConfig) (*types.SystemContext, func(), error) {
	sys := &types.SystemContext{ArchitectureChoice: "amd64", OSChoice: "linux"}
	cleanup := func() {}
	if a := req.Auth; a != nil {
		user, pass := a.Username, a.Password
		if user == "" && a.Auth != "" {
			decoded, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, nil, fmt.Errorf("pull secret: auth is not base64: %w", ports.ErrInvalidArgument)
			}
			user, pass, _ = strings.Cut(string(decoded), ":")
		}
		if user != "" || a.IdentityToken != "" {
			sys.DockerAuthConfig = &types.DockerAuthConfig{Username: user, Password: pass, IdentityToken: a.IdentityToken}
		}
		sys.DockerBearerRegistryToken = a.RegistryToken
	}
	if t := tc.TLS; t != nil {
		if t.Insecure {
			sys.DockerInsecureSkipTLSVerify = types.OptionalBoolTrue
		}
		if len(t.Certificates) > 0 {
			dir, err := os.MkdirTemp("", "virtlet-registry-certs-")
			if err != nil {
				return nil, nil, err
			}
			cleanup = func() { os.RemoveAll(dir) }
			for i, c := range t.Certificates {
				name := fmt.Sprintf("ca-%d.crt", i)
				if c.Key != "" {
					name = fmt.Sprintf("client-%d.cert", i)
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("client-%d.key", i)), []byte(c.Key), 0o600); err != nil {
						cleanup()
						return nil, nil, err
					}
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(c.Cert), 0o600); err != nil {
					cleanup()
					return nil, nil, err
				}
			}
			sys.DockerCertPath = dir
		}
	}
	return sys, cleanup, nil
}

// registryError classifies what containers/image reports.
func registryError(location string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "manifest unknown"), strings.Contains(msg, "name unknown"),
		strings.Contains(msg, "no such file"), strings.Contains(msg, "not found"):
		return fmt.Errorf("%s: %v: %w", location, err, ports.ErrNotFound)
	case strings.Contains(msg, "unauthorized"), strings.Contains(msg, "authentication required"):
		return fmt.Errorf("%s: %v (is the pod's image pull secret right?): %w", location, err, ports.ErrFailedPrecondition)
	}
	return fmt.Errorf("%s: %w", location, err)
}
