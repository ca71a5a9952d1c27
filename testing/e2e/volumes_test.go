package e2e

import (
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/virtlet/virtlet/testing/cephcluster"
	"github.com/virtlet/virtlet/testing/harness"
)

// volumePlugins are the shipped plugins, the raw plugin allowing loop
// devices as the operator's globs would.
func volumePlugins() []harness.Plugin {
	ps := plugins()
	for i := range ps {
		if ps[i].Name == "raw" {
			ps[i].Config = `{allowedPaths: ["/dev/loop*"]}`
		}
	}
	return ps
}

// flexMount runs the real flexvolume driver's mount as kubelet does.
func flexMount(t *testing.T, d *harness.Daemon, k harness.KubeletPod, pod, name string, opts map[string]string) string {
	t.Helper()
	dir := k.Volume("virtlet~flexvolume_driver", name)
	if res := flexDriver(t, d, "mount", dir, k.FlexvolumeOptions(pod, name, opts)); res["status"] != "Success" {
		t.Fatalf("flexvolume mount %s: %v", name, res)
	}
	return dir
}

func flexDriver(t *testing.T, d *harness.Daemon, args ...string) map[string]interface{} {
	t.Helper()
	return d.FlexvolumeDriver(t, filepath.Join(bins, "virtlet-flexvolume-driver"), args...)
}

// cloudPod writes the configs of a cloud-image VM pod with these mounts,
// devices and runcmd report.
func cloudPod(t *testing.T, d *harness.Daemon, name string, ann map[string]string, mounts, devices []map[string]interface{}, report string) (string, string) {
	t.Helper()
	all := map[string]string{"VirtletCloudInitUserData": mustJSON(t, map[string]interface{}{"runcmd": [][]string{{"sh", "-c", report}}})}
	for k, v := range ann {
		all[k] = v
	}
	podJSON, _ := vmPod(t, d, name, all, 512<<20)
	ctrJSON := harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
		"metadata": map[string]string{"name": name}, "image": map[string]string{"image": "virtlet.cloud/debian-cloud"},
		"log_path": name + "/0.log", "linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 512 << 20}},
		"mounts": mounts, "devices": devices,
	})
	return podJSON, ctrJSON
}

// A VM pod with every volume form Virtlet's examples use on SCSI, in the Debian
// cloud image (real cloud-init and udev): a qcow2 flexvolume made ext4 with
// its uuid, a raw flexvolume (a loop device holding a file system), a Ceph
// RBD image on a real cluster (data written with go-ceph read by the guest,
// the guest's writes read back with go-ceph), a block PV linked at its
// devicePath, a hostPath shared over 9p and chowned, an emptyDir, a
// read-only share that refuses writes, and a file injected into the root
// file system from a ConfigMap. The cephx key shows up nowhere, and
// removal leaves nothing.
func TestVolumesInRealGuest(t *testing.T) {
	parallel(t)
	ceph := cephcluster.Start(t)
	ceph.Run(t, "ceph", "auth", "get-or-create", "client.libvirt", "mon", "profile rbd", "osd", "profile rbd pool=rbd")
	key := strings.TrimSpace(ceph.Run(t, "ceph", "auth", "print-key", "client.libvirt"))
	cephImage := writeRBD(t, ceph, "vmdata", map[string]string{"from-host.txt": "written with go-ceph"})

	tr := cloudTranslation(t)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), volumePlugins())
	d.Translate("test-images.yaml", translation)
	d.Translate("cloud.yaml", tr)
	d.KubeObjects("files.yaml", `apiVersion: v1
kind: ConfigMap
metadata: {name: injected, namespace: default}
data:
  conf: `+base64.StdEncoding.EncodeToString([]byte("injected-before-boot\n"))+`
  conf_path: /etc/injected.conf
`)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 5 * time.Minute
	c.Must(t, "pull", "virtlet.cloud/debian-cloud")

	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-vols"}
	rawDev := harness.LoopDevice(t, 32<<20, map[string]string{"marker.txt": "on-the-raw-device"})
	blockDev := harness.LoopDevice(t, 48<<20, nil)
	extra := flexMount(t, d, k, "vols", "extra", map[string]string{"type": "qcow2", "capacity": "256MiB", "uuid": "7a4d2c1e-9c2b-4e54-9a57-33c1a8b2d0f1"})
	raw := flexMount(t, d, k, "vols", "raw", map[string]string{"type": "raw", "path": rawDev})
	cephVol := flexMount(t, d, k, "vols", "ceph", map[string]string{"type": "ceph", "monitor": cephcluster.Monitor, "pool": "rbd",
		"volume": cephImage, "user": "libvirt",
		"kubernetes.io/secret/secret": base64.StdEncoding.EncodeToString([]byte(key))}) // a secretRef, as kubelet passes it
	if strings.Contains(dirContents(t, cephVol), key) {
		t.Fatal("the cephx key is in the flexvolume's directory")
	}
	hostDir := filepath.Join(t.TempDir(), "host-data")
	os.MkdirAll(hostDir, 0o755)
	os.WriteFile(filepath.Join(hostDir, "from-host.txt"), []byte("hello from the host"), 0o644)
	roDir := filepath.Join(t.TempDir(), "read-only")
	os.MkdirAll(roDir, 0o777)
	os.WriteFile(filepath.Join(roDir, "config.txt"), []byte("read me"), 0o644)
	emptyDir := k.Volume("kubernetes.io~empty-dir", "cache")
	os.MkdirAll(emptyDir, 0o777)
	// An NFS PV where kubelet mounts it (this machine's kernel has no
	// NFS client: a directory stands in for the mount): a 9p share, as
	// in Virtlet's ubuntu-vm-nfs-pv example.
	nfsDir := k.Volume("kubernetes.io~nfs", "nfs-pv")
	os.MkdirAll(nfsDir, 0o777)
	os.WriteFile(filepath.Join(nfsDir, "exported.txt"), []byte("from the nfs export"), 0o644)

	report := `exec >/dev/ttyS0 2>&1
echo "@@BYID-BEGIN"; ls /dev/disk/by-id/; echo "@@BYID-END"
for m in /var/lib/extra /var/lib/raw /cephdata /srv/host /cache /etc/ro-share /srv/nfs; do
  echo "@@MOUNT $m $(findmnt -n -r -o SOURCE,FSTYPE,OPTIONS $m | tr ' ' '|')"
done
echo "@@EXTRA-UUID=$(findmnt -n -o UUID /var/lib/extra)"
echo guest-extra > /var/lib/extra/probe && echo "@@EXTRA-WRITE=$(cat /var/lib/extra/probe)"
echo "@@RAW-MARKER=$(cat /var/lib/raw/marker.txt)"
echo "@@CEPH-MARKER=$(cat /cephdata/from-host.txt | tr ' ' _)"
echo written-by-the-guest > /cephdata/from-guest.txt && sync && echo "@@CEPH-WRITE-OK"
echo "@@BLOCK-LINK=$(readlink -f /dev/testpvc) size=$(blockdev --getsize64 /dev/testpvc)"
echo "@@HOST-READ=$(cat /srv/host/from-host.txt | tr ' ' _)"
echo from-the-guest > /srv/host/from-guest.txt && echo "@@HOST-WRITE-OK"
echo "@@HOST-OWNER=$(stat -c %u /srv/host/from-host.txt)"
echo cached > /cache/from-guest.txt && echo "@@EMPTYDIR-WRITE-OK"
echo "@@NFS-READ=$(cat /srv/nfs/exported.txt | tr ' ' _)"
echo "@@RO-READ=$(cat /etc/ro-share/config.txt | tr ' ' _)"
if echo nope > /etc/ro-share/nope.txt 2>/dev/null; then echo "@@RO-WRITE=allowed"; else echo "@@RO-WRITE=refused"; fi
echo "@@INJECTED=$(cat /etc/injected.conf)"
echo "@@VOLUMES-REPORT-DONE"
`
	mounts := []map[string]interface{}{
		{"container_path": "/var/lib/extra", "host_path": extra},
		{"container_path": "/var/lib/raw", "host_path": raw},
		{"container_path": "/cephdata", "host_path": cephVol},
		{"container_path": "/srv/host", "host_path": hostDir},
		{"container_path": "/cache", "host_path": emptyDir},
		{"container_path": "/srv/nfs", "host_path": nfsDir},
		{"container_path": "/etc/ro-share", "host_path": roDir, "readonly": true},
		{"container_path": "/etc/hosts", "host_path": k.File("etc-hosts")},
	}
	devices := []map[string]interface{}{{"container_path": "/dev/testpvc", "host_path": k.BlockVolume(t, "block-pv", blockDev), "permissions": "mrw"}}
	podJSON, ctrJSON := cloudPod(t, d, "vols", map[string]string{"VirtletChown9pfsMounts": "true", "VirtletFilesFromDataSource": "configmap/injected"},
		mounts, devices, report)
	sb := c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	domain := inspectCtr(t, c, ctr).VM.Name
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "@@VOLUMES-REPORT-DONE", 8*time.Minute)
	// A share is idmapped to the VM's own host user, as which its QEMU
	// runs: the guest sees the host's files as that user's.
	qemuUser := qemuUID(t, domain)

	byID := between(t, logs, "BYID")
	for _, serial := range []string{"vol-extra", "vol-raw", "vol-ceph", "vol-block-pv"} {
		if !strings.Contains(byID, "scsi-0QEMU_QEMU_HARDDISK_"+serial) {
			t.Errorf("udev made no /dev/disk/by-id link for serial %s (the path cloud-init's mounts use):\n%s", serial, byID)
		}
	}
	for mp, want := range map[string]string{"/var/lib/extra": "|ext4|rw", "/var/lib/raw": "|ext4|rw", "/cephdata": "|ext4|rw",
		"/srv/host": "host-data|9p|rw", "/cache": "cache|9p|rw", "/etc/ro-share": "read-only|9p|ro", "/srv/nfs": "nfs-pv|9p|rw"} {
		got := markerLine(t, logs, "MOUNT "+mp)
		if !strings.Contains(got, want) {
			t.Errorf("%s is mounted as %q, want %q", mp, got, want)
		}
	}
	for name, want := range map[string]string{
		"EXTRA-UUID": "7a4d2c1e-9c2b-4e54-9a57-33c1a8b2d0f1", "EXTRA-WRITE": "guest-extra", "RAW-MARKER": "on-the-raw-device",
		"CEPH-MARKER": "written_with_go-ceph", "HOST-READ": "hello_from_the_host", "HOST-OWNER": qemuUser, "RO-READ": "read_me",
		"RO-WRITE": "refused", "INJECTED": "injected-before-boot", "NFS-READ": "from_the_nfs_export",
	} {
		if got := marker(t, logs, name); got != want {
			t.Errorf("@@%s=%q, want %q", name, got, want)
		}
	}
	for _, m := range []string{"@@CEPH-WRITE-OK", "@@HOST-WRITE-OK", "@@EMPTYDIR-WRITE-OK"} {
		if !strings.Contains(logs, m) {
			t.Errorf("console lacks %s", m)
		}
	}
	if got := markerLine(t, logs, "BLOCK-LINK"); !strings.Contains(got, "size=50331648") || !strings.HasPrefix(got, "/dev/sd") {
		t.Errorf("/dev/testpvc: %q", got)
	}
	if data, err := os.ReadFile(filepath.Join(hostDir, "from-guest.txt")); err != nil || string(data) != "from-the-guest\n" {
		t.Errorf("the guest's write to the hostPath: %q %v", data, err)
	}
	if data, err := os.ReadFile(filepath.Join(emptyDir, "from-guest.txt")); err != nil || string(data) != "cached\n" {
		t.Errorf("the guest's write to the emptyDir: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(roDir, "nope.txt")); err == nil {
		t.Error("the guest wrote into the read-only share")
	}

	// The key is in no log, command line or domain XML.
	xml, _ := harness.Virsh("dumpxml", domain)
	if !strings.Contains(xml, `protocol="rbd"`) && !strings.Contains(xml, `protocol='rbd'`) {
		t.Errorf("the domain has no RBD disk:\n%s", xml)
	}
	rawKey, _ := base64.StdEncoding.DecodeString(key)
	for what, text := range map[string]string{"domain XML": xml, "daemon log": d.Log(), "command lines": commandLines(), "Ceph logs": ceph.Logs()} {
		if strings.Contains(text, key) || strings.Contains(text, string(rawKey)) {
			t.Errorf("the cephx key is in the %s", what)
		}
	}

	t.Logf("files written into the root file system in %v ms", logField(d, "files written into the root file system", "millis"))
	c.Must(t, "stop", "--timeout", "60", ctr)
	c.Must(t, "rmp", "-f", sb)
	for _, dir := range []string{extra, raw, cephVol} {
		if res := flexDriver(t, d, "unmount", dir); res["status"] != "Success" {
			t.Errorf("unmount %s: %v", dir, res)
		}
	}
	// The guest's write reached the RBD image: read it back with go-ceph.
	if got := readRBDFile(t, ceph, cephImage, "/from-guest.txt"); got != "written-by-the-guest\n" {
		t.Errorf("the guest's write read back from the RBD image: %q", got)
	}
	if status := ceph.Run(t, "rbd", "status", "rbd/"+cephImage); !strings.Contains(status, "Watchers: none") {
		t.Errorf("a watcher is left on the image:\n%s", status)
	}
	if secrets, _ := harness.Virsh("secret-list"); strings.Contains(secrets, "virtlet-") {
		t.Errorf("libvirt secrets left:\n%s", secrets)
	}
	// Nothing of the daemon's, nor the ceph plugin's keys directory (on
	// tmpfs on real nodes), holds the key once the volume is unmounted.
	for _, dir := range []string{d.Dir, "/run/virtlet/ceph-keys"} {
		if hits := filesHolding(t, dir, key); len(hits) != 0 {
			t.Errorf("files left holding the cephx key: %v", hits)
		}
	}
	assertNothingLeft(t, d, c)
	if shares, _ := os.ReadDir(filepath.Join(d.StateDir, "plugins", "ninep", "shares")); len(shares) != 0 {
		t.Errorf("9p shares left: %v", shares)
	}
	if disks, _ := os.ReadDir(filepath.Join(d.StateDir, "plugins", "qcow2", "disks")); len(disks) != 0 {
		t.Errorf("qcow2 disks left: %v", disks)
	}
	if data, err := os.ReadFile(filepath.Join(hostDir, "from-host.txt")); err != nil || string(data) != "hello from the host" {
		t.Error("the hostPath's files did not survive the VM")
	}
}

// logField returns a field of the daemon's log entries with this message.
func logField(d *harness.Daemon, msg, field string) []interface{} {
	var out []interface{}
	for _, e := range d.LogEntries() {
		if e["msg"] == msg {
			out = append(out, e[field])
		}
	}
	return out
}

// markerLine returns the rest of the console line after "@@<name> ".
func markerLine(t *testing.T, logs, name string) string {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if i := strings.Index(line, "@@"+name+" "); i >= 0 {
			return strings.TrimSpace(line[i+len(name)+3:])
		}
		if i := strings.Index(line, "@@"+name+"="); i >= 0 {
			return strings.TrimSpace(line[i+len(name)+3:])
		}
	}
	t.Fatalf("no @@%s in the console:\n%s", name, logs)
	return ""
}

func commandLines() string {
	var b strings.Builder
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil {
			b.Write(data)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func dirContents(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			data, _ := os.ReadFile(p)
			b.Write(data)
		}
		return nil
	})
	return b.String()
}

// filesHolding lists the files below dir that hold s.
func filesHolding(t *testing.T, dir, s string) []string {
	var hits []string
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if data, err := os.ReadFile(p); err == nil && strings.Contains(string(data), s) {
				hits = append(hits, p)
			}
		}
		return nil
	})
	return hits
}

// rbdImage opens an RBD image of the cluster's pool with go-ceph, as admin.
func rbdIOContext(t *testing.T, c *cephcluster.Cluster) (*rados.IOContext, func()) {
	t.Helper()
	conn, err := rados.NewConnWithUser("admin")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.ReadConfigFile(c.Conf); err != nil {
		t.Fatal(err)
	}
	if err := conn.Connect(); err != nil {
		t.Fatal(err)
	}
	ioctx, err := conn.OpenIOContext("rbd")
	if err != nil {
		t.Fatal(err)
	}
	return ioctx, func() { ioctx.Destroy(); conn.Shutdown() }
}

// writeRBD creates an RBD image holding an ext4 file system with files,
// written with go-ceph.
func writeRBD(t *testing.T, c *cephcluster.Cluster, name string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	content := filepath.Join(dir, "content")
	os.MkdirAll(content, 0o755)
	for n, data := range files {
		os.WriteFile(filepath.Join(content, n), []byte(data), 0o644)
	}
	fsImg := filepath.Join(dir, "fs.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", content, fsImg, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	data, err := os.ReadFile(fsImg)
	if err != nil {
		t.Fatal(err)
	}
	ioctx, done := rbdIOContext(t, c)
	defer done()
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	opts.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering)
	if err := rbd.CreateImage(ioctx, name, uint64(len(data)), opts); err != nil {
		t.Fatal(err)
	}
	img, err := rbd.OpenImage(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := img.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := img.Flush(); err != nil {
		t.Fatal(err)
	}
	return name
}

// readRBDFile reads a file of the ext4 file system in an RBD image, read
// with go-ceph (and e2fsprogs' debugfs, without mounting).
func readRBDFile(t *testing.T, c *cephcluster.Cluster, name, path string) string {
	t.Helper()
	ioctx, done := rbdIOContext(t, c)
	defer done()
	img, err := rbd.OpenImageReadOnly(ioctx, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	size, _ := img.GetSize()
	data := make([]byte, size)
	if _, err := img.ReadAt(data, 0); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fsImg := filepath.Join(dir, "fs.img")
	os.WriteFile(fsImg, data, 0o600)
	out := filepath.Join(dir, "out")
	if o, err := exec.Command("debugfs", "-R", fmt.Sprintf("dump %s %s", path, out), fsImg).CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v: %s", err, o)
	}
	got, _ := os.ReadFile(out)
	return string(got)
}
