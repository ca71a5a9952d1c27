package cni

import (
	"fmt"
	"os/exec"
	"strings"
)

// HostBridgePattern matches every host bridge the plugin makes (iptables'
// interface wildcard).
const HostBridgePattern = "vlb+"

// hostBridgeRules keep the host's netfilter out of the VM's hop through
// its host bridge. Nodes run br_netfilter (kube-proxy needs it), so frames
// bridged between the VM's tap and the veth into the pod would pass the
// host's iptables twice: once on the host bridge, once on the pod
// network's bridge. On the first pass kube-proxy would rewrite a Service
// address before the packet has even reached the pod's namespace, and a
// FORWARD policy of DROP would drop it. The frame is only crossing a
// cable there: no connection tracking, and forwarded as is.
var hostBridgeRules = [][]string{
	{"-t", "raw", "PREROUTING", "-i", HostBridgePattern, "-j", "NOTRACK", "-m", "comment", "--comment", "virtlet: VM to pod namespace, not routed here"},
	{"-t", "filter", "FORWARD", "-i", HostBridgePattern, "-o", HostBridgePattern, "-j", "ACCEPT", "-m", "comment", "--comment", "virtlet: VM to pod namespace, bridged"},
}

// EnsureHostBridgeRules inserts the rules for IPv4 and IPv6 unless they are
// there. A host without ip6tables (or without IPv6) gets the IPv4 rules.
func EnsureHostBridgeRules() error {
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			if tool == "iptables" {
				return fmt.Errorf("iptables is needed for the VMs' host bridges: %w", err)
			}
			continue
		}
		for _, r := range hostBridgeRules {
			table, chain, spec := r[:2], r[2], r[3:]
			check := append(append(append([]string{}, table...), "-C", chain), spec...)
			if exec.Command(tool, check...).Run() == nil {
				continue
			}
			insert := append(append(append([]string{}, table...), "-I", chain), spec...)
			if out, err := exec.Command(tool, insert...).CombinedOutput(); err != nil {
				if tool == "ip6tables" {
					continue // no IPv6 netfilter on this host
				}
				return fmt.Errorf("%s %s: %v: %s", tool, strings.Join(insert, " "), err, strings.TrimSpace(string(out)))
			}
		}
	}
	return nil
}

// HostBridgeRuleState reports, per tool, whether each of the rules is
// installed: with RestoreHostBridgeRules, tests (and an uninstall) leave
// the host's firewall as they found it.
func HostBridgeRuleState() map[string][]bool {
	state := map[string][]bool{}
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		for _, r := range hostBridgeRules {
			table, chain, spec := r[:2], r[2], r[3:]
			check := append(append(append([]string{}, table...), "-C", chain), spec...)
			state[tool] = append(state[tool], exec.Command(tool, check...).Run() == nil)
		}
	}
	return state
}

// RestoreHostBridgeRules deletes every copy of the rules that were not
// installed in before (HostBridgeRuleState's answer).
func RestoreHostBridgeRules(before map[string][]bool) {
	for tool, was := range before {
		for i, r := range hostBridgeRules {
			if was[i] {
				continue
			}
			table, chain, spec := r[:2], r[2], r[3:]
			del := append(append(append([]string{}, table...), "-D", chain), spec...)
			for n := 0; n < 100 && exec.Command(tool, del...).Run() == nil; n++ {
			}
		}
	}
}
