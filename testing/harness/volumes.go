package harness

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// KubeletPod lays out a pod's volumes as kubelet does below its root
// directory: <root>/pods/<uid>/volumes/<plugin>/<name>.
type KubeletPod struct{ Root, UID string }

// Volume is the directory of one of the pod's volumes.
func (k KubeletPod) Volume(plugin, name string) string {
	return filepath.Join(k.Root, "pods", k.UID, "volumes", plugin, name)
}

// File is one of kubelet's own per-pod files (e.g. "etc-hosts").
func (k KubeletPod) File(name string) string { return filepath.Join(k.Root, "pods", k.UID, name) }

// BlockVolume makes the device node kubelet maps for a block volume (a
// node of dev's device under the pod's volumeDevices directory).
func (k KubeletPod) BlockVolume(t testing.TB, name, dev string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(k.Root, "pods", k.UID, "volumeDevices", "kubernetes.io~local-volume", name)
	os.MkdirAll(filepath.Dir(p), 0o750)
	if err := unix.Mknod(p, unix.S_IFBLK|0o660, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	return p
}

// FlexvolumeOptions are the options kubelet hands the flexvolume driver
// for a pod's flexVolume.
func (k KubeletPod) FlexvolumeOptions(pod, volume string, opts map[string]string) string {
	all := map[string]string{"kubernetes.io/pod.uid": k.UID, "kubernetes.io/pod.name": pod, "kubernetes.io/pod.namespace": "default",
		"kubernetes.io/pvOrVolumeName": volume, "kubernetes.io/readwrite": "rw", "kubernetes.io/serviceAccount.name": "default"}
	for key, v := range opts {
		all[key] = v
	}
	b, _ := json.Marshal(all)
	return string(b)
}

// FlexvolumeDriver runs the flexvolume driver binary as kubelet does,
// against the daemon's admin socket, and decodes its answer.
func (d *Daemon) FlexvolumeDriver(t testing.TB, driver string, args ...string) map[string]interface{} {
	t.Helper()
	cmd := exec.Command(driver, args...)
	cmd.Env = append(os.Environ(), "VIRTLET_ADMIN_SOCKET="+d.AdminSocket())
	out, _ := cmd.Output()
	var res map[string]interface{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("flexvolume driver %v: %q is not JSON: %v", args, out, err)
	}
	return res
}

// LoopDevice makes a loop device over a sparse file of size bytes,
// detached after the test; with files, the device holds an ext4 file
// system with them.
func LoopDevice(t testing.TB, size int64, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if files != nil {
		content := filepath.Join(dir, "content")
		os.MkdirAll(content, 0o755)
		for name, data := range files {
			os.WriteFile(filepath.Join(content, name), []byte(data), 0o644)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", content, img, strconv.FormatInt(size>>10, 10)+"K").CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
	} else {
		os.WriteFile(img, nil, 0o600)
		os.Truncate(img, size)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
	return dev
}

// UnmountBelow lazily unmounts every mount point below dir, deepest
// first.
func UnmountBelow(dir string) {
	mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	sort.Slice(mounts, func(i, j int) bool { return mounts[i].Mountpoint > mounts[j].Mountpoint })
	for _, m := range mounts {
		if m.Mountpoint != dir {
			unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
		}
	}
}

// ReadAt reads n bytes of a file or device at off.
func ReadAt(t testing.TB, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}
