package e2e

import (
	"fmt"
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
