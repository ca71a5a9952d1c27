package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// A checkpoint that the libvirt plugin's crash interrupts, the guest
// paused and its memory written, loses nothing: CheckpointContainer fails
// naming the plugin, and none of the checkpoint's files (the memory
// written, the disks' copies) is left in the daemon's state or at the
// location; the restarted plugin resumes the guest, whose process runs on
// in the same QEMU (its ticks go on, numbered without a gap); and the
// next checkpoint goes through. (The daemon's own crash while it packs
// the archive: checkpointarchive's
// TestAnArchiveHalfWrittenByADeadDaemonIsRemoved.)
func TestCheckpointInterruptedByAPluginCrash(t *testing.T) {
	parallel(t)
	fired := filepath.Join(t.TempDir(), "failpoint-fired")
	ps := plugins()
	for i := range ps {
		if ps[i].Name == "libvirt" {
			ps[i].Binary = filepath.Join(bins, "virtlet-plugin-libvirt-failpoints")
			ps[i].Args = []string{fmt.Sprintf("%q", "--failpoint=checkpoint-written"), fmt.Sprintf("%q", "--failpoint-once="+fired)}
		}
	}
	d, c := startDaemonWith(t, ps)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "cp-crash", map[string]string{"VirtletCloudInitUserDataScript": tickerScript}, 128<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	ticks := func() []int {
		logs, _, _ := c.Run("logs", ctr)
		var out []int
		for _, m := range regexp.MustCompile(`@@TICK (\d+) lines=(\d+)`).FindAllStringSubmatch(logs, -1) {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
		return out
	}
	harness.Eventually(t, time.Minute, "the guest ticking", func() bool { return len(ticks()) >= 3 })
	dom := inspectCtr(t, c, ctr).VM.Name
	qemu, err := harness.QEMUPID(dom)
	if err != nil {
		t.Fatal(err)
	}
	pid := pluginPID(t, c, "libvirt")

	out := t.TempDir()
	archive := filepath.Join(out, "cp.tar")
	_, errOut, err := c.Run("checkpoint", "--export="+archive, ctr)
	if err == nil {
		t.Fatal("the checkpoint went through the plugin's crash")
	}
	if _, serr := os.Stat(fired); serr != nil {
		t.Fatalf("the plugin did not reach the failpoint (%v): %v %s", serr, err, errOut)
	}
	if !strings.Contains(errOut, "plugin libvirt") {
		t.Errorf("the error does not name the plugin: %s", errOut)
	}
	t.Logf("interrupted: %s", strings.TrimSpace(errOut))
	if left, _ := os.ReadDir(out); len(left) != 0 {
		t.Errorf("the interrupted checkpoint left %v at its location", left)
	}
	if left, _ := filepath.Glob(filepath.Join(d.StateDir, "checkpoints", "*")); len(left) != 0 {
		t.Errorf("the interrupted checkpoint left %v in the daemon's state", left)
	}

	harness.Eventually(t, time.Minute, "a new libvirt plugin", func() bool { p := pluginPID(t, c, "libvirt"); return p > 0 && p != pid })
	harness.Eventually(t, time.Minute, "the guest resumed", func() bool {
		state, _ := harness.Virsh("domstate", dom)
		return strings.TrimSpace(state) == "running"
	})
	if !strings.Contains(d.Log(), "resumed a guest an interrupted checkpoint left paused") {
		t.Errorf("the restarted plugin did not say it resumed the guest")
	}
	if now, err := harness.QEMUPID(dom); err != nil || now != qemu {
		t.Fatalf("the guest's QEMU is %s (%v), was %s: the VM was not kept", now, err, qemu)
	}
	seen := len(ticks())
	harness.Eventually(t, time.Minute, "the guest ticking on", func() bool { return len(ticks()) >= seen+5 })
	ts := ticks()
	for i := 1; i < len(ts); i++ {
		if ts[i] != ts[i-1]+1 {
			t.Fatalf("tick %d after tick %d: the guest's process did not run on", ts[i], ts[i-1])
		}
	}
	if st := inspectCtr(t, c, ctr).Status.State; st != "CONTAINER_RUNNING" {
		t.Errorf("the container is %s after the interrupted checkpoint", st)
	}

	c.Must(t, "checkpoint", "--export="+archive, ctr)
	if info, err := os.Stat(archive); err != nil || info.Size() == 0 {
		t.Fatalf("the checkpoint after the crash: %v", err)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
