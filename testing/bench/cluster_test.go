package bench

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/cephcluster"
	"github.com/virtlet/virtlet/testing/harness"
)

// BenchmarkCluster: three Virtlet nodes on this machine (harness.Node:
// each its own network and mount namespaces, libvirtd, daemon and
// kubelet; pod subnets routed by the host) and a Deployment of three
// tiny-guest VM pods, one per node. Figures: VM → VM ping round trip
// across nodes (p50 of 20 pings, from inside the guest), TCP throughput
// VM → VM across nodes (a 16 MiB file from one guest's web server to
// another's nc, timed by the reader's clock), and a node's failure
// (kubelet and daemon killed) → its VM pod's replacement ready on another
// node (the pods tolerate a failed node for 2 s; the control plane takes
// a node for gone after 16 s of silence: harness.StartNodeKubelet). No
// target is set for them. Run with -benchtime 1x.
func BenchmarkCluster(b *testing.B) {
	dir := builtBinaries(b)
	nodeNet, k := harness.StartCluster(b, 230)
	_, translation := serveGuestOn(b, "tiny", "tiny", nodeNet.HostIP)
	type member struct {
		d  *harness.Daemon
		kl *harness.NodeKubelet
	}
	nodes := map[string]member{}
	for i := 0; i < 3; i++ {
		node, d := nodeNet.StartVirtletNode(b, dir, 231+i, translation)
		nodes[node.Name] = member{d: d, kl: k.StartNodeKubelet(node, d)}
	}
	if err := k.Apply(harness.SpreadVMs("vms", 3, 2)); err != nil {
		b.Fatal(err)
	}
	vms := k.WaitVMs("vms", "three VM pods ready, one per node", 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool {
		return len(vms) == 3 && len(harness.ByNode(vms)) == 3
	})
	from, to := vms[0], vms[1]
	exec := func(pod, script string) string {
		out, err := k.Kubectl("exec", pod, "--", "sh", "-c", script)
		if err != nil {
			b.Fatalf("kubectl exec %s -- sh -c %q: %v\n%s", pod, script, err, out)
		}
		return out
	}

	// Ping: busybox's summary line, "round-trip min/avg/max = a/b/c ms";
	// each reply's time, for the median.
	pings := exec(from.Pod, fmt.Sprintf("ping -c 20 -i 0.2 %s", to.IP))
	var rtts []time.Duration
	for _, m := range regexp.MustCompile(`time=([0-9.]+) ms`).FindAllStringSubmatch(pings, -1) {
		ms, _ := strconv.ParseFloat(m[1], 64)
		rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
	}
	if len(rtts) < 15 {
		b.Fatalf("%s → %s: %d of 20 pings answered:\n%s", from.Pod, to.IP, len(rtts), pings)
	}

	// Throughput: the file was just written, so the serving guest reads
	// it from its page cache; the reader (busybox nc: the tiny guest's
	// wget crashes) counts the bytes of the page and its headers, timed
	// by its clock (/proc/uptime, 10 ms).
	exec(to.Pod, "dd if=/dev/zero of=/www/big bs=1M count=16 2>/dev/null")
	got := exec(from.Pod, fmt.Sprintf(`s=$(cut -d' ' -f1 /proc/uptime); n=$(printf 'GET /big HTTP/1.0\r\n\r\n' | nc -w 10 %s 80 | wc -c); e=$(cut -d' ' -f1 /proc/uptime); echo "$n $s $e"`, to.IP))
	var bytes, t0, t1 float64
	if _, err := fmt.Sscanf(strings.TrimSpace(got), "%g %g %g", &bytes, &t0, &t1); err != nil {
		b.Fatalf("the reader's report %q: %v", got, err)
	}
	secs := t1 - t0
	if bytes < 16<<20 || bytes > 16<<20+4096 || secs <= 0 {
		b.Fatalf("read %v bytes in %.2f s: %q", bytes, secs, got)
	}
	mbps := bytes * 8 / secs / 1e6

	// A node fails: its kubelet and daemon die.
	victim := nodes[from.Node]
	began := time.Now()
	victim.kl.Kill()
	victim.d.Kill()
	k.WaitVMs("vms", "three VM pods ready off "+from.Node, 5*time.Minute, 100*time.Millisecond, func(vms []harness.ClusterVM) bool {
		return len(vms) == 3 && len(harness.ByNode(vms)[from.Node]) == 0
	})
	rescheduled := time.Since(began)
	// Back, for its VM to be removed before the node goes.
	victim.d.Start()
	victim.kl.Start()
	victim.kl.WaitReady(3 * time.Minute)

	p50 := median(rtts)
	b.ReportMetric(float64(p50.Microseconds())/1e3, "vm-vm-ping-p50-ms")
	b.ReportMetric(mbps, "vm-vm-tcp-Mbit/s")
	b.ReportMetric(rescheduled.Seconds(), "failure-rescheduled-s")
	record(Row{Figure: "VM → VM ping across nodes, p50 of 20 (tiny guests, TCG)", Ours: fmt.Sprintf("%.2f ms", float64(p50.Microseconds())/1e3), Target: "none set"},
		Row{Figure: "VM → VM TCP across nodes (16 MiB over HTTP, the reader's rate)", Ours: fmt.Sprintf("%.0f Mbit/s", mbps), Target: "none set"},
		Row{Figure: "node failure (kubelet and daemon killed) → its VM pod ready on another node (16 s grace, 2 s toleration)", Ours: fmt.Sprintf("%.1f s", rescheduled.Seconds()), Target: "none set"})
	fmt.Printf("Cluster (3 nodes on one machine, tiny guests, TCG): VM → VM ping p50 %.2f ms, TCP %.0f Mbit/s (%.0f bytes in %.2f s), node failure → VM pod ready elsewhere %.1f s\n",
		float64(p50.Microseconds())/1e3, mbps, bytes, secs, rescheduled.Seconds())
}

// BenchmarkClusterDrain: two Virtlet nodes, a Ceph cluster on their
// network, and a StatefulSet's VM whose persistent root is a Ceph RBD
// image (harness.StatefulVM, as TestKubeStatefulVMDrain); kubectl drain
// of the VM's node → the guest ready on the other node (its pod Running
// and the tiny guest's ready marker in kubectl logs, polled every
// 100 ms), twice (there and back). No target is set. Run with
// -benchtime 1x.
func BenchmarkClusterDrain(b *testing.B) {
	if smoke {
		// Its steps are TestKubeStatefulVMDrain's, which make check runs;
		// the smoke run's time goes to the benchmarks no test runs.
		b.Skip("smoke run: TestKubeStatefulVMDrain drains the same StatefulSet; make bench measures it")
	}
	dir := builtBinaries(b)
	nodeNet, k := harness.StartCluster(b, 235)
	ceph := cephcluster.StartOn(b, nodeNet.HostIP)
	ceph.Run(b, "ceph", "auth", "get-or-create", "client.libvirt", "mon", "profile rbd", "osd", "profile rbd pool=rbd")
	key := strings.TrimSpace(ceph.Run(b, "ceph", "auth", "print-key", "client.libvirt"))
	k.FlexvolumeDriver = filepath.Join(dir, "virtlet-flexvolume-driver")
	_, translation := serveGuestOn(b, "tiny", "tiny", nodeNet.HostIP)
	for i := 0; i < 2; i++ {
		node, d := nodeNet.StartVirtletNode(b, dir, 236+i, translation)
		k.StartNodeKubelet(node, d)
	}
	if err := k.Apply(harness.StatefulVM(ceph.Monitor, key)); err != nil {
		b.Fatal(err)
	}
	vms := k.WaitVMs("stateful-vm", "vm-0 ready", 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool { return len(vms) == 1 })
	var took []time.Duration
	for i := 0; i < 2; i++ {
		from := vms[0].Node
		began := time.Now()
		if out, err := k.Kubectl("drain", from, "--ignore-daemonsets", "--timeout=3m"); err != nil {
			b.Fatalf("kubectl drain %s: %v\n%s", from, err, out)
		}
		vms = k.WaitVMs("stateful-vm", "vm-0 ready off "+from, 5*time.Minute, 100*time.Millisecond, func(vms []harness.ClusterVM) bool {
			return len(vms) == 1 && vms[0].Node != from
		})
		took = append(took, time.Since(began))
		if out, err := k.Kubectl("uncordon", from); err != nil {
			b.Fatalf("kubectl uncordon %s: %v\n%s", from, err, out)
		}
	}
	if out, err := k.Kubectl("delete", "statefulset", "vm", "--wait=true", "--timeout=3m"); err != nil {
		b.Fatalf("delete the StatefulSet: %v\n%s", err, out)
	}
	b.ReportMetric(median(took).Seconds(), "drain-ready-s")
	record(Row{Figure: "kubectl drain → the StatefulSet's VM ready on another node, its root on Ceph RBD (tiny guest; there, back)",
		Ours: fmt.Sprintf("%.1f s, %.1f s", took[0].Seconds(), took[1].Seconds()), Target: "none set"})
	fmt.Printf("ClusterDrain (2 nodes, the VM's root on Ceph RBD, tiny guest, TCG): kubectl drain → guest ready on the other node %.1f s, back %.1f s\n",
		took[0].Seconds(), took[1].Seconds())
}
