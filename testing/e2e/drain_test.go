package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/testing/harness"
)

// State that outlives its node (issue 28, item 4): a StatefulSet's VM
// whose persistent root is a Ceph RBD image (a ceph flexvolume PV with
// rootfs: "true", the Ceph cluster on the host's address on the nodes'
// network). The guest writes a marker on its root disk; kubectl drain of
// its node brings the VM back on the other node, booting the same disk,
// which holds the marker; draining that node brings it back to the first,
// the marker still there.
func TestKubeStatefulVMDrain(t *testing.T) {
	parallel(t)
	nodeNet, k := harness.StartCluster(t, 250)
	ceph, key := startCephForRoots(t, nodeNet, k)
	names := nodeImages(t, nodeNet)
	for i := 0; i < 2; i++ {
		node, d := nodeNet.StartVirtletNode(t, bins, 251+i, names)
		k.StartNodeKubelet(node, d)
	}
	if err := k.Apply(harness.StatefulVM(ceph.Monitor, key)); err != nil {
		t.Fatal(err)
	}

	// The marker goes in the root disk's last sector, past the image's
	// file system.
	waitStatefulVM(t, k, "")
	root, size := rootDisk(t, k)
	marker := fmt.Sprintf("MARK-%d", time.Now().UnixNano())
	sector := size/512 - 1
	out, err := k.Kubectl("exec", "vm-0", "--", "sh", "-c",
		fmt.Sprintf("echo %s | dd of=%s bs=512 seek=%d count=1 conv=sync,notrunc 2>/dev/null && sync && echo written", marker, root, sector))
	if err != nil || !strings.Contains(out, "written") {
		t.Fatalf("write the marker on %s: %v\n%s", root, err, out)
	}
	readMarker := func(where string) {
		t.Helper()
		root, _ := rootDisk(t, k)
		out, err := k.Kubectl("exec", "vm-0", "--", "sh", "-c", fmt.Sprintf("dd if=%s bs=512 skip=%d count=1 2>/dev/null | head -c %d", root, sector, len(marker)))
		if err != nil || out != marker {
			t.Errorf("%s: the root disk's last sector holds %q (%v), want %q", where, out, err, marker)
		}
	}
	readMarker("before the drain")

	// Drain its node, then the one it moved to.
	for i := 0; i < 2; i++ {
		node := currentNode(t, k)
		began := time.Now()
		if out, err := k.Kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m"); err != nil {
			t.Fatalf("kubectl drain %s: %v\n%s", node, err, out)
		}
		moved := waitStatefulVM(t, k, node)
		t.Logf("kubectl drain %s → vm-0 ready on %s: %.1f s", node, moved, time.Since(began).Seconds())
		readMarker("after draining " + node)
		if out, err := k.Kubectl("uncordon", node); err != nil {
			t.Fatalf("kubectl uncordon %s: %v\n%s", node, err, out)
		}
	}
	if out, err := k.Kubectl("delete", "statefulset", "vm", "--wait=true", "--timeout=3m"); err != nil {
		t.Fatalf("delete the StatefulSet: %v\n%s", err, out)
	}
	waitKube(t, k, "vm-0 gone", 3*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-o", "name")
		return out == ""
	})
}

// waitStatefulVM waits until vm-0 runs, not on node notOn, and its guest
// is ready; it returns its node.
func waitStatefulVM(t *testing.T, k *harness.Kube, notOn string) string {
	t.Helper()
	var node string
	waitKube(t, k, "vm-0 ready off "+notOn, 5*time.Minute, func() bool {
		vms, _ := k.ReadyVMs("stateful-vm")
		if len(vms) != 1 || vms[0].Node == notOn {
			return false
		}
		node = vms[0].Node
		return true
	})
	return node
}

// currentNode is vm-0's node.
func currentNode(t *testing.T, k *harness.Kube) string {
	t.Helper()
	out, err := k.Kubectl("get", "pod", "vm-0", "-o", "jsonpath={.spec.nodeName}")
	if err != nil || out == "" {
		t.Fatalf("vm-0's node: %q %v", out, err)
	}
	return out
}

var diskLine = regexp.MustCompile(`@@DISK (\w+) SIZE_BYTES=(\d+) RO=\d SERIAL=` + regexp.QuoteMeta(core.RootSerial))

// rootDisk is the device of vm-0's guest whose serial is the root disk's,
// and its size, as the tiny guest printed them on its console.
func rootDisk(t *testing.T, k *harness.Kube) (dev string, size int64) {
	t.Helper()
	logs, err := k.Kubectl("logs", "vm-0")
	m := diskLine.FindAllStringSubmatch(logs, -1)
	if err != nil || len(m) == 0 {
		t.Fatalf("vm-0's console names no root disk (%v):\n%s", err, tail(logs, 3000))
	}
	last := m[len(m)-1]
	size, _ = strconv.ParseInt(last[2], 10, 64)
	return "/dev/" + last[1], size
}
