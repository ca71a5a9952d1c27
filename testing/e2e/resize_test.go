package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// In-place pod resize (crictl update, as kubelet's resize does): the VM's
// memory grows through its balloon up to VirtletMaxMemory and the guest
// sees it within seconds; it shrinks back; beyond the maximum is refused
// naming the annotation.
func TestInPlaceMemoryResize(t *testing.T) {
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "resize", map[string]string{"VirtletMaxMemory": "320Mi"}, 128<<20)
	sb := c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
	memTotal := func() int64 {
		out, _, err := c.Run("exec", "-s", "--timeout", "10", ctr, "grep", "MemTotal", "/proc/meminfo")
		if err != nil {
			return 0
		}
		f := strings.Fields(out)
		if len(f) < 2 {
			return 0
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		return n << 10
	}
	// The balloon holds what lies above the VM's 128 MiB.
	harness.Eventually(t, time.Minute, "the guest sees at most 128 MiB", func() bool { m := memTotal(); return m > 0 && m <= 128<<20 })
	c.Must(t, "update", "--memory", strconv.Itoa(320<<20), ctr)
	harness.Eventually(t, 30*time.Second, "the guest sees its memory grow past 256 MiB", func() bool { return memTotal() > 256<<20 })
	if got := inspectCtr(t, c, ctr).VM.MemoryBytes; got != 320<<20 {
		t.Errorf("the VM's memory after the resize: %d", got)
	}
	c.Must(t, "update", "--memory", strconv.Itoa(160<<20), ctr)
	harness.Eventually(t, 30*time.Second, "the guest gives memory back", func() bool { m := memTotal(); return m > 0 && m <= 160<<20 })
	_, errOut, err := c.Run("update", "--memory", strconv.Itoa(512<<20), ctr)
	if err == nil || !strings.Contains(errOut, "resources.limits.memory") || !strings.Contains(errOut, "VirtletMaxMemory") {
		t.Errorf("a resize beyond VirtletMaxMemory: %v %s", err, errOut)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
