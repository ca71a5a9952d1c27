package core_test

import (
	"errors"
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
