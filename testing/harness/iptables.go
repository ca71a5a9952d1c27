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
		before := ChainsWithPrefix(ipt, prefix)
		t.Cleanup(func() {
			for table, names := range ChainsWithPrefix(ipt, prefix) {
				var made []string
				for _, n := range names {
					if !slices.Contains(before[table], n) {
						made = append(made, n)
					}
				}
				RemoveChains(ipt, table, made)
			}
		})
	}
}

// chainsWithPrefix lists, by table, the chains whose names start with
// prefix.
func ChainsWithPrefix(ipt, prefix string) map[string][]string {
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
func RemoveChains(ipt, table string, chains []string) {
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
				exec.Command(ipt, append([]string{"-t", table, "-D"}, splitRule(rest)...)...).Run()
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

// TaggedRule is a rule of an iptables table whose text holds a tag: a
// run's bridge prefix, in an interface name or in the comment that CNI
// plugins (portmap) write with the network's name.
type TaggedRule struct {
	Table, Chain string
	// Spec is the rule as -S prints it, after "-A ".
	Spec string
}

// RulesMentioning lists the rules of ipt (iptables or ip6tables), in every
// table, whose text holds tag.
func RulesMentioning(ipt, tag string) []TaggedRule {
	var rules []TaggedRule
	for _, table := range iptablesTables {
		b, err := exec.Command(ipt, "-t", table, "-S").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			rest, ok := strings.CutPrefix(line, "-A ")
			if !ok || !strings.Contains(rest, tag) {
				continue
			}
			chain, _, _ := strings.Cut(rest, " ")
			rules = append(rules, TaggedRule{Table: table, Chain: chain, Spec: rest})
		}
	}
	return rules
}

// RemoveRules deletes rules of ipt, then every chain of its own that held
// one of them and is left empty (portmap's per-container CNI-DN-*), with
// the rules that jump to it.
func RemoveRules(ipt string, rules []TaggedRule) {
	held := map[string][]string{}
	for _, r := range rules {
		exec.Command(ipt, append([]string{"-t", r.Table, "-D"}, splitRule(r.Spec)...)...).Run()
		if !slices.Contains(held[r.Table], r.Chain) {
			held[r.Table] = append(held[r.Table], r.Chain)
		}
	}
	for table, chains := range held {
		var empty []string
		for _, c := range chains {
			b, err := exec.Command(ipt, "-t", table, "-S", c).Output()
			// A chain of its own lists as "-N c" alone once empty; a
			// built-in one as its policy.
			if err == nil && strings.TrimSpace(string(b)) == "-N "+c {
				empty = append(empty, c)
			}
		}
		RemoveChains(ipt, table, empty)
	}
}

// splitRule splits a rule as iptables -S prints it into arguments: words,
// and double-quoted strings (comments) in which a backslash escapes the
// next character. No shell sees it: a comment's $ or backquote is text.
func splitRule(rule string) []string {
	var args []string
	var cur strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, c := range rule {
		switch {
		case escaped:
			cur.WriteRune(c)
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted, inWord = !quoted, true
		case c == ' ' && !quoted:
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(c)
			inWord = true
		}
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args
}
