package e2e

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// clusterNode is a node of a test cluster with what runs on it.
type clusterNode struct {
	*harness.Node
	d  *harness.Daemon
	kl *harness.NodeKubelet
}

// A node of a three-node cluster fails (issue 28, item 3), twice: first
// its kubelet and Virtlet die (SIGKILL), then, on another node, libvirtd
// alone. Each time the node goes NotReady, the controllers recreate its
// VM pods on the other nodes, and when the node comes back its stale VMs
// are removed: every VM pod runs once, and the node keeps no domain, VM
// file, pod network namespace or pod address. The pods tolerate an
// unreachable or not-ready node for 2 s (a Deployment's pods tolerate it
// for 300 s by default), and the control plane takes a node for gone
// after 16 s without a lease renewal.
func TestKubeNodeFailure(t *testing.T) {
	parallel(t)
	nodeNet, k := harness.StartCluster(t, 220)
	names := nodeImages(t, nodeNet)
	nodes := map[string]*clusterNode{}
	for i := 0; i < 3; i++ {
		node, d := nodeNet.StartVirtletNode(t, bins, 221+i, names)
		nodes[node.Name] = &clusterNode{Node: node, d: d, kl: k.StartNodeKubelet(node, d)}
	}
	if err := k.Apply(harness.SpreadVMs("vms", 3, 2)); err != nil {
		t.Fatal(err)
	}
	vms := k.WaitVMs("vms", "three VM pods ready, one per node", 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool {
		return len(vms) == 3 && len(harness.ByNode(vms)) == 3
	})

	// kubelet and Virtlet die; the VM's QEMU runs on under libvirtd.
	victim := nodes[vms[0].Node]
	began := time.Now()
	victim.kl.Kill()
	victim.d.Kill()
	vms = failover(t, k, victim, began, "its kubelet and Virtlet killed")
	victim.d.Start()
	victim.kl.Start()
	victim.kl.WaitReady(3 * time.Minute)
	recovered(t, k, nodes, victim)

	// libvirtd dies on a node that has a VM; the node's runtime is not
	// ready while it is down.
	victim = nodes[vms[0].Node]
	began = time.Now()
	victim.KillLibvirtd(t)
	failover(t, k, victim, began, "its libvirtd killed")
	victim.StartLibvirtd(t)
	victim.kl.WaitReady(3 * time.Minute)
	recovered(t, k, nodes, victim)
}

// failover waits until victim is not Ready and its VM pods are being
// deleted, and three VM pods run and are ready on the other nodes; it
// returns them.
func failover(t *testing.T, k *harness.Kube, victim *clusterNode, began time.Time, what string) []harness.ClusterVM {
	t.Helper()
	victim.kl.WaitNotReady(2 * time.Minute)
	notReady := time.Since(began)
	vms := k.WaitVMs("vms", "three VM pods ready off "+victim.Name+", "+what, 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool {
		return len(vms) == 3 && len(harness.ByNode(vms)[victim.Name]) == 0
	})
	t.Logf("%s, %s: NotReady after %.1f s, its VM pods running elsewhere after %.1f s: %v",
		victim.Name, what, notReady.Seconds(), time.Since(began).Seconds(), vms)
	return vms
}

// recovered checks a node that came back: its stale VM pods go, no VM
// runs twice, and the node keeps nothing of them.
func recovered(t *testing.T, k *harness.Kube, nodes map[string]*clusterNode, back *clusterNode) {
	t.Helper()
	waitKube(t, k, back.Name+"'s stale VM pods gone", 3*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-l", "app=vms", "--field-selector", "spec.nodeName="+back.Name, "-o", "name")
		return out == ""
	})
	waitKube(t, k, back.Name+"'s stale VMs removed", 2*time.Minute, func() bool {
		doms, err := back.Domains()
		return err == nil && len(doms) == 0
	})
	vms := k.WaitVMs("vms", "three VM pods ready", 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool { return len(vms) == 3 })
	total := 0
	for name, n := range nodes {
		doms, err := n.Domains()
		if err != nil {
			t.Fatalf("%s's domains: %v", name, err)
		}
		if want := len(harness.ByNode(vms)[name]); len(doms) != want {
			t.Errorf("%s's libvirtd has %v, want %d VMs (its pods')", name, doms, want)
		}
		total += len(doms)
	}
	if total != 3 {
		t.Errorf("%d VMs run for three VM pods", total)
	}
	if files := vmFiles(back.d); len(files) != 0 {
		t.Errorf("%s keeps VM files: %v", back.Name, files)
	}
	if left, _ := os.ReadDir(filepath.Join(back.Dir, "netns")); len(left) != 0 {
		t.Errorf("%s keeps pod network namespaces: %v", back.Name, left)
	}
	entries, _ := os.ReadDir(filepath.Join(back.Dir, "ipam", "pods"))
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("%s's IPAM still holds %s", back.Name, e.Name())
		}
	}
}
