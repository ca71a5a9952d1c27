package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// The cloud test image (Debian with real cloud-init) boots as a VM pod to
// its serial login prompt. Without a datasource (cloud-init data comes with
// the datasource plugins) cloud-init disables itself; later suites use the
// image for cloud-init, ssh and the guest agent.
func TestCloudImageBoots(t *testing.T) {
	cloud, err := harness.GuestImage("cloud")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cloud)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(imgDir, "cloud.qcow2"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := images.Translation(map[string]string{"debian-cloud": "cloud.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	d, c := startDaemon(t)
	d.Translate("cloud.yaml", tr)
	c.Must(t, "pull", "virtlet.cloud/debian-cloud")
	podJSON, _ := vmPod(t, d, "debian", map[string]string{"VirtletDiskDriver": "virtio", "VirtletVCPUCount": "1"}, 512<<20)
	ctrJSON := harness.WriteJSON(t, d.Dir, "debian-ctr.json", map[string]interface{}{
		"metadata": map[string]string{"name": "debian"}, "image": map[string]string{"image": "virtlet.cloud/debian-cloud"},
		"log_path": "debian/0.log", "linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 512 << 20}},
	})
	sb := c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	start := time.Now()
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "login:", 8*time.Minute)
	if !strings.Contains(logs, "Debian GNU/Linux 12") {
		t.Errorf("console lacks the Debian banner")
	}
	if !strings.Contains(logs, "Serial Getty on ttyS0") {
		t.Errorf("console lacks the serial getty")
	}
	t.Logf("login prompt after %s", time.Since(start).Round(time.Second))
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
