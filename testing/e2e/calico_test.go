package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// A VM on a Calico-style network (Virtlet's calicoSubnetSize case): the
// pod's address is a /32 whose default route goes through the link-local
// 169.254.1.1 on the link, and neither is in the CNI result
// (testing/cnicalico sets the pod up as Calico does, the host answering
// ARP for the gateway). The guest's DHCP client takes the /32, the on-link
// route to 169.254.1.1 and the default route through it from the lease's
// classless routes and reaches an address of the host through its
// gateway; the host reaches the VM.
func TestVMOnCalicoStyleNetwork(t *testing.T) {
	parallel(t)
	calicoBin := buildCNIPlugin(t, "virtlet-test-cni-calico", "github.com/virtlet/virtlet/testing/cnicalico")
	prefix := harness.RunBridgePrefix(harness.RunID())
	// What the host routes elsewhere, as a Calico node routes 169.254.1.1
	// (its proxy ARP answers for what it routes through another link),
	// and an address of the host for the VM to reach: a bridge without
	// ports, the run's.
	elsewhere, hostIP := prefix+"e95", "198.18.95.254"
	for _, args := range [][]string{
		{"link", "add", elsewhere, "type", "bridge"},
		{"addr", "add", hostIP + "/32", "dev", elsewhere},
		{"link", "set", elsewhere, "up"},
		{"route", "add", "169.254.1.1/32", "dev", elsewhere},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			exec.Command("ip", "link", "del", elsewhere).Run()
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", elsewhere).Run() })
	confDir := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "calico", "type": "virtlet-test-cni-calico", "subnet": "198.18.95.0/25", "hostPrefix": %q}`, prefix)
	if err := os.WriteFile(filepath.Join(confDir, "10-calico.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d, c := daemonOnCNI(t, confDir, calicoBin, prefix+"n95-")

	podJSON, ctrJSON := vmPod(t, d, "calico", nil, 160<<20)
	sb := c.Must(t, "runp", podJSON)
	t.Cleanup(func() { c.Run("rmp", "-f", sb) })
	ips := c.PodNetwork(t, sb).IPs
	_, subnet, _ := net.ParseCIDR("198.18.95.0/25")
	if len(ips) != 1 || !subnet.Contains(net.ParseIP(ips[0])) {
		t.Fatalf("inspectp IPs %v: want one address in %s", ips, subnet)
	}
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
	// 169.254.1.1 is no host's address (nothing answers a ping of it, as
	// on a Calico node): the guest's way out is what is checked.
	if want := fmt.Sprintf("@@DHCP-BOUND iface=eth0 ip=%s mask=32 router=169.254.1.1 ", ips[0]); !strings.Contains(logs, want) {
		t.Errorf("console lacks %q:\n%s", want, logs)
	}
	out, errOut, err := c.Run("exec", "-s", "--timeout", "60", ctr, "sh", "-c", "ip route; ping -c 1 -W 3 "+hostIP)
	if err != nil || !strings.Contains(out, "default via 169.254.1.1 dev eth0") || !strings.Contains(out, "169.254.1.1 dev eth0") || !strings.Contains(out, "1 packets received") {
		t.Errorf("the guest's routes and its ping of the host's %s: %v\n%s%s", hostIP, err, out, errOut)
	}
	if err := ping(t, ips[0]); err != nil {
		t.Errorf("host → VM: %v", err)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
