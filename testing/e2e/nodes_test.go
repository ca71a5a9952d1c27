package e2e

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

// Two nodes on this one machine, isolated as real nodes are (issue 28's
// first step): each in its own network namespace with its own address
// and pod subnet, with its own libvirtd and virtlogd in a mount namespace
// where libvirt's directories are its own (its own host UUID), and its
// own Virtlet daemon. A VM pod runs on each; each node's libvirtd lists
// its own domain only (the machine's libvirtd neither); the host reaches
// both VMs by their pod addresses through the routes a CNI would set
// between nodes, and the VM on one node reaches the VM on the other.
func TestNodesAreIsolated(t *testing.T) {
	parallel(t)
	nodes := harness.NewNodeNet(t, 200)
	names := nodeImages(t, nodes)
	type vm struct {
		node     *harness.Node
		c        *harness.Crictl
		sb, ctr  string
		ip, name string
	}
	var vms []*vm
	for i := 0; i < 2; i++ {
		node, d := nodes.StartVirtletNode(t, bins, 201+i, names)
		c := d.Crictl(crictl)
		c.Timeout, c.Wrap = 3*time.Minute, node.Wrap()
		c.Must(t, "pull", tinyRef)
		v := &vm{node: node, c: c, name: fmt.Sprintf("vm-%d", i+1)}
		pod, ctr := vmPod(t, d, v.name, map[string]string{"VirtletForceDHCPNetworkConfig": "true"}, 160<<20)
		v.sb = c.Must(t, "runp", pod)
		t.Cleanup(func() { c.Run("rmp", "-f", v.sb) })
		ips := c.PodNetwork(t, v.sb).IPs
		_, subnet, _ := net.ParseCIDR(node.PodNet)
		if len(ips) != 1 || !subnet.Contains(net.ParseIP(ips[0])) {
			t.Fatalf("%s's pod addresses %v, want one in its node's %s", v.name, ips, node.PodNet)
		}
		v.ip = ips[0]
		v.ctr = c.Must(t, "create", v.sb, ctr, pod)
		c.Must(t, "start", v.ctr)
		vms = append(vms, v)
	}
	for _, v := range vms {
		waitLog(t, v.c, v.ctr, "@@TINY-READY", 3*time.Minute)
	}

	// Each libvirtd has its own VM only, and a host UUID of its own.
	var uuids []string
	for i, v := range vms {
		doms, err := v.node.Domains()
		if err != nil {
			t.Fatal(err)
		}
		if len(doms) != 1 {
			t.Errorf("%s's libvirtd lists %v, want its one VM", v.node.Name, doms)
		}
		other := vms[1-i]
		if slices.ContainsFunc(doms, func(d string) bool { return strings.Contains(d, other.sb[:8]) }) {
			t.Errorf("%s's libvirtd lists the other node's VM: %v", v.node.Name, doms)
		}
		if host, _ := harness.Virsh("list", "--all", "--name"); len(doms) > 0 && strings.Contains(host, doms[0]) {
			t.Errorf("the machine's libvirtd lists %s's VM %s", v.node.Name, doms[0])
		}
		uuid, err := v.node.HostUUID()
		if err != nil || uuid == "" {
			t.Fatalf("%s's host UUID: %q %v", v.node.Name, uuid, err)
		}
		uuids = append(uuids, uuid)
	}
	t.Logf("%s (%s, pods %s, libvirt host %s) runs %s at %s; %s (%s, pods %s, libvirt host %s) runs %s at %s",
		vms[0].node.Name, vms[0].node.IP, vms[0].node.PodNet, uuids[0], vms[0].name, vms[0].ip,
		vms[1].node.Name, vms[1].node.IP, vms[1].node.PodNet, uuids[1], vms[1].name, vms[1].ip)
	if uuids[0] == uuids[1] {
		t.Errorf("both nodes' libvirtd have host UUID %s", uuids[0])
	}

	// Routes between nodes: the host reaches both VMs; each VM the other.
	for _, v := range vms {
		if err := ping(t, v.ip); err != nil {
			t.Errorf("host → %s on %s: %v", v.name, v.node.Name, err)
		}
	}
	for i, v := range vms {
		other := vms[1-i]
		out, stderr, err := v.c.Run("exec", "-s", "--timeout", "60", v.ctr, "ping", "-c", "1", "-W", "3", other.ip)
		if err != nil || !strings.Contains(out, "1 packets received") {
			t.Errorf("%s on %s → %s on %s (%s): %v\n%s%s", v.name, v.node.Name, other.name, other.node.Name, other.ip, err, out, stderr)
		}
	}
}

// nodeImages serves the test images on the host's address on the nodes'
// network, where nodes download them, and returns the translation of
// virtlet.cloud/tiny to it.
func nodeImages(t *testing.T, nodes *harness.NodeNet) string {
	t.Helper()
	srv, err := imageserver.Start(imgDir, nodes.HostIP+":0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	names, err := srv.Translation(map[string]string{"tiny": "tiny.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
