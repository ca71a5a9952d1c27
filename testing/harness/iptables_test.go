package harness

import (
	"os/exec"
	"strings"
	"testing"
)

// Chains a test's programs make go after it, with the rules that jump to
// them (quoted comments and all); chains the host had stay.
func TestRemoveNewChains(t *testing.T) {
	ipt := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v\n%s", args, err, out)
		}
	}
	ipt("-N", "VLTEST-KEEP")
	defer func() { exec.Command("iptables", "-X", "VLTEST-KEEP").Run() }()
	t.Run("a test that makes chains", func(t *testing.T) {
		RemoveNewChains(t, "VLTEST-")
		ipt("-N", "VLTEST-MADE")
		ipt("-A", "VLTEST-KEEP", "-j", "VLTEST-MADE")
		// An interface that does not exist: no traffic is touched.
		ipt("-A", "FORWARD", "-i", "vltest-none", "-m", "comment", "--comment", "made by a test", "-j", "VLTEST-MADE")
	})
	out, err := exec.Command("iptables", "-S").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "VLTEST-MADE") {
		t.Errorf("the test's chain or a jump to it is left:\n%s", out)
	}
	if !strings.Contains(string(out), "-N VLTEST-KEEP") {
		t.Errorf("the chain the host had is gone:\n%s", out)
	}
}
