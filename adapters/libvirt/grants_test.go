package libvirt

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/adapters/posixacl"
)

// syncPath leaves exactly the wanted VM users' entries, and never touches
// an entry that is not its to revoke: a disk tool's run in another plugin,
// a user of the node's own, another plugin instance's VM user.
func TestSyncPath(t *testing.T) {
	f := filepath.Join(t.TempDir(), "image")
	os.WriteFile(f, []byte("x"), 0o600)
	for uid, perm := range map[uint32]uint16{
		2000000001:                    posixacl.Read, // a VM gone
		2000000002:                    posixacl.Read, // a VM still running
		diskimage.DefaultToolUID:      posixacl.Read, // the images plugin's check, running
		diskimage.LibvirtToolUID:      posixacl.Read | posixacl.Write,
		1000:                          posixacl.Read, // an operator's own
		2000005000:                    posixacl.Read, // another instance's
		uint32(2000000003) /* new */ : 0,
	} {
		if perm != 0 {
			if err := posixacl.Grant(f, uid, perm); err != nil {
				t.Fatal(err)
			}
		}
	}
	owned := func(uid uint32) bool { return vmUserEntry(uid) && uid < 2000005000 }
	want := map[uint32]uint16{2000000002: posixacl.Read, 2000000003: posixacl.Read}
	if err := syncPath(f, want, owned); err != nil {
		t.Fatal(err)
	}
	got, _ := posixacl.Users(f)
	for uid, perm := range map[uint32]uint16{2000000002: 4, 2000000003: 4, diskimage.DefaultToolUID: 4, diskimage.LibvirtToolUID: 6, 1000: 4, 2000005000: 4} {
		if got[uid] != perm {
			t.Errorf("user %d: perm %o, want %o (all: %v)", uid, got[uid], perm, got)
		}
	}
	if _, ok := got[2000000001]; ok || len(got) != 6 {
		t.Errorf("entries %v: the gone VM's user is still there", got)
	}
}

// A KVM VM's user is granted /dev/kvm by an ACL entry on the real device
// node (devtmpfs), opens it, and is refused again once the entry goes;
// the node's mode is as before.
func TestKVMDeviceGrant(t *testing.T) {
	st, err := os.Stat(kvmDevice)
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs /dev/kvm and root")
	}
	const uid = 2000199999 // no account, below the test daemons' range
	open := func() error {
		return exec.Command("setpriv", "--reuid=2000199999", "--regid=2000199999", "--clear-groups", "sh", "-c", "exec 3<>"+kvmDevice).Run()
	}
	if st.Mode().Perm()&0o006 == 0o006 {
		t.Skip("/dev/kvm is open to every user here")
	}
	if open() == nil {
		t.Fatal("a user of no account opens /dev/kvm before any grant")
	}
	if err := applyGrant(grant{kvmDevice, uid, posixacl.Read | posixacl.Write}); err != nil {
		t.Fatal(err)
	}
	defer posixacl.Revoke(kvmDevice, uid)
	if err := open(); err != nil {
		t.Errorf("the granted VM user cannot open /dev/kvm: %v", err)
	}
	if err := posixacl.Revoke(kvmDevice, uid); err != nil {
		t.Fatal(err)
	}
	if open() == nil {
		t.Error("the VM user still opens /dev/kvm after the revoke")
	}
	if after, _ := os.Stat(kvmDevice); after.Mode() != st.Mode() {
		t.Errorf("/dev/kvm's mode went from %v to %v", st.Mode(), after.Mode())
	}
}
