package images

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

	"github.com/containers/image/v5/docker"
	"github.com/containers/image/v5/manifest"
	"github.com/containers/image/v5/oci/layout"
	"github.com/containers/image/v5/pkg/blobinfocache/none"
	"github.com/containers/image/v5/pkg/compression"
	"github.com/containers/image/v5/types"

	"github.com/virtlet/virtlet/ports"
)

// registryDisk opens the VM disk inside a container image: a docker://
// reference (a registry) or an oci:<dir>[:<tag>] layout on the node. The
// disk is KubeVirt's containerDisk convention, a regular file
// disk/<name>.qcow2 or disk/<name>.img in a layer (the last layer holding
// one wins). The caller reads the returned stream once and closes it.
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
	}
	m, err := manifest.FromBlob(raw, mime)
	if err != nil {
		return fail(fmt.Errorf("%s: manifest: %v: %w", req.Location, err, ports.ErrInvalidArgument))
	}
	layers := m.LayerInfos()
	for i := len(layers) - 1; i >= 0; i-- {
		rc, size, name, err := diskInLayer(ctx, src, layers[i].BlobInfo)
		if err != nil {
			return fail(fmt.Errorf("%s: layer %s: %w", req.Location, layers[i].Digest, err))
		}
		if rc != nil {
			s.log.WithField("image", req.Name).WithField("file", name).Info("disk found in the image's layers")
			return &closers{ReadCloser: rc, after: func() { src.Close(); cleanup() }}, size, name, nil
		}
	}
	return fail(&ports.InvalidError{Field: "image", Value: req.Name,
		Reason:  fmt.Sprintf("%s has no VM disk in its %d layer(s)", req.Location, len(layers)),
		Allowed: "a containerDisk image: a layer with disk/<name>.qcow2 or disk/<name>.img"})
}

// diskInLayer streams a layer (decompressing it) and stops at its disk file.
func diskInLayer(ctx context.Context, src types.ImageSource, blob types.BlobInfo) (io.ReadCloser, int64, string, error) {
	rc, _, err := src.GetBlob(ctx, blob, none.NoCache)
	if err != nil {
		return nil, 0, "", err
	}
	plain, _, err := compression.AutoDecompress(rc)
	if err != nil {
		rc.Close()
		return nil, 0, "", err
	}
	tr := tar.NewReader(plain)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			plain.Close()
			rc.Close()
			return nil, 0, "", nil
		}
		if err != nil {
			plain.Close()
			rc.Close()
			return nil, 0, "", fmt.Errorf("read layer: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if h.Typeflag == tar.TypeReg && path.Dir(name) == "disk" && (strings.HasSuffix(name, ".qcow2") || strings.HasSuffix(name, ".img")) {
			return &closers{ReadCloser: io.NopCloser(tr), after: func() { plain.Close(); rc.Close() }}, h.Size, name, nil
		}
	}
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
