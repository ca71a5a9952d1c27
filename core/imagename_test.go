package core_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// Image names become paths: of the default https location, of a
// translation's file:// or registry location ($1), of the image store's
// index. A name that would climb out of its place, or hide a NUL, is
// refused where it is parsed.
func TestImageNamesCannotEscape(t *testing.T) {
	for _, name := range []string{
		"virtlet.cloud/../etc/passwd",
		"virtlet.cloud/example.com/../etc/passwd",
		"virtlet.cloud/example.com/a/../../b",
		"virtlet.cloud/example.com/..",
		"virtlet.cloud/example.com/./x",
		"virtlet.cloud//etc/passwd",
		"virtlet.cloud/example.com//etc/passwd",
		"virtlet.cloud/example.com/x\x00.qcow2",
		"virtlet.cloud/example.com/%2e%2e/etc",
		"virtlet.cloud/example.com/a\\..\\b",
		"virtlet.cloud/example.com/x:../../y",
		"virtlet.cloud/",
	} {
		if n, err := core.ParseImageName(name); !errors.Is(err, ports.ErrInvalidArgument) {
			t.Errorf("%q parsed as %+v (%v)", name, n, err)
		}
	}
	// What is accepted stays below its host in the default location.
	for _, name := range []string{"virtlet.cloud/example.com/a.b/c..d/e_f-g.qcow2:v1", "virtlet.cloud/example.com/x...y"} {
		n, err := core.ParseImageName(name)
		if err != nil {
			continue
		}
		for _, seg := range strings.Split(n.Location(), "/") {
			if seg == ".." || seg == "." {
				t.Errorf("%q: location %s", name, n.Location())
			}
		}
	}
}

// FuzzParseImageName: a VM image name is accepted or refused as an
// invalid image; an accepted name has a clean path, downloads from the
// https URL of that path, and its normalized form names the same image
// (same key, path and digest) and normalizes to itself.
func FuzzParseImageName(f *testing.F) {
	for _, s := range []string{
		"virtlet.cloud/example.com/tiny.qcow2",
		"virtlet.cloud/cirros",
		"virtlet.cloud/ubuntu/18.04:latest",
		"virtlet.cloud/disks/tiny:v1",
		"virtlet.cloud/disks/tiny@sha256:" + strings.Repeat("ab", 32),
		"virtlet.cloud/disks/tiny:v2@sha256:" + strings.Repeat("0f", 32),
		"virtlet.cloud/x@sha512:" + strings.Repeat("ab", 64),
		"virtlet.cloud/",
		"virtlet.cloud/Upper",
		"docker.io/library/busybox:latest",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := core.ParseImageName(s)
		if core.IsVMImageName(s) != strings.HasPrefix(s, core.ImagePrefix) {
			t.Fatalf("IsVMImageName(%q) = %v", s, core.IsVMImageName(s))
		}
		if err != nil {
			var ie *ports.InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ports.ErrInvalidArgument) || ie.Field != "image" || ie.Value != s {
				t.Fatalf("error of the wrong kind: %T %v", err, err)
			}
			return
		}
		if !core.IsVMImageName(s) || n.Raw != s || n.Repository() != core.ImagePrefix+n.Path {
			t.Fatalf("%q parsed as %+v", s, n)
		}
		for _, seg := range strings.Split(n.Path, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("%q: path %q has the segment %q", s, n.Path, seg)
			}
		}
		if n.Digest != "" && (!strings.HasPrefix(n.Digest, "sha256:") || len(n.Digest) != len("sha256:")+64) {
			t.Fatalf("%q: digest %q", s, n.Digest)
		}
		u, err := url.Parse(n.Location())
		if err != nil || u.Scheme != "https" || u.Host+u.Path != n.Path || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			t.Fatalf("%q: location %q is not https://<path>: %+v %v", s, n.Location(), u, err)
		}
		norm := n.Normalized()
		p, err := core.ParseImageName(norm)
		if err != nil {
			t.Fatalf("%q: its normalized form %q is refused: %v", s, norm, err)
		}
		if p.Key() != n.Key() || p.Path != n.Path || p.Digest != n.Digest || p.Normalized() != norm {
			t.Fatalf("%q (%+v) normalizes to %q (%+v), another image", s, n, norm, p)
		}
		if n.Tag == "" && n.Digest == "" && (norm != n.Repository()+":latest" || n.Key() != n.Repository()) {
			t.Fatalf("%q: normalized %q key %q", s, norm, n.Key())
		}
	})
}
