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
	cmd := exec.Command("make", "demo")
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), "VIRTLET_DEMO_ONCE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	for _, want := range []string{"RuntimeName:  virtlet", "@@TINY-READY", "the VM pod is up: CONTAINER_RUNNING", "stopping"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if procs, _ := exec.Command("pgrep", "-f", "virtlet-demo").Output(); len(procs) != 0 {
		t.Errorf("the demo left processes: %s", procs)
	}
}
