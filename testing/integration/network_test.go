package integration

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/testing/contract/datasourcetest"
	"github.com/virtlet/virtlet/testing/harness"
)

// Pod networking through crictl: the daemon with the shipped CNI plugin
// (a process, from a manifest) running Debian's bridge and host-local
// CNI plugins on a test bridge; the hypervisor is the fake plugin (the
// real-VM network suites are in testing/e2e).

// Subnets 198.18.20-29.0/24 belong to these tests.

// podLeftovers lists what a pod's network may leave: its namespace, host
// links, the plugin's record.
func podLeftovers(d *harness.Daemon, tn *harness.TestNetwork, sb string) []string {
	var left []string
	if _, err := os.Stat(filepath.Join("/var/run/netns", tn.NetNS(sb))); !errors.Is(err, os.ErrNotExist) {
		left = append(left, "netns "+tn.NetNS(sb))
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, "vl") && strings.HasSuffix(name, sb[:11]) {
			left = append(left, "link "+name)
		}
	}
	if _, err := os.Stat(filepath.Join(d.StateDir, "plugins", "cni", "pods", sb+".json")); !errors.Is(err, os.ErrNotExist) {
		left = append(left, "record "+sb)
	}
	return left
}

func TestPodNetworkThroughCrictl(t *testing.T) {
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 20, DualStack: true})
	d, c := startDaemon(t, tn.Plugin(bins))
	if nr := c.Conditions(t)["NetworkReady"]; !nr.Status {
		t.Fatalf("NetworkReady false: %s: %s", nr.Reason, nr.Message)
	}
	c.Must(t, "pull", image)

	podJSON, ctrJSON := vmPod(t, d, "net-vm", nil)
	sb := c.Must(t, "runp", podJSON)
	t.Cleanup(func() { c.Run("rmp", "-f", sb) })
	st := c.PodNetwork(t, sb)
	var ip4, ip6 net.IP
	if len(st.IPs) == 2 {
		ip4, ip6 = net.ParseIP(st.IPs[0]), net.ParseIP(st.IPs[1])
	}
	_, sub4, _ := net.ParseCIDR(tn.Subnet)
	_, sub6, _ := net.ParseCIDR(tn.Subnet6)
	if ip4 == nil || !sub4.Contains(ip4) || ip6 == nil || !sub6.Contains(ip6) {
		t.Fatalf("inspectp IPs %v: want an IPv4 address in %s and an additional IPv6 one in %s", st.IPs, tn.Subnet, tn.Subnet6)
	}
	// host-local holds exactly those addresses for the pod.
	held := strings.Join(tn.Allocated(), " ")
	if !strings.Contains(held, ip4.String()) || !strings.Contains(held, ip6.String()) {
		t.Fatalf("host-local holds %q, the pod reports %s and %s", held, ip4, ip6)
	}
	if st.Info == nil {
		t.Fatal("inspectp has no network info")
	}
	ifaces := st.Info.Interfaces
	if len(ifaces) != 1 || ifaces[0].Bridge != "vlb-"+sb[:11] || ifaces[0].MAC == "" || st.Info.NetNSPath == "" {
		t.Fatalf("network info %+v", *st.Info)
	}
	if left := podLeftovers(d, tn, sb); len(left) != 4 {
		t.Fatalf("a running pod has its namespace, host links and record; found %v", left)
	}
	// The host reaches the gateway side of the pod network: the CNI bridge.
	if br, err := netlink.LinkByName(tn.Bridge); err != nil || br.Attrs().OperState == netlink.OperDown {
		t.Fatalf("CNI bridge %s: %v", tn.Bridge, err)
	}

	// The VM gets a NIC with the pod's MAC on the pod's host bridge, and
	// cloud-init network-config with the same addresses.
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	var ci struct {
		VM struct {
			NICs []struct{ Name, MAC, Bridge string } `json:"nics"`
		} `json:"vm"`
	}
	c.JSON(t, &ci, "inspect", ctr)
	if n := ci.VM.NICs; len(n) != 1 || n[0].MAC != ifaces[0].MAC || n[0].Bridge != ifaces[0].Bridge || n[0].Name != "eth0" {
		t.Fatalf("VM NICs %+v, pod interface %+v", ci.VM.NICs, ifaces)
	}
	iso, _, _ := cloudInitDisk(t, c, ctr)
	_, files := datasourcetest.ReadISO(t, iso)
	nc := string(files["network-config"])
	for _, want := range []string{"mac_address: " + ifaces[0].MAC, "address: " + ip4.String() + "/24", "gateway: " + tn.Gateway,
		"address: " + ip6.String() + "/64", "gateway: " + tn.Gateway6} {
		if !strings.Contains(nc, want) {
			t.Errorf("network-config lacks %q:\n%s", want, nc)
		}
	}

	// A daemon crash: the pod keeps its network, the record its addresses.
	d.Kill()
	d.Start()
	if again := c.PodNetwork(t, sb); len(again.IPs) == 0 || again.IPs[0] != ip4.String() {
		t.Fatalf("after a daemon restart the pod reports %v", again.IPs)
	}
	harness.Eventually(t, 10e9, "the DHCP server back for renewals", func() bool {
		return strings.Contains(d.Log(), "DHCP server back for lease renewals")
	})

	c.Must(t, "stopp", sb)
	if left := podLeftovers(d, tn, sb); len(left) != 0 {
		t.Errorf("after stopp: %v left", left)
	}
	if held := tn.Allocated(); len(held) != 0 {
		t.Errorf("after stopp host-local still holds %v", held)
	}
	if st := c.PodNetwork(t, sb); st.State != "SANDBOX_NOTREADY" || len(st.IPs) != 0 || st.Info != nil {
		t.Errorf("stopped pod %+v", st)
	}
	c.Must(t, "stopp", sb) // idempotent
	c.Must(t, "rmp", sb)
	if left := podLeftovers(d, tn, sb); len(left) != 0 {
		t.Errorf("after rmp: %v left", left)
	}
}

func TestPodNetworkBadInput(t *testing.T) {
	t.Run("no CNI config", func(t *testing.T) {
		empty := t.TempDir()
		d, c := startDaemon(t, harness.Plugin{Name: "cni", Kind: "network", Binary: filepath.Join(bins, "virtlet-plugin-cni"),
			Config: fmt.Sprintf("{confDir: %q}", empty)})
		nr := c.Conditions(t)["NetworkReady"]
		if nr.Status || nr.Reason != "NoCNIConfig" || !strings.Contains(nr.Message, "no CNI network config in "+empty) {
			t.Fatalf("NetworkReady %+v", nr)
		}
		podJSON, _ := vmPod(t, d, "no-net", nil)
		_, errOut, err := c.Run("runp", podJSON)
		if err == nil || !strings.Contains(errOut, "no CNI network config in "+empty) {
			t.Fatalf("runp without CNI config: %v %s", err, errOut)
		}
		if out := c.Must(t, "pods", "-q"); out != "" {
			t.Errorf("pods after a failed runp: %s", out)
		}
	})

	t.Run("failing CNI plugin", func(t *testing.T) {
		// host-local refuses a range outside its subnet, with its own message.
		tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 21, RangeStart: "198.18.99.5", RangeEnd: "198.18.99.9"})
		d, c := startDaemon(t, tn.Plugin(bins))
		podJSON, _ := vmPod(t, d, "bad-ipam", nil)
		_, errOut, err := c.Run("runp", podJSON)
		if err == nil || !strings.Contains(errOut, "198.18.99.5") || !strings.Contains(errOut, tn.Name) {
			t.Fatalf("runp with a failing plugin: %v\n%s", err, errOut)
		}
		if out := c.Must(t, "pods", "-q"); out != "" {
			t.Errorf("pods after a failed runp: %s", out)
		}
		assertNoPodNetworks(t, d, tn, "bad-ipam")
	})

	t.Run("IP exhaustion", func(t *testing.T) {
		tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 22, RangeStart: "198.18.22.10", RangeEnd: "198.18.22.10"})
		d, c := startDaemon(t, tn.Plugin(bins))
		first, _ := vmPod(t, d, "first", nil)
		second, _ := vmPod(t, d, "second", nil)
		sb := c.Must(t, "runp", first)
		if ips := c.PodNetwork(t, sb).IPs; len(ips) != 1 || ips[0] != "198.18.22.10" {
			t.Fatalf("first pod got %v", ips)
		}
		_, errOut, err := c.Run("runp", second)
		if err == nil || !strings.Contains(errOut, "no IP addresses available") {
			t.Fatalf("runp on a full network: %v\n%s", err, errOut)
		}
		if pods := strings.Fields(c.Must(t, "pods", "-q")); len(pods) != 1 || pods[0] != sb {
			t.Errorf("pods %v", pods)
		}
		// Freeing the address lets the second pod in.
		c.Must(t, "stopp", sb)
		c.Must(t, "rmp", sb)
		sb2 := c.Must(t, "runp", second)
		if ips := c.PodNetwork(t, sb2).IPs; len(ips) != 1 || ips[0] != "198.18.22.10" {
			t.Fatalf("second pod got %v", ips)
		}
		c.Must(t, "rmp", "-f", sb2)
		assertNoPodNetworks(t, d, tn, "first", "second")
	})
}

// assertNoPodNetworks checks that nothing of the named pods' networks
// remains (namespace, host links, plugin record), and that the CNI plugin
// keeps no record at all.
func assertNoPodNetworks(t *testing.T, d *harness.Daemon, tn *harness.TestNetwork, pods ...string) {
	t.Helper()
	for _, name := range pods {
		// vmPod's pods: namespace default, uid "uid-<name>", attempt 0.
		if left := podLeftovers(d, tn, core.SandboxID("default", name, "uid-"+name, 0)); len(left) != 0 {
			t.Errorf("pod %s left %v", name, left)
		}
	}
	recs, _ := os.ReadDir(filepath.Join(d.StateDir, "plugins", "cni", "pods"))
	for _, r := range recs {
		t.Errorf("CNI plugin record left: %s", r.Name())
	}
}
