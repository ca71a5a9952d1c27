package libvirt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestSearchableForVMUsers(t *testing.T) {
	state := filepath.Join(t.TempDir(), "qemu")
	target := filepath.Join(state, "channel", "target")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(state, "domain-1-vm")
	if err := os.Mkdir(private, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{state, filepath.Join(state, "channel"), target, private} {
		if err := os.Chmod(d, 0o750); err != nil { // whatever the umask
			t.Fatal(err)
		}
	}
	log := logrus.New()
	for i := 0; i < 2; i++ { // and again: nothing more to do
		if err := searchableForVMUsers(log, state); err != nil {
			t.Fatal(err)
		}
		for d, want := range map[string]os.FileMode{state: 0o751, filepath.Join(state, "channel"): 0o751, target: 0o751, private: 0o750} {
			info, err := os.Stat(d)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Mode().Perm(); got != want {
				t.Errorf("%s: mode %o, want %o", d, got, want)
			}
		}
	}
	if err := searchableForVMUsers(log, filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing state directory: no error")
	}
}
