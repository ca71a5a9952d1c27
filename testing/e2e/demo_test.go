package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/testing/harness"
)

// The README's first command works and cleans up after itself.
func TestDemo(t *testing.T) {
	parallel(t)
	holdBuildingBin(t)
	cmd := exec.Command("make", "demo")
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), "VIRTLET_DEMO_ONCE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	for _, want := range []string{"RuntimeName:  virtlet", "@@TINY-READY", "the VM pod is up: CONTAINER_RUNNING",
		"the VM took it by DHCP: @@DHCP-BOUND iface=eth0 ip=198.19.0.", ", 0% packet loss", "stopping"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if procs, _ := exec.Command("pgrep", "-f", "virtlet-demo").Output(); len(procs) != 0 {
		t.Errorf("the demo left processes: %s", procs)
	}
	if out, err := exec.Command("ip", "link", "show", "virtlet-demo0").CombinedOutput(); err == nil {
		t.Errorf("the demo left its bridge: %s", out)
	}
	if rules, _ := exec.Command("iptables", "-S", "FORWARD").Output(); strings.Contains(string(rules), "virtlet-demo0") {
		t.Errorf("the demo left its iptables rules:\n%s", rules)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), "/tmp/virtlet-demo.") {
		t.Errorf("the demo left mounts:\n%s", mounts)
	}
}
