package ninep

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
)

func configured(t *testing.T) *Volumes {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	v := New(l)
	state := t.TempDir()
	if err := v.Configure(context.Background(), ports.PluginConfig{StateDir: state, Config: []byte(`{"owner":"nobody:nogroup"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func env(t *testing.T, v ports.Volumes) volumetest.Env {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hello"), 0o644)
	return volumetest.Env{
		Volumes: v, Persistent: false, Shared: true, NotFlexvolume: true, NamesFiles: true,
		Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
			return ports.VolumeRequest{VMID: vmID, Name: name, Type: ports.VolumeShare, HostPath: src}
		},
		// A share "exists" while its mount point shows the volume's files.
		Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
			_, err := os.Stat(filepath.Join(att.Filesystems[0].Source, "hello.txt"))
			return err == nil
		},
		Invalid: ports.VolumeRequest{VMID: "vm", Name: "../etc", Type: ports.VolumeShare, HostPath: src},
	}
}

func TestContract(t *testing.T) {
	t.Run("in process", func(t *testing.T) { volumetest.Run(t, env(t, configured(t))) })
	t.Run("over gRPC", func(t *testing.T) {
		volumetest.Run(t, env(t, volume.NewClient(sdktest.Conn(t, configured(t)))))
	})
}

// A share shows the volume's files, writable both ways; a read-only one
// refuses writes; chowning gives the files to QEMU's user; release leaves
// the files and no mount.
func TestShares(t *testing.T) {
	v := configured(t)
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "f.txt"), []byte("data"), 0o644)
	outside := filepath.Join(t.TempDir(), "host-file")
	os.WriteFile(outside, []byte("x"), 0o600)
	os.Symlink(outside, filepath.Join(src, "sub", "escape"))
	os.Symlink(filepath.Dir(outside), filepath.Join(src, "escape-dir"))

	rw := ports.VolumeRequest{VMID: "0123abcd", Name: "data", Type: ports.VolumeShare, HostPath: src, Chown: true}
	att, err := v.Prepare(ctx, rw)
	if err != nil {
		t.Fatal(err)
	}
	mp := att.Filesystems[0].Source
	if att.Filesystems[0].AccessMode != "squash" || att.Filesystems[0].ReadOnly {
		t.Fatalf("share %+v", att.Filesystems[0])
	}
	if err := os.WriteFile(filepath.Join(mp, "from-guest.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "from-guest.txt")); err != nil {
		t.Fatal("a write through the share did not reach the volume")
	}
	var st syscall.Stat_t
	syscall.Stat(filepath.Join(src, "sub", "f.txt"), &st)
	if int(st.Uid) != v.uid || int(st.Gid) != v.gid {
		t.Fatalf("chown: owner %d:%d, want %d:%d", st.Uid, st.Gid, v.uid, v.gid)
	}
	syscall.Stat(outside, &st)
	if st.Uid != 0 {
		t.Fatal("chown followed a symlink out of the share")
	}

	ro := ports.VolumeRequest{VMID: "0123abcd", Name: "config", Type: ports.VolumeShare, HostPath: src, ReadOnly: true}
	att, err = v.Prepare(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	err = os.WriteFile(filepath.Join(att.Filesystems[0].Source, "nope.txt"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) || !att.Filesystems[0].ReadOnly {
		t.Fatalf("write to a read-only share: %v", err)
	}
	for _, r := range []ports.VolumeRequest{rw, ro} {
		if err := v.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if entries, _ := os.ReadDir(v.dir); len(entries) != 0 {
		t.Fatalf("left in the shares directory: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(src, "sub", "f.txt")); err != nil {
		t.Fatal("release removed the volume's files")
	}

	file := filepath.Join(src, "sub", "f.txt")
	_, err = v.Prepare(ctx, ports.VolumeRequest{VMID: "0123abcd", Name: "file", Type: ports.VolumeShare, HostPath: file})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file as share: %v", err)
	}
}

// A share of a directory only root may use is idmapped: QEMU's user
// reads root's files through it and what it writes is root's on the host.
// Without idmapped mounts such a directory is refused, naming the fix.
func TestIdmappedShare(t *testing.T) {
	v := configured(t)
	if v.userns == nil {
		t.Skip("no user namespaces here")
	}
	ctx := context.Background()
	src := t.TempDir()
	os.Chmod(src, 0o700) // root's alone
	os.WriteFile(filepath.Join(src, "secret.txt"), []byte("root-only"), 0o600)
	req := ports.VolumeRequest{VMID: "0123abcd", Name: "data", Type: ports.VolumeShare, HostPath: src}
	att, err := v.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Release(ctx, req) })
	mp := att.Filesystems[0].Source
	// QEMU's user must reach the mount point: open the test's own
	// temporary directories on the way.
	for d := filepath.Dir(v.dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	asQEMU := exec.Command("sh", "-c", "cat "+mp+"/secret.txt && echo from-qemu > "+mp+"/new.txt && mkdir "+mp+"/dir")
	asQEMU.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(v.uid), Gid: uint32(v.gid)}}
	out, err := asQEMU.CombinedOutput()
	if err != nil || string(out) != "root-only" {
		t.Fatalf("QEMU's user through the share: %q %v", out, err)
	}
	for _, name := range []string{"new.txt", "dir"} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(src, name), &st); err != nil || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s on the host: owner %d:%d, %v; want root's", name, st.Uid, st.Gid, err)
		}
	}

	// Without idmapped mounts, the same directory is refused at Prepare.
	userns := v.userns
	v.userns = nil
	defer func() { v.userns = userns }()
	_, err = v.Prepare(ctx, ports.VolumeRequest{VMID: "0123abcd", Name: "plain", Type: ports.VolumeShare, HostPath: src})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "VirtletChown9pfsMounts") || !strings.Contains(err.Error(), "may not read") {
		t.Fatalf("a directory QEMU may not read, without idmapping: %v", err)
	}
	if _, err := os.Stat(filepath.Join(v.dir, "0123abcd", "plain")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused share's mount point stays: %v", err)
	}
}

// A share for a VM with a user of its own is idmapped to that user: it
// reads and writes root's files through it, and another VM's user (here
// the plugin's default one) cannot.
func TestShareForTheVMsOwnUser(t *testing.T) {
	v := configured(t)
	if v.userns == nil {
		t.Skip("no user namespaces here")
	}
	ctx := context.Background()
	src := t.TempDir()
	os.Chmod(src, 0o700)
	os.WriteFile(filepath.Join(src, "data.txt"), []byte("vm-data"), 0o600)
	own := &ports.ProcessIdentity{UID: 200005, GID: 200005}
	req := ports.VolumeRequest{VMID: "0123abcd", Name: "data", Type: ports.VolumeShare, HostPath: src, RunAs: own}
	att, err := v.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Release(ctx, req) })
	mp := att.Filesystems[0].Source
	for d := filepath.Dir(v.dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	as := func(uid, gid int, script string) (string, error) {
		cmd := exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as(own.UID, own.GID, "cat "+mp+"/data.txt && echo x > "+mp+"/written"); err != nil || out != "vm-data" {
		t.Fatalf("the VM's user through its share: %q %v", out, err)
	}
	if out, err := as(v.uid, v.gid, "cat "+mp+"/data.txt"); err == nil {
		t.Fatalf("another user read the VM's share: %q", out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(src, "written"), &st); err != nil || st.Uid != 0 {
		t.Errorf("what the VM wrote is owned by %d on the host, want root: %v", st.Uid, err)
	}
}

// A plugin that stops keeps the shares' directory mounted while a share is
// in it (its VM runs on), and unmounts it once none is.
func TestShutdownUnmountsOnlyAnEmptySharesDir(t *testing.T) {
	v := configured(t)
	ctx := context.Background()
	src := t.TempDir()
	req := ports.VolumeRequest{VMID: "0123abcd", Name: "data", Type: ports.VolumeShare, HostPath: src}
	if _, err := v.Prepare(ctx, req); err != nil {
		t.Fatal(err)
	}
	dir := v.dir
	v.Shutdown(ctx)
	if !isMountPoint(dir) {
		t.Fatal("the shares' directory was unmounted under a share")
	}
	if err := v.Release(ctx, req); err != nil {
		t.Fatal(err)
	}
	v.Shutdown(ctx)
	if isMountPoint(dir) {
		t.Fatal("the shares' directory is still mounted with no share in it")
	}
}
