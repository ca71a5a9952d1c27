package harness

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// iptablesTables are the tables whose chains RemoveNewChains looks at.
var iptablesTables = []string{"filter", "nat", "mangle", "raw"}

// RemoveNewChains arranges that the iptables and ip6tables chains whose
// names start with prefix, made during the test by the programs it runs
// (kubelet's and kube-proxy's KUBE-*, portmap's CNI-*) and absent before
// it, go when it ends, with the rules that jump to them. Chains the host
// had before are left alone.
func RemoveNewChains(t testing.TB, prefix string) {
	t.Helper()
	for _, ipt := range []string{"iptables", "ip6tables"} {
		before := chainsWithPrefix(ipt, prefix)
		t.Cleanup(func() {
			for table, names := range chainsWithPrefix(ipt, prefix) {
				var made []string
				for _, n := range names {
					if !slices.Contains(before[table], n) {
						made = append(made, n)
					}
				}
				removeChains(ipt, table, made)
			}
		})
	}
}

// chainsWithPrefix lists, by table, the chains whose names start with
// prefix.
func chainsWithPrefix(ipt, prefix string) map[string][]string {
	out := map[string][]string{}
	for _, table := range iptablesTables {
		b, err := exec.Command(ipt, "-t", table, "-S").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "-N "); ok && strings.HasPrefix(name, prefix) {
				out[table] = append(out[table], name)
			}
		}
	}
	return out
}

// removeChains deletes the rules of table that jump to chains, then the
// chains.
func removeChains(ipt, table string, chains []string) {
	if len(chains) == 0 {
		return
	}
	b, _ := exec.Command(ipt, "-t", table, "-S").Output()
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		for _, c := range chains {
			if regexp.MustCompile(`-j ` + regexp.QuoteMeta(c) + `( |$)`).MatchString(rest) {
				// The shell keeps -S's quoted comments together.
				exec.Command("sh", "-c", ipt+" -t "+table+" -D "+rest).Run()
				break
			}
		}
	}
	for _, c := range chains {
		exec.Command(ipt, "-t", table, "-F", c).Run()
	}
	for _, c := range chains {
		exec.Command(ipt, "-t", table, "-X", c).Run()
	}
}
