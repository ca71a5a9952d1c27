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

// A KVM device only its group may use is opened to every user for VMs in
// groups of their own; one they can already use is left alone.
func TestKVMUsableBy(t *testing.T) {
	log := logrus.New()
	for _, tc := range []struct {
		mode      os.FileMode
		sameGroup bool
		want      os.FileMode
	}{
		{0o660, false, 0o666},
		{0o660, true, 0o660},
		{0o666, false, 0o666},
		{0o600, true, 0o606},
	} {
		dev := filepath.Join(t.TempDir(), "kvm")
		if err := os.WriteFile(dev, nil, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dev, tc.mode); err != nil {
			t.Fatal(err)
		}
		gid := os.Getgid() + 1
		if tc.sameGroup {
			gid = os.Getgid()
		}
		if err := kvmUsableBy(log, dev, gid); err != nil {
			t.Fatal(err)
		}
		info, _ := os.Stat(dev)
		if got := info.Mode().Perm(); got != tc.want {
			t.Errorf("mode %o, same group %v: now %o, want %o", tc.mode, tc.sameGroup, got, tc.want)
		}
	}
	if err := kvmUsableBy(log, filepath.Join(t.TempDir(), "none"), 0); err == nil {
		t.Error("no KVM device: no error")
	}
}
