package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

// Operator presets (--presets-dir) reach the guest: one a pod names
// (VirtletPreset), one that selects pods by label; the pod's own
// annotations win over both; a name the node lacks is refused, listing
// the node's presets.
func TestPresets(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	for name, content := range map[string]string{
		"q35-pair.yaml": "name: q35-pair\nvcpus: 2\nmemory: 192Mi\nannotations:\n  VirtletMachineType: q35\n  VirtletCPUTopology: sockets=1,cores=2\n",
		"guarded.yaml":  "name: guarded\nselector:\n  matchLabels: {vm-class: guarded}\nannotations:\n  VirtletWatchdog: i6300esb\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), plugins())
	d.Translate("test-images.yaml", translation)
	d.Start("--presets-dir", dir)
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)

	boot := func(name string, ann, labels map[string]string) string {
		t.Helper()
		podJSON, ctrJSON := vmPod(t, d, name, ann, 0) // no memory limit: the preset's memory
		podJSON = editJSON(t, podJSON, func(p *runtimeapi.PodSandboxConfig) { p.Labels = labels })
		sb := c.Must(t, "runp", podJSON)
		t.Cleanup(func() { c.Run("rmp", "-f", sb) })
		ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
		c.Must(t, "start", ctr)
		logs := waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
		c.Must(t, "rmp", "-f", sb)
		return logs
	}

	// By name: q35, two vCPUs in one socket, 192 MiB.
	logs := boot("preset-by-name", map[string]string{"VirtletPreset": "q35-pair"}, nil)
	if got := markerLine(t, logs, "MACHINE"); !strings.Contains(got, "HOSTBRIDGE=0x29c0") {
		t.Errorf("guest's machine %q, want q35 (the preset's)", got)
	}
	if got := markerLine(t, logs, "TOPOLOGY"); got != "sockets=1 cores=2 siblings=2" {
		t.Errorf("guest's CPU topology %q, want the preset's one socket of two cores", got)
	}
	if memK, _ := strconv.ParseInt(marker(t, logs, "MEMTOTAL_KB"), 10, 64); memK > 192<<10 || memK < (192<<10)*6/10 {
		t.Errorf("guest MemTotal %d KiB, want a little under the preset's 192 MiB", memK)
	}
	if got := marker(t, logs, "WATCHDOG"); got != "" {
		t.Errorf("guest has a watchdog %q: the label preset applies to labelled pods only", got)
	}

	// By name and by label; the pod's own machine type wins.
	logs = boot("preset-by-label", map[string]string{"VirtletPreset": "q35-pair", "VirtletMachineType": "pc"}, map[string]string{"vm-class": "guarded"})
	if got := marker(t, logs, "WATCHDOG"); got != "i6300ESB_timer" {
		t.Errorf("guest's watchdog %q, want the i6300ESB of the label's preset", got)
	}
	if got := markerLine(t, logs, "MACHINE"); !strings.Contains(got, "HOSTBRIDGE=0x1237") {
		t.Errorf("guest's machine %q, want the pod's own pc over the preset's q35", got)
	}
	if got := marker(t, logs, "CPUS"); got != "2" {
		t.Errorf("guest sees %s CPUs, want the preset's 2", got)
	}

	podJSON, ctrJSON := vmPod(t, d, "preset-unknown", map[string]string{"VirtletPreset": "q35-quad"}, 0)
	sb := c.Must(t, "runp", podJSON)
	_, errOut, err := c.Run("create", sb, ctrJSON, podJSON)
	for _, want := range []string{"annotation VirtletPreset", "q35-quad", "no such preset on this node", "guarded, q35-pair"} {
		if err == nil || !strings.Contains(errOut, want) {
			t.Errorf("an unknown preset: %v %s (want %q)", err, errOut, want)
		}
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
