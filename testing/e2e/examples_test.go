package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// The third-party examples work from manifests alone: the scratch volume
// type (a flexvolume checked by the plugin through the daemon, attached
// with its serial) and the nocloud-vfat datasource (a FAT seed the guest
// finds by its label), with a daemon that knows neither.
func TestThirdPartyPluginsFromManifests(t *testing.T) {
	parallel(t)
	ps := append(plugins(),
		harness.Plugin{Name: "scratch", Kind: "volume", Binary: filepath.Join(bins, "virtlet-example-scratch"), Config: "{defaultSize: 8388608}"},
		harness.Plugin{Name: "vfat", Kind: "datasource", Binary: filepath.Join(bins, "virtlet-example-vfat")})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), ps)
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)

	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-examples"}
	if res := flexDriver(t, d, "mount", k.Volume("virtlet~flexvolume_driver", "bad"),
		`{"type": "scratch", "size": "-1", "kubernetes.io/pod.uid": "uid-examples"}`); res["status"] != "Failure" ||
		!strings.Contains(fmt.Sprint(res["message"]), "scratch volume bad option size") {
		t.Errorf("a bad scratch option: %v", res)
	}
	scratch := flexMount(t, d, k, "examples", "scratch", map[string]string{"type": "scratch", "size": "16777216"})

	podJSON, ctrJSON := vmPod(t, d, "examples", map[string]string{"VirtletCloudInitImageType": "nocloud-vfat", "VirtletDiskDriver": "virtio"}, 128<<20)
	var ctr map[string]interface{}
	readJSONFile(t, ctrJSON, &ctr)
	ctr["mounts"] = []map[string]interface{}{{"container_path": "/scratch", "host_path": scratch}}
	ctrJSON = harness.WriteJSON(t, d.Dir, "examples-ctr2.json", ctr)
	sb := c.Must(t, "runp", podJSON)
	id := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", id)
	logs := waitLog(t, c, id, "@@TINY-READY", 3*time.Minute)
	if !strings.Contains(logs, "SIZE_BYTES=16777216 RO=0 SERIAL=vol-scratch") {
		t.Errorf("the guest does not see the scratch disk with its serial:\n%s", logs)
	}
	if !strings.Contains(logs, "fs=vfat") || !strings.Contains(logs, "----- /ci/meta-data") {
		t.Errorf("the guest did not read the vfat seed:\n%s", logs)
	}
	if got := marker(t, logs, "HOSTNAME"); got != "examples" {
		t.Errorf("hostname from the vfat seed %q", got)
	}
	c.Must(t, "rmp", "-f", sb)
	if res := flexDriver(t, d, "unmount", scratch); res["status"] != "Success" {
		t.Errorf("unmount: %v", res)
	}
	assertNothingLeft(t, d, c)
	if media, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "scratch", "*.img")); len(media) != 0 {
		t.Errorf("scratch disks left: %v", media)
	}
}

// In a guest without udev (the tiny image runs a user-data script as
// CirrOS does), VirtletCloudInitUserDataScript's @virtlet-mount-script@
// finds the disks by their serials through sysfs under both disk drivers:
// a block volume is linked at its devicePath, a share mounted at its
// mountPath.
func TestMountScriptsWithoutUdev(t *testing.T) {
	parallel(t)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), volumePlugins())
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	for _, bus := range []string{"virtio", "scsi"} {
		t.Run(bus, func(t *testing.T) {
			k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-" + bus}
			share := k.Volume("kubernetes.io~empty-dir", "data")
			os.MkdirAll(share, 0o777)
			os.WriteFile(filepath.Join(share, "hello.txt"), []byte("hello-through-9p"), 0o644)
			dev := harness.LoopDevice(t, 24<<20, nil)
			name := "scripts-" + bus
			podJSON, ctrJSON := vmPod(t, d, name, map[string]string{"VirtletDiskDriver": bus,
				"VirtletCloudInitUserDataScript": "#!/bin/sh\n@virtlet-mount-script@\n" +
					"echo \"@@LINK=$(readlink -f /dev/db/primary) SIZE=$(( $(cat /sys/class/block/$(basename $(readlink -f /dev/db/primary))/size) * 512 ))\"\n" +
					"echo \"@@SHARE=$(cat /srv/data/hello.txt)\"\n"}, 128<<20)
			var ctr map[string]interface{}
			readJSONFile(t, ctrJSON, &ctr)
			ctr["mounts"] = []map[string]interface{}{{"container_path": "/srv/data", "host_path": share}}
			ctr["devices"] = []map[string]interface{}{{"container_path": "/dev/db/primary", "host_path": k.BlockVolume(t, "db-pv", dev), "permissions": "mrw"}}
			ctrJSON = harness.WriteJSON(t, d.Dir, name+"-ctr2.json", ctr)
			sb := c.Must(t, "runp", podJSON)
			id := c.Must(t, "create", sb, ctrJSON, podJSON)
			c.Must(t, "start", id)
			logs := waitLog(t, c, id, "@@TINY-READY", 3*time.Minute)
			// The guest prints the script itself first: read what it printed
			// when it ran.
			if i := strings.Index(logs, "@@USER-SCRIPT-BEGIN"); i >= 0 {
				logs = logs[i:]
			}
			want := "/dev/vd"
			if bus == "scsi" {
				want = "/dev/sd"
			}
			if got := markerLine(t, logs, "LINK"); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "SIZE=25165824") {
				t.Errorf("/dev/db/primary: %q, want a %s* disk of 24 MiB", got, want)
			}
			if got := marker(t, logs, "SHARE"); got != "hello-through-9p" {
				t.Errorf("the share at /srv/data: %q", got)
			}
			if !strings.Contains(logs, "@@USER-SCRIPT-END rc=0") {
				t.Errorf("the script failed:\n%s", logs)
			}
			c.Must(t, "rmp", "-f", sb)
		})
	}
	assertNothingLeft(t, d, c)
}
