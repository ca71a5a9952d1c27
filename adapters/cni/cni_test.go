package cni

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// These tests run the real CNI plugins of Debian's
// containernetworking-plugins (bridge + host-local) in namespaces they
// create, on a test bridge with 198.18.5.0/24 that iptables keeps off the
// machine's routes.

// runName is a name for a host link or namespace a test makes: the run's
// tag (harness.RunBridgePrefix), kind, a random number, so that
// testing/hostcheck finds it when a killed run leaves it.
func runName(kind string) string {
	var b [2]byte
	rand.Read(b[:])
	// 256..999: no index of the harness's test networks.
	n := (int(b[0])<<8 | int(b[1])) % 744
	return fmt.Sprintf("%s%s%d", harness.RunBridgePrefix(harness.RunID()), kind, 256+n)
}

func randHex(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

type testNet struct {
	n        *Network
	state    string
	ipam     string
	bridge   string
	conf     string
	extraBin string // a directory of test CNI plugins
	// netnsPrefix names the pods' network namespaces: the run's id in it.
	netnsPrefix string
}

// isolate keeps a test bridge off the machine's routes, and removes it
// after the test.
func isolate(t *testing.T, bridge string) {
	t.Helper()
	for _, dir := range []string{"-i", "-o"} {
		if out, err := exec.Command("iptables", "-I", "FORWARD", dir, bridge, "-j", "DROP").CombinedOutput(); err != nil {
			t.Fatalf("iptables: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("iptables", "-D", "FORWARD", dir, bridge, "-j", "DROP").Run() })
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func newTestNet(t *testing.T, pluginType string) *testNet {
	return newTestNetWith(t, pluginType, "")
}

// newTestNetWith chains more plugins (JSON objects) after the first.
func newTestNetWith(t *testing.T, pluginType, chained string) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the CNI tests need root (network namespaces, links)")
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Fatal("Debian's containernetworking-plugins are missing: testing/setup.sh installs them")
	}
	tn := &testNet{state: t.TempDir(), ipam: t.TempDir(), bridge: runName(""), conf: t.TempDir(), netnsPrefix: runName("n") + "-"}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "virtlet-test", "plugins": [{
	  "type": %q, "bridge": %q, "isGateway": true, "ipMasq": false,
	  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "198.18.5.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}%s]}`,
		pluginType, tn.bridge, tn.ipam, chained)
	if err := os.WriteFile(filepath.Join(tn.conf, "10-test.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	isolate(t, tn.bridge)
	tn.n = tn.start(t)
	return tn
}

func (tn *testNet) start(t *testing.T) *Network {
	t.Helper()
	n := New(quiet())
	bins := `"/usr/lib/cni"`
	if tn.extraBin != "" {
		bins = fmt.Sprintf("%q, %s", tn.extraBin, bins)
	}
	cfg := fmt.Sprintf(`{"confDir": %q, "binDirs": [%s], "teardownRetry": "200ms", "netnsPrefix": %q}`, tn.conf, bins, tn.netnsPrefix)
	if err := n.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg), StateDir: tn.state}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

func request(id string) ports.NetworkRequest {
	return ports.NetworkRequest{SandboxID: id, PodName: "vm", PodNamespace: "default", PodUID: "uid-" + id[:8],
		DNS: &ports.DNSConfig{Servers: []string{"198.18.5.53"}, Searches: []string{"default.svc.cluster.local"}}}
}

func linkExists(name string) bool { _, err := netlink.LinkByName(name); return err == nil }

// dhcpAsVM asks the pod's DHCP server for a lease the way the VM does: from
// a client namespace whose interface has the VM's MAC and joins the host
// bridge libvirt would plug the VM's tap into.
func dhcpAsVM(t *testing.T, att ports.NetworkAttachment) *nclient4.Lease {
	t.Helper()
	return dhcpAsVMOn(t, att.Interfaces[0])
}

func dhcpAsVMOn(t *testing.T, iface ports.NetworkInterface) *nclient4.Lease {
	t.Helper()
	return dhcpIn(t, vmClient(t, iface))
}

// vmClient makes a namespace standing for the VM: its interface vmnic has
// the VM's MAC and joins the host bridge libvirt would plug the VM's tap
// into. The namespace goes after the test.
func vmClient(t *testing.T, iface ports.NetworkInterface) string {
	t.Helper()
	name := runName("n")
	nsPath, err := createNetNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetNS(name) })
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	mac, _ := net.ParseMAC(iface.MAC)
	hostEnd := runName("c")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostEnd}, PeerName: "vmnic", PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	br, err := netlink.LinkByName(iface.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	return nsPath
}

// dhcpIn asks for a lease from the VM's namespace.
func dhcpIn(t *testing.T, nsPath string) *nclient4.Lease {
	t.Helper()
	var lease *nclient4.Lease
	err := inNetNS(nsPath, func() error {
		l, err := netlink.LinkByName("vmnic")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		c, err := nclient4.New("vmnic", nclient4.WithTimeout(2*time.Second))
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		lease, err = c.Request(ctx)
		return err
	})
	if err != nil {
		t.Fatalf("DHCP as the VM: %v", err)
	}
	return lease
}

// setupPod sets up a new pod's network, torn down after the test.
func setupPod(t *testing.T, tn *testNet) (string, ports.NetworkRequest, ports.NetworkAttachment) {
	t.Helper()
	id := randHex(64)
	req := request(id)
	t.Cleanup(func() { tn.n.Teardown(context.Background(), req) })
	att, err := tn.n.Setup(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return id, req, att
}

func TestSetupDHCPTeardown(t *testing.T) {
	tn := newTestNet(t, "bridge")
	ctx := context.Background()
	if r, err := tn.n.Ready(ctx); err != nil || !r.Ready {
		t.Fatalf("ready %+v %v", r, err)
	}
	id, req, att := setupPod(t, tn)
	iface := att.Interfaces[0]
	if len(iface.IPs) != 1 || !strings.HasPrefix(iface.IPs[0].Address, "198.18.5.") || iface.IPs[0].Gateway != "198.18.5.1" ||
		iface.Bridge != "vlb-"+id[:11] || iface.MAC == "" || iface.MTU == 0 {
		t.Fatalf("attachment %+v", att)
	}
	if _, err := os.Stat(att.NetNSPath); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if want := filepath.Join(NetNSDir, tn.netnsPrefix+id[:16]); att.NetNSPath != want {
		t.Errorf("netns %s, want %s (the configured prefix)", att.NetNSPath, want)
	}
	for _, l := range []string{"vlb-" + id[:11], "vlh-" + id[:11]} {
		// Each names its pod's network namespace, which traces a link a
		// killed daemon left to its pod.
		if link, err := netlink.LinkByName(l); err != nil {
			t.Errorf("host link %s missing: %v", l, err)
		} else if link.Attrs().Alias != filepath.Base(att.NetNSPath) {
			t.Errorf("host link %s has the alias %q, want its pod's network namespace %s", l, link.Attrs().Alias, filepath.Base(att.NetNSPath))
		}
	}
	// Inside the pod: eth0 lost its address and MAC to the VM.
	err := inNetNS(att.NetNSPath, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, _ := netlink.AddrList(eth, netlink.FAMILY_V4)
		if len(addrs) != 0 || eth.Attrs().HardwareAddr.String() == iface.MAC || eth.Attrs().MasterIndex == 0 {
			return fmt.Errorf("eth0 still carries the pod's address or MAC: %v %s", addrs, eth.Attrs().HardwareAddr)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	lease := dhcpAsVM(t, att)
	ip, _, _ := net.ParseCIDR(iface.IPs[0].Address)
	ack := lease.ACK
	if !ack.YourIPAddr.Equal(ip) || len(ack.Router()) != 1 || !ack.Router()[0].Equal(net.ParseIP("198.18.5.1")) ||
		ack.SubnetMask().String() != "ffffff00" || len(ack.DNS()) != 1 || !ack.DNS()[0].Equal(net.ParseIP("198.18.5.53")) ||
		ack.HostName() != "vm" {
		t.Fatalf("lease %s", ack.Summary())
	}
	if s := ack.DomainSearch(); s == nil || len(s.Labels) != 1 || s.Labels[0] != "default.svc.cluster.local" {
		t.Errorf("search list %v", s)
	}

	again, err := tn.n.Setup(ctx, req)
	if err != nil || again.Interfaces[0].IPs[0] != iface.IPs[0] {
		t.Fatalf("second Setup: %+v %v", again, err)
	}

	// A restarted plugin serves the lease again.
	tn.n.Close()
	tn.n = tn.start(t)
	if l := dhcpAsVM(t, att); !l.ACK.YourIPAddr.Equal(ip) {
		t.Fatalf("after restart: %s", l.ACK.Summary())
	}

	for i := 0; i < 2; i++ {
		if err := tn.n.Teardown(ctx, req); err != nil {
			t.Fatalf("teardown #%d: %v", i+1, err)
		}
	}
	assertGone(t, tn, id, ip)
}

func assertGone(t *testing.T, tn *testNet, id string, ip net.IP) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(NetNSDir, tn.n.nsName(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns left: %v", err)
	}
	for _, l := range []string{"vlb-" + id[:11], "vlh-" + id[:11]} {
		if linkExists(l) {
			t.Errorf("link %s left", l)
		}
	}
	if ip != nil {
		if _, err := os.Stat(filepath.Join(tn.ipam, "virtlet-test", ip.String())); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("host-local still holds %s: %v", ip, err)
		}
	}
	if _, err := os.Stat(filepath.Join(tn.state, "pods", id+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record left: %v", err)
	}
}

// A teardown whose CNI DEL fails (host-local cannot reach its data: a file
// stands where its directory was) keeps the pod's record and says so; the
// plugin retries it until DEL passes, which releases the address, without
// anybody asking again.
func TestFailedTeardownIsRetried(t *testing.T) {
	tn := newTestNet(t, "bridge")
	ctx := context.Background()
	id := randHex(64)
	att, err := tn.n.Setup(ctx, request(id))
	if err != nil {
		t.Fatal(err)
	}
	ip, _, _ := strings.Cut(att.Interfaces[0].IPs[0].Address, "/")
	lease := filepath.Join(tn.ipam, "virtlet-test", ip)
	away := tn.ipam + ".away"
	if err := os.Rename(tn.ipam, away); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(tn.ipam, []byte("not a directory"), 0o600)
	err = tn.n.Teardown(ctx, request(id))
	if err == nil || !strings.Contains(err.Error(), "CNI DEL") {
		t.Fatalf("teardown with DEL failing: %v", err)
	}
	data, _ := os.ReadFile(filepath.Join(tn.state, "pods", id+".json"))
	if !strings.Contains(string(data), `"teardownFailed":true`) {
		t.Fatalf("the record does not keep the failed teardown: %s", data)
	}
	os.Remove(tn.ipam)
	if err := os.Rename(away, tn.ipam); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, recErr := os.Stat(filepath.Join(tn.state, "pods", id+".json"))
		_, leaseErr := os.Stat(lease)
		if errors.Is(recErr, os.ErrNotExist) && errors.Is(leaseErr, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the teardown was not retried: record %v, lease of %s %v", recErr, ip, leaseErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(NetNSDir, tn.n.nsName(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's namespace outlives the retried teardown: %v", err)
	}
}

func TestFailingPluginLeavesNothing(t *testing.T) {
	tn := newTestNet(t, "no-such-cni-plugin")
	id := randHex(64)
	_, err := tn.n.Setup(context.Background(), request(id))
	if err == nil || !strings.Contains(err.Error(), "no-such-cni-plugin") || !strings.Contains(err.Error(), "virtlet-test") {
		t.Fatalf("err %v", err)
	}
	assertGone(t, tn, id, nil)
}

func TestNoConfigIsNotReady(t *testing.T) {
	n := New(quiet())
	cfg := fmt.Sprintf(`{"confDir": %q}`, t.TempDir())
	if err := n.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg), StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	r, err := n.Ready(context.Background())
	if err != nil || r.Ready || r.Reason != "NoCNIConfig" || !strings.Contains(r.Message, "no CNI network config") {
		t.Fatalf("ready %+v %v", r, err)
	}
	_, err = n.Setup(context.Background(), request(randHex(64)))
	if !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("setup without config: %v", err)
	}
}

// hostPort mappings reach a chained portmap plugin (the portMappings
// capability), which DNATs the host port to the pod's address; teardown
// removes its rules.
func TestPortMappingsReachPortmap(t *testing.T) {
	tn := newTestNetWith(t, "bridge", `, {"type": "portmap", "capabilities": {"portMappings": true}}`)
	ctx := context.Background()
	req := request(randHex(64))
	req.PortMappings = []ports.PortMapping{{Protocol: "TCP", ContainerPort: 22, HostPort: 32022, HostIP: "127.0.0.1"},
		{Protocol: "UDP", ContainerPort: 53}} // no host port: not mapped
	t.Cleanup(func() { tn.n.Teardown(ctx, req) })
	att, err := tn.n.Setup(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ip, _, _ := net.ParseCIDR(att.Interfaces[0].IPs[0].Address)
	nat := func() string {
		out, _ := exec.Command("iptables-save", "-t", "nat").Output()
		return string(out)
	}
	rules := nat()
	if !strings.Contains(rules, "--dport 32022") || !strings.Contains(rules, "--to-destination "+ip.String()+":22") {
		t.Fatalf("no DNAT of host port 32022 to %s:22:\n%s", ip, rules)
	}
	if strings.Contains(rules, "--dport 53 ") || strings.Contains(rules, "--dports 53 ") || strings.Contains(rules, ":53\n") {
		t.Errorf("a container port without a host port was mapped:\n%s", rules)
	}
	if err := tn.n.Teardown(ctx, req); err != nil {
		t.Fatal(err)
	}
	if rules := nat(); strings.Contains(rules, "--dport 32022") {
		t.Errorf("DNAT rule left after teardown:\n%s", rules)
	}
}

// A meta plugin (testing/cnimulti) gives the pod two interfaces on two
// networks: each gets its links, its own host bridge, a DHCP server
// answering its MAC with its address (the gateway and routes only on the
// first), and teardown removes all of it. So it goes whether the result
// describes eth0 alone, as Multus's does (net1 is read from the pod's
// namespace), or both interfaces, as CNI-Genie's merged one did.
func TestSeveralPodInterfaces(t *testing.T) {
	for _, shape := range []struct {
		name  string
		merge bool
	}{{"multus result", false}, {"merged result", true}} {
		t.Run(shape.name, func(t *testing.T) { testSeveralPodInterfaces(t, shape.merge) })
	}
}

func testSeveralPodInterfaces(t *testing.T, merge bool) {
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "virtlet-test-cni-multi"), "github.com/virtlet/virtlet/testing/cnimulti").CombinedOutput(); err != nil {
		t.Fatalf("build the meta plugin: %v\n%s", err, out)
	}
	tn := &testNet{state: t.TempDir(), ipam: t.TempDir(), bridge: runName(""), conf: t.TempDir(), extraBin: bin, netnsPrefix: runName("n") + "-"}
	second := runName("")
	isolate(t, tn.bridge)
	isolate(t, second)
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "virtlet-multi", "type": "virtlet-test-cni-multi", "mergeResults": %t, "delegates": [
	  {"type": "bridge", "bridge": %q, "isGateway": true, "ipam": {"type": "host-local", "dataDir": %q,
	   "ranges": [[{"subnet": "198.18.5.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
	  {"type": "bridge", "bridge": %q, "isGateway": true, "ipam": {"type": "host-local", "dataDir": %q,
	   "ranges": [[{"subnet": "198.18.6.0/24"}]], "routes": [{"dst": "198.19.128.0/17", "gw": "198.18.6.1"}]}}]}`, merge, tn.bridge, tn.ipam, second, tn.ipam)
	if err := os.WriteFile(filepath.Join(tn.conf, "10-multi.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	tn.n = tn.start(t)
	ctx := context.Background()
	id, req, att := setupPod(t, tn)
	if len(att.Interfaces) != 2 {
		t.Fatalf("attachment %+v: want two interfaces", att)
	}
	eth0, net1 := att.Interfaces[0], att.Interfaces[1]
	if eth0.Name != "eth0" || net1.Name != "net1" || eth0.Bridge != "vlb-"+id[:11] || net1.Bridge != "vlb1"+id[:11] ||
		len(eth0.IPs) != 1 || len(net1.IPs) != 1 || !strings.HasPrefix(eth0.IPs[0].Address, "198.18.5.") ||
		!strings.HasPrefix(net1.IPs[0].Address, "198.18.6.") || eth0.MAC == net1.MAC {
		t.Fatalf("interfaces %+v", att.Interfaces)
	}
	// A route without a gateway in the CNI result goes through the first
	// interface's gateway of its family.
	if len(att.Routes) != 2 || att.Routes[0] != (ports.Route{Destination: "0.0.0.0/0", Gateway: "198.18.5.1"}) ||
		att.Routes[1] != (ports.Route{Destination: "198.19.128.0/17", Gateway: "198.18.6.1"}) {
		t.Errorf("routes %+v", att.Routes)
	}
	l0 := dhcpAsVMOn(t, eth0)
	l1 := dhcpAsVMOn(t, net1)
	ip0, _, _ := net.ParseCIDR(eth0.IPs[0].Address)
	ip1, _, _ := net.ParseCIDR(net1.IPs[0].Address)
	if !l0.ACK.YourIPAddr.Equal(ip0) || len(l0.ACK.Router()) != 1 {
		t.Errorf("eth0 lease %s", l0.ACK.Summary())
	}
	if !l1.ACK.YourIPAddr.Equal(ip1) || len(l1.ACK.Router()) != 0 || !l1.ACK.ServerIdentifier().Equal(net.ParseIP("198.18.6.1")) {
		t.Errorf("net1 lease %s: want its address, no router, its gateway as server", l1.ACK.Summary())
	}
	// Each lease carries the routes its subnet reaches: net1 the route via
	// its gateway, eth0 the default route only.
	if r := l1.ACK.ClasslessStaticRoute(); len(r) != 1 || r[0].Dest.String() != "198.19.128.0/17" || !r[0].Router.Equal(net.ParseIP("198.18.6.1")) {
		t.Errorf("net1 routes %v", r)
	}
	if r := l0.ACK.ClasslessStaticRoute(); len(r) != 1 || r[0].Dest.String() != "0.0.0.0/0" {
		t.Errorf("eth0 routes %v", r)
	}
	if _, err := os.Stat(filepath.Join(tn.ipam, "virtlet-multi-1", ip1.String())); err != nil {
		t.Fatalf("host-local holds no %s for net1: %v", ip1, err)
	}
	if err := tn.n.Teardown(ctx, req); err != nil {
		t.Fatal(err)
	}
	assertGone(t, tn, id, nil)
	for _, l := range []string{"vlb1" + id[:11], "vlh1" + id[:11]} {
		if linkExists(l) {
			t.Errorf("link %s left", l)
		}
	}
	for network, ip := range map[string]net.IP{"virtlet-multi-0": ip0, "virtlet-multi-1": ip1} {
		if _, err := os.Stat(filepath.Join(tn.ipam, network, ip.String())); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("host-local still holds %s in %s: %v", ip, network, err)
		}
	}
}

// TestMain leaves the host's firewall as it found it: the plugin installs
// its host-bridge rules for good, the tests must not.
func TestMain(m *testing.M) {
	before := HostBridgeRuleState()
	code := m.Run()
	RestoreHostBridgeRules(before)
	os.Exit(code)
}

// A pod record that cannot be read back is set aside at start-up, with an
// error naming the file (never its content), and the plugin starts.
func TestUnreadableRecordIsQuarantined(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "pods")
	os.MkdirAll(dir, 0o700)
	bad := filepath.Join(dir, randHex(64)+".json")
	os.WriteFile(bad, []byte(`{"sandboxID": "x", "podName": "secret-pod`), 0o600)
	log, hook := test.NewNullLogger()
	n := New(log)
	cfg := fmt.Sprintf(`{"confDir": %q}`, t.TempDir())
	if err := n.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg), StateDir: state}); err != nil {
		t.Fatal(err)
	}
	aside, _ := filepath.Glob(bad + atomicfile.QuarantineMarker + "*")
	if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) || len(aside) != 1 {
		t.Fatalf("record still there (%v) or not set aside (%v)", err, aside)
	}
	logged := false
	for _, e := range hook.AllEntries() {
		if text, _ := e.String(); strings.Contains(text, "secret-pod") {
			t.Errorf("the log quotes the record: %s", text)
		}
		logged = logged || e.Level == logrus.ErrorLevel && e.Data["path"] == bad && e.Data["quarantinedAs"] == aside[0]
	}
	if !logged {
		t.Fatal("no error-level entry naming the record and where it went")
	}
}

// A network namespace whose creation the plugin's death cut short (the
// file made, never bind-mounted) is removed like any other: the pod's
// next RunPodSandbox no longer fails on it (found by the plugin chaos
// suite).
func TestDeleteAHalfMadeNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	name := fmt.Sprintf("virtlet-test-half-%d", os.Getpid())
	path := filepath.Join(NetNSDir, name)
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	if err := deleteNetNS(name); err != nil {
		t.Fatalf("delete a half-made namespace: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the half-made namespace's file is still there: %v", err)
	}
}

// A pod set up under another netnsPrefix (a record of before an upgrade
// that changed it) is torn down by the name its record holds; a prefix
// that is no file name's start is refused, naming the key.
func TestNetNSPrefix(t *testing.T) {
	tn := newTestNet(t, "bridge")
	id, req, att := setupPod(t, tn)
	tn.n.Close()
	tn.netnsPrefix = runName("m") + "-"
	tn.n = tn.start(t)
	if err := tn.n.Teardown(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(att.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the namespace made under the old prefix is left: %v", err)
	}
	assertGone(t, tn, id, nil)

	for _, bad := range []string{"", "../x", "a/b", "UPPER", "-dash", strings.Repeat("a", 41)} {
		n := New(quiet())
		cfg := fmt.Sprintf(`{"confDir": %q, "netnsPrefix": %q}`, tn.conf, bad)
		err := n.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg), StateDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "netnsPrefix") || !errors.Is(err, ports.ErrInvalidArgument) {
			t.Errorf("netnsPrefix %q: %v", bad, err)
		}
		n.Close()
	}
}

// A pod Calico sets up (its address a /32, its default route through the
// link-local 169.254.1.1 on-link, neither in the CNI result) gets a working
// default route: the attachment and the DHCP lease name 169.254.1.1,
// reached on the link, and a client that configures itself from the lease
// as DHCP clients do reaches the host through the proxy ARP of Calico's
// host end.
func TestCalicoStyleAddress(t *testing.T) {
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "virtlet-test-cni-calico"), "github.com/virtlet/virtlet/testing/cnicalico").CombinedOutput(); err != nil {
		t.Fatalf("build the Calico-style plugin: %v\n%s", err, out)
	}
	prefix := harness.RunBridgePrefix(harness.RunID())
	tn := &testNet{state: t.TempDir(), ipam: t.TempDir(), bridge: runName(""), conf: t.TempDir(), extraBin: bin, netnsPrefix: runName("n") + "-"}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "calico", "type": "virtlet-test-cni-calico", "subnet": "198.18.7.0/24", "hostPrefix": %q}`, prefix)
	if err := os.WriteFile(filepath.Join(tn.conf, "10-calico.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	tn.n = tn.start(t)
	// What the host routes elsewhere, as a node routes 169.254.1.1 by its
	// default route (proxy ARP answers for what the host routes through
	// another link), and an address of the host for the VM to reach.
	elsewhere := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: runName("d")}} // a link of its own (no dummy module here)
	if err := netlink.LinkAdd(elsewhere); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(elsewhere) })
	hostIP := net.IPv4(198, 18, 7, 254)
	if err := netlink.AddrAdd(elsewhere, &netlink.Addr{IPNet: &net.IPNet{IP: hostIP, Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: elsewhere.Attrs().Index, Dst: &net.IPNet{IP: CalicoGateway, Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}

	_, _, att := setupPod(t, tn)
	eth0 := att.Interfaces[0]
	if len(eth0.IPs) != 1 || !strings.HasSuffix(eth0.IPs[0].Address, "/32") || eth0.IPs[0].Gateway != "169.254.1.1" {
		t.Fatalf("addresses %+v: want a /32 with gateway 169.254.1.1", eth0.IPs)
	}
	if len(att.Routes) != 1 || att.Routes[0] != (ports.Route{Destination: "0.0.0.0/0", Gateway: "169.254.1.1"}) {
		t.Fatalf("routes %+v: want the default route through 169.254.1.1", att.Routes)
	}
	nsPath := vmClient(t, eth0)
	lease := dhcpIn(t, nsPath)
	ip, _, _ := net.ParseCIDR(eth0.IPs[0].Address)
	ack := lease.ACK
	if !ack.YourIPAddr.Equal(ip) || net.IP(ack.SubnetMask()).String() != "255.255.255.255" || len(ack.Router()) != 1 || !ack.Router()[0].Equal(CalicoGateway) {
		t.Fatalf("lease %s: want %s/32 with router 169.254.1.1", ack.Summary(), ip)
	}
	routes := ack.ClasslessStaticRoute()
	if len(routes) != 2 || routes[0].Dest.String() != "169.254.1.1/32" || !routes[0].Router.Equal(net.IPv4zero) ||
		routes[1].Dest.String() != "0.0.0.0/0" || !routes[1].Router.Equal(CalicoGateway) {
		t.Fatalf("classless routes %v: want 169.254.1.1/32 on the link, then the default route through it", routes)
	}
	// As a DHCP client applies the lease (dhclient's /32 rule, RFC 3442's
	// routes with router 0.0.0.0 on the link).
	for _, args := range [][]string{
		{"ip", "link", "set", "vmnic", "up"},
		{"ip", "addr", "add", ip.String() + "/32", "dev", "vmnic"},
		{"ip", "route", "add", "169.254.1.1/32", "dev", "vmnic"},
		{"ip", "route", "add", "default", "via", "169.254.1.1", "dev", "vmnic"},
		{"ping", "-c", "1", "-W", "5", hostIP.String()},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + nsPath}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("in the VM's namespace, %v: %v\n%s", args, err, out)
		}
	}
}

// A pod interface that is an SR-IOV virtual function (its PCI device has a
// physfn link) is refused by name; a physical function or a veth is not
// one.
func TestSRIOVVirtualFunctionsAreRefused(t *testing.T) {
	root := t.TempDir()
	defer func(d string) { pciDevices = d }(pciDevices)
	pciDevices = root
	os.MkdirAll(filepath.Join(root, "0000:03:00.0"), 0o755)
	os.MkdirAll(filepath.Join(root, "0000:03:02.1"), 0o755)
	os.Symlink("../0000:03:00.0", filepath.Join(root, "0000:03:02.1", "physfn"))
	if vfAt("0000:03:02.1") != "0000:03:02.1" || vfAt("0000:03:00.0") != "" || vfAt("../0000:03:02.1") != "" || vfAt("..") != "" {
		t.Error("vfAt")
	}
	err := errSRIOV("net1", "0000:03:02.1")
	if !errors.Is(err, ports.ErrUnimplemented) || !strings.Contains(err.Error(), "pod interface net1 is the SR-IOV virtual function 0000:03:02.1") ||
		!strings.Contains(err.Error(), `ARCHITECTURE.md, "SR-IOV"`) {
		t.Errorf("error %v", err)
	}
	// A veth reports no PCI bus: no VF.
	name := runName("n")
	nsPath, err := createNetNS(name)
	if err != nil {
		t.Fatal(err)
	}
	defer deleteNetNS(name)
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: runName("c")}, PeerName: "podnic", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(veth)
	if vf, err := sriovVF(nsPath, "podnic"); vf != "" || err != nil {
		t.Errorf("a veth: VF %q, %v", vf, err)
	}
}
