package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// A persistent root file system on a block PV (devicePath "/"), on virtio
// disks: the first pod's VM writes a file; the next pod with the same PV
// boots the same disk and finds it (the VM outlives its pod), with a qcow2
// flexvolume formatted and mounted through the virtio by-id path; a pod
// with another image is refused naming both images; asking to
// reinitialise writes the other image, which then boots.
func TestPersistentRootfs(t *testing.T) {
	parallel(t)
	tr := cloudTranslation(t)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), volumePlugins())
	d.Translate("test-images.yaml", translation)
	d.Translate("cloud.yaml", tr)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 5 * time.Minute
	cloudID := strings.TrimPrefix(c.Must(t, "pull", "virtlet.cloud/debian-cloud"), "Image is up to date for ")
	tinyID := strings.TrimPrefix(c.Must(t, "pull", tinyRef), "Image is up to date for ")

	pv := harness.LoopDevice(t, 3<<30, nil)
	boot := func(name, uid string, ann map[string]string, report string) (sb, ctr, logs string) {
		t.Helper()
		k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: uid}
		extra := flexMount(t, d, k, name, "extra", map[string]string{"type": "qcow2", "capacity": "128MiB"})
		devices := []map[string]interface{}{{"container_path": "/", "host_path": k.BlockVolume(t, "root-pv", pv), "permissions": "mrw"}}
		mounts := []map[string]interface{}{{"container_path": "/var/lib/extra", "host_path": extra}}
		all := map[string]string{"VirtletDiskDriver": "virtio"}
		for k, v := range ann {
			all[k] = v
		}
		podJSON, ctrJSON := cloudPod(t, d, name, all, mounts, devices, report)
		sb = c.Must(t, "runp", podJSON)
		ctr = c.Must(t, "create", sb, ctrJSON, podJSON)
		c.Must(t, "start", ctr)
		return sb, ctr, waitLog(t, c, ctr, "@@ROOTFS-REPORT-DONE", 8*time.Minute)
	}
	const report = `exec >/dev/ttyS0 2>&1
echo "@@ROOT=$(findmnt -n -o SOURCE /)"
echo "@@EXTRA=$(findmnt -n -r -o SOURCE,FSTYPE /var/lib/extra | tr ' ' '|')"
echo "@@BYID-EXTRA=$(readlink -f /dev/disk/by-id/virtio-vol-extra)"
echo "@@MARKER=$(cat /var/lib/persistent-marker 2>/dev/null || echo none)"
echo "written-in-$(hostname)" > /var/lib/persistent-marker; sync
echo "@@ROOTFS-REPORT-DONE"
`
	sb, _, logs := boot("rootfs-first", "uid-first", nil, report)
	if got := marker(t, logs, "MARKER"); got != "none" {
		t.Fatalf("a fresh persistent root already holds a marker: %q", got)
	}
	if got := marker(t, logs, "ROOT"); !strings.HasPrefix(got, "/dev/vda") {
		t.Errorf("root file system on %q, want the PV (vda)", got)
	}
	if got := marker(t, logs, "EXTRA"); !strings.HasSuffix(got, "|ext4") || marker(t, logs, "BYID-EXTRA") != strings.Split(got, "|")[0] {
		t.Errorf("qcow2 volume %q, by-id link %q", got, marker(t, logs, "BYID-EXTRA"))
	}
	c.Must(t, "stopp", sb)
	c.Must(t, "rmp", sb)

	// The next pod boots the same disk: the first VM's file is there.
	sb, _, logs = boot("rootfs-second", "uid-second", nil, report)
	if got := marker(t, logs, "MARKER"); got != "written-in-rootfs-first" {
		t.Fatalf("the second pod's VM sees marker %q, want the first VM's", got)
	}
	c.Must(t, "rmp", "-f", sb)

	// Another image on the same PV is refused, naming both images.
	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-tiny"}
	devices := []map[string]interface{}{{"container_path": "/", "host_path": k.BlockVolume(t, "root-pv", pv), "permissions": "mrw"}}
	podJSON, ctrJSON := vmPod(t, d, "rootfs-tiny", nil, 128<<20)
	ctrJSON = withDevices(t, d, ctrJSON, devices)
	sb = c.Must(t, "runp", podJSON)
	_, errOut, err := c.Run("create", sb, ctrJSON, podJSON)
	if err == nil || !strings.Contains(errOut, "persistent root file system") || !strings.Contains(errOut, cloudID) ||
		!strings.Contains(errOut, tinyID) || !strings.Contains(errOut, "VirtletPersistentRootfsReinit") {
		t.Fatalf("another image on the PV: %v\n%s", err, errOut)
	}
	c.Must(t, "rmp", "-f", sb)
	// Asked to, the PV is reinitialised with the other image, which boots.
	podJSON, ctrJSON = vmPod(t, d, "rootfs-tiny2", map[string]string{"VirtletPersistentRootfsReinit": "true"}, 128<<20)
	ctrJSON = withDevices(t, d, ctrJSON, devices)
	sb = c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
	c.Must(t, "rmp", "-f", sb)
	t.Logf("images written to the persistent root (ms): %v", logField(d, "image written to the persistent root file system", "millis"))
	assertNothingLeft(t, d, c)
	// The PV keeps its data: GC never touches a persistent volume.
	head := string(harness.ReadAt(t, pv, 0, 256))
	if !strings.HasPrefix(head, "VIRTLET-PERSISTENT-ROOTFS v1\n{\"image\":\""+tinyID+"\"") {
		t.Errorf("the PV's header after removal: %q", head)
	}
}

func withDevices(t *testing.T, d *harness.Daemon, ctrJSON string, devices []map[string]interface{}) string {
	t.Helper()
	return withCtrField(t, d, ctrJSON, "devices", devices, "-dev")
}

// withCtrField writes a container config like ctrJSON's with key set to v,
// into a file named with suffix.
func withCtrField(t *testing.T, d *harness.Daemon, ctrJSON, key string, v interface{}, suffix string) string {
	t.Helper()
	var ctr map[string]interface{}
	readJSONFile(t, ctrJSON, &ctr)
	ctr[key] = v
	return harness.WriteJSON(t, d.Dir, strings.TrimSuffix(filepath.Base(ctrJSON), ".json")+suffix+".json", ctr)
}

func readJSONFile(t *testing.T, p string, v interface{}) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}
