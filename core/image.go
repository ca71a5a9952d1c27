package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/singleflight"

	"github.com/virtlet/virtlet/ports"
)

var (
	fullDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	hexPrefix  = regexp.MustCompile(`^(sha256:)?[0-9a-f]{3,64}$`)
)

// imageService pulls, lists and removes VM images. Its lock serialises
// the changes to the image index (a pull's, a removal's, a collection's).
type imageService struct {
	*shared
	mu    sync.Mutex
	pulls singleflight.Group // one download per image at a time
}

// PullImage downloads a VM image into the store and returns its ID.
// Concurrent pulls of one image download it once.
func (r *imageService) PullImage(ctx context.Context, name string, auth *ports.RegistryAuth) (string, error) {
	refused := func(class ports.PullFailure, err error) (string, error) {
		r.pulled(ports.ImagePull{Failure: pullFailure(err, class)})
		return "", err
	}
	n, err := ParseImageName(name)
	if err != nil {
		return refused(ports.PullInvalidName, err)
	}
	loc, err := r.resolveLocation(ctx, n)
	if err != nil {
		return refused(ports.PullInvalidName, err)
	}
	loc.URL = withReference(loc.URL, n)
	scheme, err := Scheme(loc.URL)
	if err != nil {
		return refused(ports.PullInvalidName, fmt.Errorf("image %s: %w", name, err))
	}
	src, ok := r.deps.ImageSources[scheme]
	if !ok {
		handled := strings.Join(slices.Sorted(maps.Keys(r.deps.ImageSources)), ", ")
		if handled == "" {
			handled = "none"
		}
		return refused(ports.PullNoPlugin, fmt.Errorf("image %s: no image plugin handles %s:// locations (installed image plugins handle: %s; add one to the plugin manifests): %w",
			name, scheme, handled, ports.ErrFailedPrecondition))
	}
	var id string
	err = r.detached(ctx, func(ctx context.Context) error {
		v, err, _ := r.pulls.Do(n.Key(), func() (interface{}, error) {
			start := time.Now()
			res, class, err := r.pull(ctx, n, loc, src, auth)
			p := ports.ImagePull{Scheme: scheme, Bytes: res.Size, Took: time.Since(start)}
			if err != nil {
				p.Bytes, p.Failure = 0, pullFailure(err, class)
			}
			r.pulled(p)
			return res.Digest, err
		})
		if err != nil {
			return err
		}
		id = v.(string)
		return nil
	})
	return id, err
}

// pull downloads, stores and indexes an image; a failure comes with the
// class of the step that failed (its error's kind may say more).
func (r *imageService) pull(ctx context.Context, n ImageName, loc location, src ports.ImageSource, auth *ports.RegistryAuth) (ports.FetchResult, ports.PullFailure, error) {
	location := loc.URL
	log := r.log.WithFields(logrus.Fields{"image": n.Raw, "location": redactURL(location), "translation": loc.Source})
	files := r.deps.ImageFiles
	tmp, err := files.NewTemp(ctx)
	if err != nil {
		return ports.FetchResult{}, ports.PullStore, fmt.Errorf("image %s: reserve download file: %w", n.Raw, err)
	}
	discard := func() {
		if err := files.Discard(ctx, tmp); err != nil {
			log.WithError(err).Warn("discard partial download")
		}
	}
	log.Info("pulling image")
	registry := isRegistry(location)
	expected := n.Digest
	if registry {
		expected = "" // the digest pins the manifest, which the source verifies and reports
	}
	res, err := src.Fetch(ctx, ports.FetchRequest{
		Name: n.Raw, Location: location, Transport: loc.Transport, TransportConfig: loc.TransportConfig,
		Auth: auth, Dest: tmp, ExpectedDigest: expected,
		MaxBytes: r.opts.MaxImageBytes, KeepFreeBytes: r.opts.KeepFreeBytes,
	})
	if err != nil {
		discard()
		class := ports.PullOther
		if errors.Is(err, ports.ErrInvalidArgument) {
			class = ports.PullInvalidImage // not a disk, not the pinned digest
		}
		return ports.FetchResult{}, class, fmt.Errorf("pull image %s from %s: %w", n.Raw, redactURL(location), err)
	}
	r.failpoint(FPPullFetched)
	if !fullDigest.MatchString(res.Digest) {
		discard()
		return ports.FetchResult{}, ports.PullOther, fmt.Errorf("pull image %s: image plugin returned a malformed digest %q: %w", n.Raw, res.Digest, ports.ErrUnavailable)
	}
	// The plugin bounds the download; this holds a plugin that does not to
	// the same limits.
	if max := r.opts.MaxImageBytes; max > 0 && res.Size > max {
		discard()
		return ports.FetchResult{}, ports.PullInvalidImage, fmt.Errorf("pull image %s: %d bytes, more than the %d the node allows an image (maxImageSize): %w",
			n.Raw, res.Size, max, ports.ErrInvalidArgument)
	}
	if max := r.opts.MaxVirtualBytes; max > 0 && res.VirtualSize > max {
		discard()
		return ports.FetchResult{}, ports.PullInvalidImage, fmt.Errorf("pull image %s: its disk's virtual size is %d bytes, more than the %d the node allows (maxVirtualSize): %w",
			n.Raw, res.VirtualSize, max, ports.ErrInvalidArgument)
	}
	if registry && n.Digest != "" && res.ManifestDigest != n.Digest {
		discard()
		return ports.FetchResult{}, ports.PullInvalidImage, fmt.Errorf("pull image %s: the image plugin reports manifest digest %q, not the %s the name pins: %w",
			n.Raw, res.ManifestDigest, n.Digest, ports.ErrInvalidArgument)
	}
	if expected != "" && res.Digest != expected {
		discard()
		return ports.FetchResult{}, ports.PullInvalidImage, fmt.Errorf("pull image %s: digest mismatch: downloaded data is %s: %w", n.Raw, res.Digest, ports.ErrInvalidArgument)
	}
	if _, err := files.Commit(ctx, tmp, res.Digest); err != nil {
		discard()
		return ports.FetchResult{}, ports.PullStore, fmt.Errorf("pull image %s: store data: %w", n.Raw, err)
	}
	r.failpoint(FPPullStored)
	if err := r.indexImage(ctx, n, res, redactURL(location), registry); err != nil {
		return ports.FetchResult{}, ports.PullStore, err
	}
	log.WithFields(logrus.Fields{"id": res.Digest, "size": res.Size}).Info("image pulled")
	return res, "", nil
}

// redactURL drops credentials and query strings from a location for logs
// and records.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// indexImage records that n now names the image res. A name moves from an
// older image to the new one; an older image left without names and unused
// is deleted.
func (r *imageService) indexImage(ctx context.Context, n ImageName, res ports.FetchResult, location string, registry bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var puts []*Image
	var orphans []string
	img := &Image{ID: res.Digest, Size: res.Size, Format: res.Format, VirtualSize: res.VirtualSize,
		Location: location, Registry: registry, PulledAt: r.opts.Now()}
	if old, ok := r.images.get(res.Digest); ok {
		img.Names = old.withoutName(n)
		img.ManifestDigests = maps.Clone(old.ManifestDigests)
	}
	if res.ManifestDigest != "" {
		if img.ManifestDigests == nil {
			img.ManifestDigests = map[string]string{}
		}
		img.ManifestDigests[n.Repository()] = res.ManifestDigest
	}
	for _, other := range r.images.list(func(i *Image) bool { return i.ID != res.Digest && i.HasName(n) }) {
		moved := *other
		moved.Names = other.withoutName(n)
		if len(moved.Names) == 0 && r.imageUser(other.ID) == nil {
			orphans = append(orphans, other.ID)
		} else {
			puts = append(puts, &moved)
		}
	}
	img.Names = append(img.Names, n.Normalized())
	sort.Strings(img.Names)
	puts = append(puts, img)
	if err := r.images.apply(ctx, puts, orphans); err != nil {
		return err
	}
	for _, id := range orphans {
		if err := r.deps.ImageFiles.Remove(ctx, id); err != nil {
			r.log.WithError(err).WithField("id", id).Warn("remove data of replaced image")
		}
	}
	return nil
}

// resolveImage finds a stored image by ID, unique ID prefix or name; nil
// when there is none.
func (r *imageService) resolveImage(spec string) (*Image, error) {
	if img, ok := r.images.get(spec); ok {
		return img, nil
	}
	if hexPrefix.MatchString(spec) {
		prefix := spec
		if !strings.HasPrefix(prefix, "sha256:") {
			prefix = "sha256:" + prefix
		}
		id, ok, err := r.images.resolve(prefix)
		if err != nil { // more than one image has the prefix
			return nil, fmt.Errorf("image ID prefix %q is ambiguous: %w", spec, ports.ErrInvalidArgument)
		}
		if img, found := r.images.get(id); ok && found {
			return img, nil
		}
	}
	n, err := ParseImageName(spec)
	if err != nil {
		return nil, err
	}
	return r.images.find(func(img *Image) bool { return img.HasName(n) || img.PinnedBy(n) }), nil
}

// ImageStatus returns a stored image; ErrNotFound if there is none.
func (r *imageService) ImageStatus(ctx context.Context, spec string) (Image, error) {
	img, err := r.resolveImage(spec)
	if err != nil {
		return Image{}, err
	}
	if img == nil {
		return Image{}, notFound("image", spec)
	}
	return *img, nil
}

// ListImages returns every stored image (or the one spec names), sorted by ID.
func (r *imageService) ListImages(ctx context.Context, spec string) ([]Image, error) {
	if spec != "" {
		img, err := r.resolveImage(spec)
		if err != nil || img == nil {
			return nil, err
		}
		return []Image{*img}, nil
	}
	all := r.images.list(nil)
	out := make([]Image, 0, len(all))
	for _, img := range all {
		out = append(out, *img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RemoveImage deletes an image and its data. It refuses while a VM's root
// disk is backed by the image. Removing an unknown image succeeds.
func (r *imageService) RemoveImage(ctx context.Context, spec string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	img, err := r.resolveImage(spec)
	if err != nil || img == nil {
		return err
	}
	user := r.imageUser(img.ID)
	if user != nil {
		return fmt.Errorf("image %s is in use by the VM of pod %s/%s (container %s): %w",
			spec, user.Spec.PodNamespace, user.Spec.PodName, short(user.ID), ports.ErrFailedPrecondition)
	}
	if err := r.images.delete(ctx, img.ID); err != nil {
		return err
	}
	r.failpoint(FPRemoveImageForgot)
	if err := r.deps.ImageFiles.Remove(ctx, img.ID); err != nil {
		return fmt.Errorf("remove data of image %s: %w", img.ID, err)
	}
	r.log.WithFields(logrus.Fields{"id": img.ID, "names": img.Names}).Info("image removed")
	return nil
}

// imageUser returns a container whose VM's root disk the image backs
// (nil: none).
func (r *imageService) imageUser(id string) *Container {
	return r.containers.find(func(c *Container) bool { return c.Image.ID == id || c.Image.Base == id })
}

// ImageFsInfo reports the space the image store uses.
func (r *imageService) ImageFsInfo(ctx context.Context) (ports.FilesystemUsage, error) {
	u, err := r.deps.ImageFiles.Usage(ctx)
	if err != nil {
		return ports.FilesystemUsage{}, fmt.Errorf("image store usage: %w", err)
	}
	return u, nil
}

// collectImageFiles removes stored image data that no image record and no
// VM refers to: what a crash between storing a download and recording it
// leaves.
func (r *imageService) collectImageFiles(ctx context.Context) error {
	digests, err := r.deps.ImageFiles.List(ctx)
	if err != nil {
		return fmt.Errorf("list image data: %w", err)
	}
	var garbage []string
	for _, d := range digests {
		if _, ok := r.images.get(d); !ok && r.imageUser(d) == nil {
			garbage = append(garbage, d)
		}
	}
	for _, d := range garbage {
		if err := r.deps.ImageFiles.Remove(ctx, d); err != nil {
			return fmt.Errorf("remove unreferenced image data %s: %w", d, err)
		}
		r.log.WithField("id", d).Info("removed image data no record refers to")
	}
	return nil
}

// collectNamelessImage deletes an image whose names all moved to newer
// content once its last VM is gone (it was kept only as that VM's base).
func (r *imageService) collectNamelessImage(ctx context.Context, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	img, ok := r.images.get(id)
	unused := ok && len(img.Names) == 0 && r.imageUser(id) == nil
	if !unused {
		return
	}
	if err := r.images.delete(ctx, id); err != nil {
		r.log.WithError(err).WithField("id", id).Warn("forget nameless image")
		return
	}
	if err := r.deps.ImageFiles.Remove(ctx, id); err != nil {
		r.log.WithError(err).WithField("id", id).Warn("remove data of nameless image")
		return
	}
	r.log.WithField("id", id).Info("removed an image whose names moved on, with its last VM")
}
