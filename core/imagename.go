package core

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"

	"github.com/virtlet/virtlet/ports"
)

// ImagePrefix starts the name of every VM image.
const ImagePrefix = "virtlet.cloud/"

// IsVMImageName tells whether s names a VM image (it starts with
// virtlet.cloud/), valid or not; other names are container images.
func IsVMImageName(s string) bool { return strings.HasPrefix(s, ImagePrefix) }

// ImageName is a parsed VM image name, virtlet.cloud/<path>[:tag][@digest].
type ImageName struct {
	Raw    string // as given
	Path   string // after the prefix, without tag and digest
	Tag    string // ignored for URL images, kept for display
	Digest string // "sha256:<hex>" when the name pins one
}

// ParseImageName checks that s is a valid docker reference naming a VM image.
func ParseImageName(s string) (ImageName, error) {
	if !strings.HasPrefix(s, ImagePrefix) {
		return ImageName{}, &ports.InvalidError{Field: "image", Value: s,
			Reason: "not a VM image", Allowed: "a name starting with " + ImagePrefix + " (VM pods boot VM disk images, not container images)"}
	}
	ref, err := reference.Parse(s)
	if err != nil {
		return ImageName{}, &ports.InvalidError{Field: "image", Value: s, Reason: err.Error(),
			Allowed: ImagePrefix + "<host>/<path>[:tag][@sha256:<digest>] with lowercase path components"}
	}
	named, ok := ref.(reference.Named)
	if !ok {
		return ImageName{}, &ports.InvalidError{Field: "image", Value: s, Reason: "no repository name", Allowed: ImagePrefix + "<host>/<path>"}
	}
	n := ImageName{Raw: s, Path: strings.TrimPrefix(named.Name(), ImagePrefix)}
	if n.Path == "" || n.Path == named.Name() {
		return ImageName{}, &ports.InvalidError{Field: "image", Value: s, Reason: "empty image path", Allowed: ImagePrefix + "<host>/<path>"}
	}
	if t, ok := ref.(reference.Tagged); ok {
		n.Tag = t.Tag()
	}
	if d, ok := ref.(reference.Digested); ok {
		n.Digest = d.Digest().String()
		if d.Digest().Algorithm() != "sha256" {
			return ImageName{}, &ports.InvalidError{Field: "image", Value: s, Reason: "unsupported digest algorithm", Allowed: "@sha256:<64 hex digits>"}
		}
	}
	return n, nil
}

// Repository is the name without tag and digest.
func (n ImageName) Repository() string { return ImagePrefix + n.Path }

// Key identifies the image a name refers to: tags are ignored for URL
// images (Virtlet's rule), so virtlet.cloud/x and virtlet.cloud/x:latest are
// one image; a digest-pinned name is keyed by its digest.
func (n ImageName) Key() string {
	if n.Digest != "" {
		return n.Repository() + "@" + n.Digest
	}
	return n.Repository()
}

// Normalized is the name as listed in RepoTags: with ":latest" when it had
// neither tag nor digest, like every other container runtime shows it.
func (n ImageName) Normalized() string {
	switch {
	case n.Digest != "":
		return n.Repository() + "@" + n.Digest
	case n.Tag != "":
		return n.Repository() + ":" + n.Tag
	default:
		return n.Repository() + ":latest"
	}
}

// Location is where the image is downloaded from by default: the path
// after the prefix, as an https URL (docs/vm-pods.md).
func (n ImageName) Location() string { return "https://" + n.Path }

// Scheme returns the URL scheme (the image source transport) of a location.
func Scheme(location string) (string, error) {
	i := strings.Index(location, ":")
	if i <= 0 {
		return "", fmt.Errorf("location %q has no scheme", location)
	}
	return location[:i], nil
}
