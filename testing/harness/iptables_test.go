package harness

import (
	"fmt"
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

// The rules that name a run's tag go, in any table, and so does a chain
// of their own that they leave empty, with the jump to it; the host's
// other rules and chains stay.
func TestRemoveRulesMentioning(t *testing.T) {
	ipt := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v\n%s", args, err, out)
		}
	}
	// The run's tag and a letter no test network's index has: the
	// suites beside this one (make check runs bench-smoke beside the unit
	// tests) have rules with the run's tag, which this test must neither
	// count nor remove.
	tag := RunBridgePrefix(RunID()) + "x"
	chains := []string{"VLTEST-TOP", "VLTEST-DN"}
	// Both flushed before either goes: a chain another jumps to stays.
	defer func() {
		for _, op := range []string{"-F", "-X"} {
			for _, c := range chains {
				exec.Command("iptables", "-t", "nat", op, c).Run()
			}
		}
	}()
	for _, c := range chains {
		ipt("-t", "nat", "-N", c)
	}
	// As portmap writes them: the network's name in a quoted comment.
	comment := fmt.Sprintf(`dnat name: "virtlet-%s-7" id: "abc"`, tag)
	ipt("-t", "nat", "-A", "VLTEST-TOP", "-m", "comment", "--comment", comment, "-j", "VLTEST-DN")
	ipt("-t", "nat", "-A", "VLTEST-DN", "-p", "tcp", "-m", "comment", "--comment", comment, "-j", "RETURN")
	ipt("-t", "nat", "-A", "VLTEST-TOP", "-m", "comment", "--comment", "another run", "-j", "RETURN")
	ipt("-A", "FORWARD", "-i", tag+"7", "-j", "DROP")
	defer exec.Command("iptables", "-D", "FORWARD", "-i", tag+"7", "-j", "DROP").Run()

	rules := RulesMentioning("iptables", tag)
	if len(rules) != 3 {
		t.Fatalf("rules mentioning %s: %+v, want the two nat rules and the FORWARD one", tag, rules)
	}
	RemoveRules("iptables", rules)
	if left := RulesMentioning("iptables", tag); len(left) > 0 {
		t.Errorf("left: %+v", left)
	}
	nat, _ := exec.Command("iptables", "-t", "nat", "-S").Output()
	if strings.Contains(string(nat), "VLTEST-DN") {
		t.Errorf("the emptied chain of its own is left:\n%s", nat)
	}
	if !strings.Contains(string(nat), "-N VLTEST-TOP") || !strings.Contains(string(nat), "another run") {
		t.Errorf("the chain that keeps another rule, or that rule, is gone:\n%s", nat)
	}
	filter, _ := exec.Command("iptables", "-S", "FORWARD").Output()
	if !strings.Contains(string(filter), "-P FORWARD") {
		t.Errorf("the built-in chain is gone:\n%s", filter)
	}
}

// Rules split as iptables printed them: quoted comments whole, with their
// escapes undone, and nothing a shell would read.
func TestSplitRule(t *testing.T) {
	got := splitRule(`CNI-DN-1 -p tcp -m comment --comment "dnat name: \"net\" id: \"$(id)\" it\'s" -j RETURN`)
	want := []string{"CNI-DN-1", "-p", "tcp", "-m", "comment", "--comment", `dnat name: "net" id: "$(id)" it's`, "-j", "RETURN"}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
		t.Errorf("split %q, want %q", got, want)
	}
}
