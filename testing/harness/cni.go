package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// CNIBinDir is where Debian's containernetworking-plugins live.
const CNIBinDir = "/usr/lib/cni"

// TestNetwork is a pod network for tests: a CNI config for Debian's bridge
// and host-local plugins on a bridge of its own, with addresses from
// 198.18.0.0/15 (and fd00:198:18::/48 when dual-stack), kept off the
// machine's routes by iptables: nothing is forwarded between the bridge
// and any other interface, while traffic within the bridge (pod to pod)
// and to the host (the gateway) flows.
type TestNetwork struct {
	Name     string // CNI network name
	Bridge   string // the CNI bridge on the host (the pods' gateway)
	ConfDir  string // holds the conflist
	IPAMDir  string // host-local's allocations
	Subnet   string // IPv4 subnet, e.g. 198.18.16.0/24
	Gateway  string // IPv4 gateway: the bridge's address
	Subnet6  string // IPv6 subnet when dual-stack
	Gateway6 string
	// NetNSPrefix begins the names of its pods' network namespaces (the
	// CNI plugin's netnsPrefix): the run's id and the network's index.
	NetNSPrefix string
}

// NetNS is the name of the network namespace of pod sandbox sb.
func (tn *TestNetwork) NetNS(sb string) string { return tn.NetNSPrefix + sb[:16] }

// NetworkOptions shape a test network.
type NetworkOptions struct {
	// Index picks the subnet: 198.18.<Index>.0/24 (1–255); each concurrent
	// test network needs its own.
	Index int
	// DualStack adds fd00:198:18:<Index>::/64.
	DualStack bool
	// RangeStart and RangeEnd narrow the IPv4 pool (IP exhaustion tests).
	RangeStart, RangeEnd string
	// PluginType replaces "bridge" (e.g. a missing plugin).
	PluginType string
	// Portmap chains Debian's portmap plugin (hostPort DNAT, from
	// 127.0.0.1 too); its iptables chains are removed after the test.
	Portmap bool
}

// NewTestNetwork writes the CNI config and sets up the iptables rules; the
// bridge itself is made by the CNI bridge plugin on the first pod, and
// everything is removed after the test.
func NewTestNetwork(t testing.TB, o NetworkOptions) *TestNetwork {
	t.Helper()
	if o.Index < 1 || o.Index > 255 {
		t.Fatalf("test network index %d out of 1..255", o.Index)
	}
	if _, err := os.Stat(filepath.Join(CNIBinDir, "bridge")); err != nil {
		t.Fatalf("Debian's containernetworking-plugins are missing (testing/setup.sh installs them): %v", err)
	}
	// The run's id in both names (RunEnv): "vt" + 6 + up to 3 digits, in
	// a bridge name's 15 bytes.
	tn := &TestNetwork{
		Name:    fmt.Sprintf("virtlet-%s-%d", RunBridgePrefix(RunID()), o.Index),
		Bridge:  fmt.Sprintf("%s%d", RunBridgePrefix(RunID()), o.Index),
		ConfDir: t.TempDir(), IPAMDir: t.TempDir(),
		Subnet:  fmt.Sprintf("198.18.%d.0/24", o.Index),
		Gateway: fmt.Sprintf("198.18.%d.1", o.Index),
		// Named as the run's links are, then n<index>- (hostcheck).
		NetNSPrefix: fmt.Sprintf("%sn%d-", RunBridgePrefix(RunID()), o.Index),
	}
	// A bridge left by a crashed run would hold the same subnet.
	exec.Command("ip", "link", "del", tn.Bridge).Run()
	rng := map[string]string{"subnet": tn.Subnet, "gateway": tn.Gateway}
	if o.RangeStart != "" {
		rng["rangeStart"], rng["rangeEnd"] = o.RangeStart, o.RangeEnd
	}
	ranges := []string{jsonObj(rng)}
	routes := []string{`{"dst": "0.0.0.0/0"}`}
	if o.DualStack {
		tn.Subnet6 = fmt.Sprintf("fd00:198:18:%x::/64", o.Index)
		tn.Gateway6 = fmt.Sprintf("fd00:198:18:%x::1", o.Index)
		ranges = append(ranges, jsonObj(map[string]string{"subnet": tn.Subnet6, "gateway": tn.Gateway6}))
		routes = append(routes, `{"dst": "::/0"}`)
	}
	typ := o.PluginType
	if typ == "" {
		typ = "bridge"
	}
	var rangeSets []string
	for _, r := range ranges {
		rangeSets = append(rangeSets, "["+r+"]")
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": %q, "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": false,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [%s], "routes": [%s]}
  }%s]
}
`, tn.Name, typ, tn.Bridge, tn.IPAMDir, strings.Join(rangeSets, ", "), strings.Join(routes, ", "), portmap(t, o.Portmap))
	if err := os.WriteFile(filepath.Join(tn.ConfDir, "10-"+tn.Name+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing routed between the test bridge and the rest of the machine.
	rules := [][]string{
		{"FORWARD", "-i", tn.Bridge, "!", "-o", tn.Bridge, "-j", "DROP"},
		{"FORWARD", "-o", tn.Bridge, "!", "-i", tn.Bridge, "-j", "DROP"},
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, r := range rules {
			if out, err := exec.Command(ipt, append([]string{"-I"}, r...)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", ipt, err, out)
			}
			t.Cleanup(func() { exec.Command(ipt, append([]string{"-D"}, r...)...).Run() })
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", tn.Bridge).Run() })
	return tn
}

// portmap is the conflist's portmap entry when on; the chains it makes
// (CNI-HOSTPORT-*, CNI-DN-*), and the host did not have, go after the test.
func portmap(t testing.TB, on bool) string {
	if !on {
		return ""
	}
	if _, err := os.Stat(filepath.Join(CNIBinDir, "portmap")); err != nil {
		t.Fatalf("Debian's containernetworking-plugins lack portmap: %v", err)
	}
	RemoveNewChains(t, "CNI-")
	return `, {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}`
}

func jsonObj(m map[string]string) string {
	var parts []string
	for _, k := range []string{"subnet", "gateway", "rangeStart", "rangeEnd"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%q: %q", k, v))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Plugin is the manifest of the shipped CNI network plugin (built into
// dir) using this network.
func (tn *TestNetwork) Plugin(dir string) Plugin {
	return Plugin{Name: "cni", Kind: "network", Binary: filepath.Join(dir, "virtlet-plugin-cni"),
		Config: fmt.Sprintf("{confDir: %q, binDirs: [%q], netnsPrefix: %q}", tn.ConfDir, CNIBinDir, tn.NetNSPrefix)}
}

// Allocated lists the addresses host-local holds for the network.
func (tn *TestNetwork) Allocated() []string { return tn.AllocatedAs(tn.Name) }

// AllocatedAs lists the addresses host-local holds in the pool of this
// network's IPAM directory that a CNI network named name uses (a meta
// plugin names its delegates).
func (tn *TestNetwork) AllocatedAs(name string) []string {
	entries, _ := os.ReadDir(filepath.Join(tn.IPAMDir, name))
	var out []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// PodNetwork is what `crictl inspectp` tells of a pod's network.
type PodNetwork struct {
	State string
	IPs   []string // primary first
	// Info is the verbose network info (nil once the pod is stopped).
	Info *struct {
		NetNSPath  string
		Interfaces []struct {
			Name, MAC, Bridge string
			MTU               int
		}
	}
}

// PodNetwork inspects a pod's network with crictl.
func (c *Crictl) PodNetwork(t testing.TB, sandbox string) PodNetwork {
	t.Helper()
	var raw struct {
		Status struct {
			State   string `json:"state"`
			Network struct {
				IP            string `json:"ip"`
				AdditionalIPs []struct {
					IP string `json:"ip"`
				} `json:"additionalIps"`
			} `json:"network"`
		} `json:"status"`
		// crictl merges the verbose info into the top level (a null value
		// becomes the string "null").
		Network json.RawMessage `json:"network"`
	}
	c.JSON(t, &raw, "inspectp", sandbox)
	pn := PodNetwork{State: raw.Status.State}
	if ip := raw.Status.Network.IP; ip != "" {
		pn.IPs = append(pn.IPs, ip)
	}
	for _, a := range raw.Status.Network.AdditionalIPs {
		pn.IPs = append(pn.IPs, a.IP)
	}
	if len(raw.Network) > 0 && raw.Network[0] == '{' {
		if err := json.Unmarshal(raw.Network, &pn.Info); err != nil {
			t.Fatalf("inspectp %s: network info: %v", sandbox, err)
		}
	}
	return pn
}

// Condition is one of the runtime's conditions in `crictl info`.
type Condition struct {
	Status          bool
	Reason, Message string
}

// Conditions reads the runtime's conditions with crictl info, by type.
func (c *Crictl) Conditions(t testing.TB) map[string]Condition {
	t.Helper()
	var info struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	c.JSON(t, &info, "info")
	out := map[string]Condition{}
	for _, cond := range info.Status.Conditions {
		out[cond.Type] = Condition{Status: cond.Status, Reason: cond.Reason, Message: cond.Message}
	}
	return out
}
