package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/cephcluster"
	"github.com/virtlet/virtlet/testing/harness"
)

// TestKubeMigration moves a running VM pod's VM between two nodes with
// virtletctl migrate, as a user does: the guest's ticking process runs on
// without a restart or a lost tick, the receiving pod on the other node
// is the VM's pod (its console, its new address), and the source pod is
// gone. Then a migration whose receiving daemon is killed half way fails
// and leaves the VM running where it was and nothing on the other node.
// diskNoise writes 4 MiB of noise to the tiny guest's root disk past
// its image's data and prints their checksum.
const diskNoise = "#!/bin/sh\ndd if=/dev/urandom of=/dev/sda bs=1M seek=24 count=4 conv=fsync 2>/dev/null\necho \"@@DISKSUM $(dd if=/dev/sda bs=1M skip=24 count=4 2>/dev/null | md5sum)\"\n"

func TestKubeMigration(t *testing.T) {
	parallel(t)
	nodeNet, k := harness.StartCluster(t, 170)
	names := nodeImages(t, nodeNet)
	var nodes []*harness.Node
	var daemons []*harness.Daemon
	var migrationArgs [][]string
	for i := 0; i < 2; i++ {
		node, d, args := startMigratingNode(t, nodeNet, k, 171+i, names)
		k.StartNodeKubeProxy(node)
		nodes, daemons, migrationArgs = append(nodes, node), append(daemons, d), append(migrationArgs, args)
	}
	ctl := buildVirtletctl(t)
	// The guest writes 4 MiB of noise to its root disk, past the image's
	// data, and prints its checksum: the migration must copy the disk.
	script, _ := json.Marshal(diskNoise + strings.TrimPrefix(tickerScript, "#!/bin/sh\n"))
	manifest := filepath.Join(t.TempDir(), "vm.yaml")
	os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: mig-vm
  labels: {app: mig}
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletCloudInitUserDataScript: %s
spec:
  nodeName: node-1
  automountServiceAccountToken: false
  containers:
  - name: vm
    image: virtlet.cloud/tiny
    resources:
      limits: {memory: 128Mi}
`, script)), 0o644)
	if out, err := k.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v %s", err, out)
	}
	t.Cleanup(func() { k.Kubectl("delete", "pod", "-l", "app=mig", "--timeout=3m") })
	waitTicks := func(pod string, n int) []tick { t.Helper(); return waitTicksOf(t, k, pod, n) }
	before := waitTicks("mig-vm", 5)
	// A Service in front of the VM's web server (the tiny guest's httpd),
	// reached from node-2 through its kube-proxy.
	if err := k.Apply("apiVersion: v1\nkind: Service\nmetadata: {name: mig-web}\nspec:\n  selector: {app: mig}\n  ports: [{port: 80}]\n"); err != nil {
		t.Fatal(err)
	}
	clusterIP, err := k.Kubectl("get", "service", "mig-web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	throughService := func() bool {
		page, err := nodes[1].Run("curl", "-s", "-m", "2", "http://"+clusterIP+"/")
		return err == nil && strings.HasPrefix(page, "tiny ")
	}
	if !harness.EventuallyOK(2*time.Minute, throughService) {
		t.Fatalf("the VM's web server is not reached through its Service %s", clusterIP)
	}
	oldIP, _ := k.Kubectl("get", "pod", "mig-vm", "-o", "jsonpath={.status.podIP}")
	logs, _ := k.Kubectl("logs", "mig-vm")
	sum := regexp.MustCompile(`@@DISKSUM ([0-9a-f]{32})`).FindStringSubmatch(logs)
	if sum == nil {
		t.Fatalf("no @@DISKSUM in the guest's console:\n%s", tail(logs, 2000))
	}
	// A client on node-2 pings the VM's address, then its new one once
	// the receiving pod has it: the blackout is from the last answer at
	// the old address to the first at the new.
	var lastOld time.Time
	probing := make(chan struct{})
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		for {
			select {
			case <-probing:
				return
			default:
			}
			if _, err := nodes[1].Run("ping", "-n", "-c1", "-W0.2", oldIP); err == nil {
				lastOld = time.Now()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	tcg := domainsAreTCG(t, nodes[0])
	migrate := func(pod, to string) (string, error) { return migrateWith(ctl, k, pod, to) }
	out, err := migrate("mig-vm", "node-2")
	if err != nil {
		t.Fatalf("virtletctl migrate mig-vm --to node-2: %v\n%s", err, out)
	}
	t.Logf("virtletctl migrate: %s", strings.TrimSpace(out))
	m := migratedTo.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("virtletctl migrate said %q", out)
	}
	// A TCG guest is copied paused (QEMU's TCG loses writes during a live
	// copy); a KVM guest live.
	if whole := m[4] != ""; whole != tcg {
		t.Errorf("the guest paused for the whole copy: %v, its domain a TCG one: %v (%q)", whole, tcg, out)
	}
	recv := m[1]
	close(probing)
	<-probed
	// The receiving pod is the VM's pod now, on node-2.
	var phase, node, ip string
	if !harness.EventuallyOK(2*time.Minute, func() bool {
		status, _ := k.Kubectl("get", "pod", recv, "-o", "jsonpath={.status.phase} {.spec.nodeName} {.status.podIP}")
		f := strings.Fields(status)
		if len(f) == 3 {
			phase, node, ip = f[0], f[1], f[2]
		}
		return phase == "Running"
	}) {
		describe, _ := k.Kubectl("describe", "pod", recv)
		t.Fatalf("receiving pod %s is %q:\n%s", recv, phase, describe)
	}
	if node != "node-2" || ip == "" || ip == oldIP || !strings.HasPrefix(ip, "198.18.172.") {
		t.Fatalf("receiving pod %s: node %q, IP %q (the source's was %q; node-2's pods are 198.18.172.0/24)", recv, node, ip, oldIP)
	}
	var firstNew time.Time
	if !harness.EventuallyOK(time.Minute, func() bool {
		_, err := nodes[1].Run("ping", "-n", "-c1", "-W0.2", ip)
		firstNew = time.Now()
		return err == nil
	}) {
		t.Fatalf("the migrated guest does not answer at its new address %s", ip)
	}
	t.Logf("network blackout, as a client on node-2 sees it: %s (last answer at %s, first at %s)", firstNew.Sub(lastOld).Round(time.Millisecond), oldIP, ip)
	// A client of the Service reaches the VM again, at its new address.
	if !harness.EventuallyOK(2*time.Minute, throughService) {
		endpoints, _ := k.Kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=mig-web", "-o", "wide")
		t.Errorf("the migrated VM's web server is not reached through its Service %s:\n%s", clusterIP, endpoints)
	} else {
		t.Logf("the Service %s reaches the migrated VM %s after the migration", clusterIP, time.Since(lastOld).Round(time.Millisecond))
	}
	// Its disk came along: the noise it wrote reads back the same, from
	// the disk (the guest's page cache dropped).
	var got string
	if !harness.EventuallyOK(time.Minute, func() bool {
		got, _ = k.Kubectl("exec", recv, "--", "sh", "-c", "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/sda bs=1M skip=24 count=4 2>/dev/null | md5sum")
		return strings.HasPrefix(got, sum[1])
	}) {
		t.Errorf("the migrated guest's root disk holds %q at 24 MiB, not the %s it wrote before", got, sum[1])
	}
	// The guest ran on: its ticks continue in the receiving pod's
	// console, one after another, from the same open file.
	checkTicksGoOn(t, k, recv, before)
	if logs, _ := k.Kubectl("logs", recv); strings.Contains(logs, "@@TINY-INIT-START") {
		t.Errorf("the migrated guest booted:\n%s", tail(logs, 2000))
	}
	// The source pod is gone, and its domain with it.
	if !harness.EventuallyOK(2*time.Minute, func() bool {
		_, err := k.Kubectl("get", "pod", "mig-vm")
		return err != nil
	}) {
		t.Errorf("the source pod mig-vm is still there")
	}
	if !harness.EventuallyOK(time.Minute, func() bool {
		doms, err := nodes[0].Domains()
		return err == nil && len(doms) == 0
	}) {
		doms, _ := nodes[0].Domains()
		t.Errorf("node-1 has domains after the migration: %v", doms)
	}

	// A migration whose receiving daemon dies half way: the VM runs on
	// where it was, and the receiving node keeps nothing of it.
	t.Run("receiving daemon killed", func(t *testing.T) {
		target := daemons[0]
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			deadline := time.Now().Add(5 * time.Minute)
			for time.Now().Before(deadline) {
				if strings.Contains(target.Log(), "live migration offered and accepted") {
					time.Sleep(300 * time.Millisecond)
					target.Kill()
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		out, err := migrate(recv, "node-1")
		<-killed
		if err == nil {
			t.Fatalf("virtletctl migrate %s --to node-1 succeeded though node-1's daemon was killed:\n%s", recv, out)
		}
		t.Logf("virtletctl migrate, node-1's daemon killed: %v: %s", err, strings.TrimSpace(out))
		target.Start(migrationArgs[0]...)
		before := readTicks(k, recv)
		after := waitTicks(recv, last(before)+5)
		for i := 1; i < len(after); i++ {
			if after[i].n != after[i-1].n+1 {
				t.Fatalf("tick %d after tick %d: the guest did not run on at its source", after[i].n, after[i-1].n)
			}
		}
		if !harness.EventuallyOK(2*time.Minute, func() bool {
			doms, err := nodes[0].Domains()
			return err == nil && len(doms) == 0
		}) {
			doms, _ := nodes[0].Domains()
			t.Errorf("node-1 keeps domains of the failed migration: %v", doms)
		}
		// virtletctl deleted the receiving pod; its node's restarted
		// daemon removes it.
		var pods string
		if !harness.EventuallyOK(2*time.Minute, func() bool {
			pods, _ = k.Kubectl("get", "pods", "-l", "app=mig", "-o", "name")
			return strings.TrimSpace(pods) == "pod/"+recv
		}) {
			t.Errorf("pods after the failed migration: %q (want only %s)", pods, recv)
		}
	})
	t.Run("a Deployment's pod", func(t *testing.T) { migrateADeploymentsPod(t, k, ctl) })
}

// migrateADeploymentsPod moves the VM of a Deployment's pod: the receiving
// pod joins its ReplicaSet once the VM is in it, the source pod goes, and
// the ReplicaSet creates no replica of its own meanwhile.
func migrateADeploymentsPod(t *testing.T, k *harness.Kube, ctl string) {
	script, _ := json.Marshal(tickerScript)
	if err := k.Apply(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: mig-deploy}
spec:
  replicas: 1
  selector: {matchLabels: {app: migd}}
  template:
    metadata:
      labels: {app: migd}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        VirtletCloudInitUserDataScript: %s
    spec:
      nodeName: node-1
      automountServiceAccountToken: false
      containers:
      - name: vm
        image: virtlet.cloud/tiny
        resources:
          limits: {memory: 128Mi}
`, script)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.Kubectl("delete", "deployment", "mig-deploy", "--timeout=3m")
		k.Kubectl("delete", "pods", "-l", "app=migd", "--timeout=3m") // a receiving pod left unadopted
	})
	var src string
	if !harness.EventuallyOK(2*time.Minute, func() bool {
		pods, _ := k.Kubectl("get", "pods", "-l", "app=migd", "-o", "jsonpath={.items[*].metadata.name}")
		src = strings.TrimSpace(pods)
		return src != "" && !strings.Contains(src, " ")
	}) {
		t.Fatalf("the Deployment's pods: %q", src)
	}
	before := waitTicksOf(t, k, src, 5)
	out, err := migrateWith(ctl, k, src, "node-2")
	if err != nil {
		t.Fatalf("virtletctl migrate %s --to node-2: %v\n%s", src, err, out)
	}
	t.Logf("virtletctl migrate: %s", strings.TrimSpace(out))
	m := migratedTo.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("virtletctl migrate said %q", out)
	}
	recv := m[1]
	checkTicksGoOn(t, k, recv, before)
	rs, _ := k.Kubectl("get", "replicasets", "-l", "app=migd", "-o", "jsonpath={.items[*].metadata.name}")
	var pods, owner string
	if !harness.EventuallyOK(2*time.Minute, func() bool {
		pods, _ = k.Kubectl("get", "pods", "-l", "app=migd", "-o", "jsonpath={.items[*].metadata.name}")
		owner, _ = k.Kubectl("get", "pod", recv, "-o", "jsonpath={.metadata.ownerReferences[?(@.controller==true)].kind}/{.metadata.ownerReferences[?(@.controller==true)].name}")
		return strings.TrimSpace(pods) == recv && owner == "ReplicaSet/"+rs
	}) {
		t.Fatalf("the Deployment's pods %q (want only %s, owned by ReplicaSet/%s: %q)", pods, recv, rs, owner)
	}
	var ready string
	if !harness.EventuallyOK(time.Minute, func() bool {
		ready, _ = k.Kubectl("get", "deployment", "mig-deploy", "-o", "jsonpath={.status.readyReplicas}")
		return ready == "1"
	}) {
		t.Errorf("the Deployment has %q ready replicas, want 1", ready)
	}
	// The ReplicaSet created the first pod only: it neither replaced the
	// source pod nor counted the receiving one as a surplus.
	created, _ := k.Kubectl("get", "events", "--field-selector", "involvedObject.name="+rs+",reason=SuccessfulCreate", "-o", "jsonpath={.items[*].message}")
	if n := strings.Count(created, "Created pod"); n != 1 {
		t.Errorf("ReplicaSet %s created %d pods (%q), want 1", rs, n, created)
	}
	if deleted, _ := k.Kubectl("get", "events", "--field-selector", "involvedObject.name="+rs+",reason=SuccessfulDelete", "-o", "jsonpath={.items[*].message}"); strings.Contains(deleted, recv) {
		t.Errorf("ReplicaSet %s deleted the receiving pod: %q", rs, deleted)
	}
}

var migratedTo = regexp.MustCompile(`VM runs in pod (\S+) on node node-2: took (\S+), guest paused (\S+)( \(the whole copy[^)]*\))?,`)

// domainsAreTCG tells whether node's libvirt domains, of which there must
// be one, are of type qemu (TCG) rather than kvm.
func domainsAreTCG(t *testing.T, node *harness.Node) bool {
	t.Helper()
	doms, err := node.Domains()
	if err != nil || len(doms) != 1 {
		t.Fatalf("%s's domains: %v %v", node.Name, doms, err)
	}
	out, err := node.Run("virsh", "-c", "qemu:///system", "dumpxml", doms[0])
	if err != nil {
		t.Fatalf("%s: virsh dumpxml %s: %v: %s", node.Name, doms[0], err, out)
	}
	switch {
	case strings.HasPrefix(out, "<domain type='qemu'"):
		return true
	case strings.HasPrefix(out, "<domain type='kvm'"):
		return false
	}
	t.Fatalf("%s: domain %s of neither type qemu nor kvm: %.80s", node.Name, doms[0], out)
	return false
}

func buildVirtletctl(t *testing.T) string {
	t.Helper()
	ctl := filepath.Join(t.TempDir(), "virtletctl")
	build := exec.Command("go", "build", "-o", ctl, "./cmd/virtletctl")
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build virtletctl: %v\n%s", err, out)
	}
	return ctl
}

func migrateWith(ctl string, k *harness.Kube, pod, to string) (string, error) {
	out, err := exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "migrate", pod, "--to", to).CombinedOutput()
	return string(out), err
}

// waitTicksOf waits for pod's guest's nth tick (tickerScript) and returns
// its ticks.
func waitTicksOf(t *testing.T, k *harness.Kube, pod string, n int) []tick {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ts := readTicks(k, pod)
		if len(ts) > 0 && ts[len(ts)-1].n >= n {
			return ts
		}
		if time.Now().After(deadline) {
			describe, _ := k.Kubectl("describe", "pod", pod)
			logs, _ := k.Kubectl("logs", pod)
			t.Fatalf("no @@TICK %d in the console of %s:\n%s\n%s", n, pod, tail(logs, 3000), describe)
		}
		time.Sleep(time.Second)
	}
}

// checkTicksGoOn checks that the migrated guest's ticks in pod follow
// the source's last one (before) without a gap, from the same open file.
func checkTicksGoOn(t *testing.T, k *harness.Kube, pod string, before []tick) {
	t.Helper()
	first := waitTicksOf(t, k, pod, 1)
	ticks := waitTicksOf(t, k, pod, first[0].n+10)
	if first[0].n <= last(before) {
		t.Fatalf("the migrated guest ticks from %d, before the source's tick %d: it booted anew", first[0].n, last(before))
	}
	for i := 1; i < len(ticks); i++ {
		if ticks[i].n != ticks[i-1].n+1 || ticks[i].lines != ticks[i].n {
			t.Fatalf("tick %d (%d lines) after tick %d: the guest's process did not run on", ticks[i].n, ticks[i].lines, ticks[i-1].n)
		}
	}
}

// TestKubeMigrationOfACephRoot moves a VM whose persistent root is a Ceph
// RBD image (a flexvolume PV with rootfs: "true"): shared storage, which
// the receiving pod attaches itself and nothing copies. The guest's
// ticks go on, and a marker it wrote on its root disk reads back there.
func TestKubeMigrationOfACephRoot(t *testing.T) {
	parallel(t)
	nodeNet, k := harness.StartCluster(t, 165)
	ceph, key := startCephForRoots(t, nodeNet, k)
	names := nodeImages(t, nodeNet)
	for i := 0; i < 2; i++ {
		startMigratingNode(t, nodeNet, k, 166+i, names)
	}
	ctl := buildVirtletctl(t)
	script, _ := json.Marshal(tickerScript)
	if err := k.Apply(harness.CephRoot(ceph.Monitor, key, "mig-root", "mig-root") + fmt.Sprintf(`---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: mig-root, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: mig-root
  resources: {requests: {storage: 256Mi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: ceph-vm
  labels: {app: ceph-mig}
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletDiskDriver: virtio
    VirtletCloudInitUserDataScript: %[1]s
spec:
  nodeName: node-1
  automountServiceAccountToken: false
  containers:
  - name: vm
    image: virtlet.cloud/tiny
    resources:
      limits: {memory: 128Mi}
    volumeMounts:
    - {name: root, mountPath: /persistent-root}
  volumes:
  - name: root
    persistentVolumeClaim: {claimName: mig-root}
`, script)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Kubectl("delete", "pod", "-l", "app=ceph-mig", "--timeout=3m") })
	before := waitTicksOf(t, k, "ceph-vm", 5)
	logs, _ := k.Kubectl("logs", "ceph-vm")
	disk := diskLine.FindAllStringSubmatch(logs, -1)
	if len(disk) == 0 {
		t.Fatalf("the guest's console names no root disk:\n%s", tail(logs, 3000))
	}
	dev := "/dev/" + disk[len(disk)-1][1]
	size, _ := strconv.ParseInt(disk[len(disk)-1][2], 10, 64)
	sector := size/512 - 1
	marker := fmt.Sprintf("MARK-%d", time.Now().UnixNano())
	if out, err := k.Kubectl("exec", "ceph-vm", "--", "sh", "-c",
		fmt.Sprintf("echo %s | dd of=%s bs=512 seek=%d count=1 conv=sync,notrunc 2>/dev/null && sync && echo written", marker, dev, sector)); err != nil || !strings.Contains(out, "written") {
		t.Fatalf("write the marker on %s: %v\n%s", dev, err, out)
	}
	out, err := migrateWith(ctl, k, "ceph-vm", "node-2")
	if err != nil {
		t.Fatalf("virtletctl migrate ceph-vm --to node-2: %v\n%s", err, out)
	}
	t.Logf("virtletctl migrate: %s", strings.TrimSpace(out))
	m := migratedTo.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("virtletctl migrate said %q", out)
	}
	if !strings.Contains(out, " 0 MiB of disk copied") {
		t.Errorf("the Ceph root was copied (shared storage is attached, not copied): %q", out)
	}
	recv := m[1]
	checkTicksGoOn(t, k, recv, before)
	var got string
	if !harness.EventuallyOK(time.Minute, func() bool {
		got, _ = k.Kubectl("exec", recv, "--", "sh", "-c", fmt.Sprintf("echo 3 > /proc/sys/vm/drop_caches; dd if=%s bs=512 skip=%d count=1 2>/dev/null | head -c %d", dev, sector, len(marker)))
		return got == marker
	}) {
		t.Errorf("the root disk's last sector holds %q in the receiving pod, want %q", got, marker)
	}
}

// startMigratingNode starts a node whose daemon serves live migrations
// (harness.StartMigratingNode) and logs its daemon's log if the test fails.
func startMigratingNode(t *testing.T, nodeNet *harness.NodeNet, k *harness.Kube, podIndex int, names string) (*harness.Node, *harness.Daemon, []string) {
	t.Helper()
	node, d, args := nodeNet.StartMigratingNode(t, k, bins, podIndex, names)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's daemon log:\n%s", node.Name, tail(d.Log(), 20000))
		}
	})
	return node, d, args
}

// startCephForRoots starts a Ceph cluster on the nodes' network with a
// client.libvirt key for RBD, and has k's kubelets install Virtlet's
// flexvolume driver (Ceph roots are its PVs); it returns the cluster and
// the key.
func startCephForRoots(t *testing.T, nodeNet *harness.NodeNet, k *harness.Kube) (*cephcluster.Cluster, string) {
	t.Helper()
	ceph := cephcluster.StartOn(t, nodeNet.HostIP)
	ceph.Run(t, "ceph", "auth", "get-or-create", "client.libvirt", "mon", "profile rbd", "osd", "profile rbd pool=rbd")
	key := strings.TrimSpace(ceph.Run(t, "ceph", "auth", "print-key", "client.libvirt"))
	k.FlexvolumeDriver = filepath.Join(bins, "virtlet-flexvolume-driver")
	return ceph, key
}
