package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/testing/harness"
)

// keepMarker writes a file onto the tiny guest's own disk (its FAT boot
// partition: the tiny guest runs from an initramfs) and readMarker reads
// it back, so a boot from the same disk is told from a new disk.
const (
	keepMarker = `d=$(findfs LABEL=TINYBOOT) && mkdir -p /mnt/boot && mount -t vfat "$d" /mnt/boot && echo kept-across-boots > /mnt/boot/marker && umount /mnt/boot`
	readMarker = `d=$(findfs LABEL=TINYBOOT) && mkdir -p /mnt/boot && mount -t vfat -o ro "$d" /mnt/boot && cat /mnt/boot/marker; umount /mnt/boot`
)

// virtletctl stop, start and restart (the daemon's own exec commands, as
// virtletctl sends them) on a real VM: stop shuts the domain off and keeps
// the container running with reason Halted, the guest unreachable, across
// a daemon crash; start boots the same domain from the same disk (the
// file written before the stop is there); restart power-cycles it in
// place. The container's ID never changes and kubelet has nothing to
// restart.
func TestRunStrategiesKeepTheVM(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "power", nil, 256<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name
	c.Must(t, "exec", "-s", "--timeout", "30", ctr, "sh", "-c", keepMarker)

	boots := func() int {
		logs, _, _ := c.Run("logs", ctr)
		return strings.Count(logs, "@@TINY-READY")
	}
	out := c.Must(t, "exec", ctr, vmtools.Stop, "20")
	if !strings.Contains(out, "halted") {
		t.Fatalf("stop: %s", out)
	}
	halted := func(when string) {
		t.Helper()
		if state, _ := harness.Virsh("domstate", domain); state != "shut off" {
			t.Errorf("%s: domain %s is %q, want shut off", when, domain, state)
		}
		i := inspectCtr(t, c, ctr)
		if i.Status.State != "CONTAINER_RUNNING" || i.Status.Reason != "Halted" || !strings.Contains(i.Status.Message, "virtletctl start power") {
			t.Errorf("%s: container status %+v, want running, Halted", when, i.Status)
		}
		if _, errOut, err := c.Run("exec", "-s", "--timeout", "10", ctr, "true"); err == nil || !strings.Contains(errOut, "halted") || !strings.Contains(errOut, "exited with 126") {
			t.Errorf("%s: exec in the halted VM: %v %s (want exit code 126: exec probes fail)", when, err, errOut)
		}
	}
	halted("after stop")
	// Nothing boots it while it is halted, a daemon crash included.
	d.Kill()
	d.Start()
	time.Sleep(2 * time.Second) // the restarted daemon's resync
	halted("after a daemon crash and restart")
	if n := boots(); n != 1 {
		t.Fatalf("the halted VM booted: %d ready markers in its console, want the first boot's only", n)
	}

	before := boots()
	if out := c.Must(t, "exec", ctr, vmtools.Start); !strings.Contains(out, "started") {
		t.Fatalf("start: %s", out)
	}
	harness.Eventually(t, 3*time.Minute, "the VM's second boot", func() bool { return boots() > before })
	if state, _ := harness.Virsh("domstate", domain); state != "running" {
		t.Fatalf("after start: domain %s is %q", domain, state)
	}
	if got := c.Must(t, "exec", "-s", "--timeout", "30", ctr, "sh", "-c", readMarker); got != "kept-across-boots" {
		t.Fatalf("the file written before the stop, after start: %q", got)
	}

	before = boots()
	if out := c.Must(t, "exec", ctr, vmtools.Restart, "20"); !strings.Contains(out, "restarted") {
		t.Fatalf("restart: %s", out)
	}
	harness.Eventually(t, 3*time.Minute, "the VM's boot after restart", func() bool { return boots() > before })
	if got := c.Must(t, "exec", "-s", "--timeout", "30", ctr, "sh", "-c", readMarker); got != "kept-across-boots" {
		t.Fatalf("the file written before the stop, after restart: %q", got)
	}
	if i := inspectCtr(t, c, ctr); i.Status.State != "CONTAINER_RUNNING" || i.Status.Reason == "Halted" || i.VM.Name != domain {
		t.Fatalf("after restart: %+v", i)
	}
	if ids := c.Must(t, "ps", "-a", "-q", "--pod", sb); ids != ctr {
		t.Fatalf("the pod's containers after stop, start and restart: %q, want only %s", ids, ctr)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
