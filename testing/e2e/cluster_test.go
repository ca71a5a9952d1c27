package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/deploy"
	"github.com/virtlet/virtlet/testing/harness"
)

// A cluster of three Virtlet nodes on this one machine (issue 28): one
// API server, controller manager and scheduler on the host's address on
// the nodes' network, and three harness.Nodes, each with its own kubelet,
// daemon, libvirtd and pod subnet. A Deployment of three VM pods spread
// by topology lands one VM on each node; kubectl logs and exec reach the
// VM on every node through the API server and that node's kubelet, and so
// do virtletctl status and virsh, which find the VM in its own node's
// libvirtd; each VM reaches the next node's VM by its pod address; each
// node's libvirtd holds its own VM only. Scaled to zero, no domain is left
// on any node.
func TestKubeCluster(t *testing.T) {
	parallel(t)
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	nodeNet := harness.NewNodeNet(t, 210)
	k := harness.StartClusterControlPlane(t, kubeBin, nodeNet.HostIP)
	objects, err := deploy.Manifests(deploy.Options{NoInstaller: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Apply(objects); err != nil {
		t.Fatal(err)
	}
	names := nodeImages(t, nodeNet)
	nodes := map[string]*harness.Node{}
	for i := 0; i < 3; i++ {
		node, d := startNodeDaemon(t, nodeNet, 211+i, names)
		k.StartNodeKubelet(node, d)
		nodes[node.Name] = node
	}

	const deployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: vms
spec:
  replicas: 3
  selector:
    matchLabels: {app: vms}
  template:
    metadata:
      labels: {app: vms}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        VirtletForceDHCPNetworkConfig: "true"
    spec:
      nodeSelector: {extraRuntime: virtlet}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        labelSelector:
          matchLabels: {app: vms}
      containers:
      - name: vm
        image: virtlet.cloud/tiny
        tty: true
        stdin: true
        resources:
          limits: {memory: 160Mi}
`
	if err := k.Apply(deployment); err != nil {
		t.Fatal(err)
	}
	type vm struct{ pod, node, ip string }
	var vms []vm
	var problem string
	t.Cleanup(func() {
		if t.Failed() && problem != "" {
			t.Logf("the VM pods' last problem: %s", problem)
		}
	})
	waitKube(t, k, "three VM pods ready, one per node", 5*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-l", "app=vms", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase}{"\n"}{end}`)
		vms = nil
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) != 4 || f[3] != "Running" || seen[f[1]] {
				return false
			}
			seen[f[1]] = true
			vms = append(vms, vm{pod: f[0], node: f[1], ip: f[2]})
		}
		if len(vms) != 3 {
			return false
		}
		for _, v := range vms {
			if logs, err := k.Kubectl("logs", v.pod); !strings.Contains(logs, "@@TINY-READY") {
				problem = fmt.Sprintf("kubectl logs %s (on %s): %v\n%s", v.pod, v.node, err, tail(logs, 2000))
				return false
			}
		}
		return true
	})
	for i, v := range vms {
		node := nodes[v.node]
		if node == nil {
			t.Fatalf("%s runs on %s, not one of the test's nodes", v.pod, v.node)
		}
		if _, subnet, _ := net.ParseCIDR(node.PodNet); !subnet.Contains(net.ParseIP(v.ip)) {
			t.Errorf("%s on %s has address %s, not in its node's %s", v.pod, v.node, v.ip, node.PodNet)
		}
		if doms, err := node.Domains(); err != nil || len(doms) != 1 {
			t.Errorf("%s's libvirtd lists %v (%v), want its one VM", v.node, doms, err)
		}
		// kubectl exec, through the API server and this node's kubelet,
		// into the VM, which reaches the next node's VM.
		next := vms[(i+1)%len(vms)]
		out, err := k.Kubectl("exec", v.pod, "--", "ping", "-c", "1", "-W", "3", next.ip)
		if err != nil || !strings.Contains(out, "1 packets received") {
			t.Errorf("kubectl exec %s (on %s) -- ping %s (%s on %s): %v\n%s", v.pod, v.node, next.ip, next.pod, next.node, err, out)
		}
	}
	t.Logf("VM pods: %v", vms)
	// virtletctl status and virsh, through the API server and each node's
	// kubelet and daemon: the VM as its own node's libvirtd has it.
	ctl := filepath.Join(t.TempDir(), "virtletctl")
	build := exec.Command("go", "build", "-o", ctl, "./cmd/virtletctl")
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build virtletctl: %v\n%s", err, out)
	}
	for _, v := range vms {
		out, err := exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "status", v.pod).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "State:       running for ") || !strings.Contains(string(out), " "+v.ip+"/") {
			t.Errorf("virtletctl status %s (on %s): %v\n%s", v.pod, v.node, err, out)
		}
		doms, _ := nodes[v.node].Domains()
		out, err = exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "virsh", v.pod, "--", "dominfo").CombinedOutput()
		if err != nil || len(doms) != 1 || !strings.Contains(string(out), doms[0]) || !strings.Contains(string(out), "running") {
			t.Errorf("virtletctl virsh %s -- dominfo (on %s, whose libvirtd has %v): %v\n%s", v.pod, v.node, doms, err, out)
		}
	}

	if out, err := k.Kubectl("scale", "deployment", "vms", "--replicas=0"); err != nil {
		t.Fatalf("scale to 0: %v\n%s", err, out)
	}
	waitKube(t, k, "the VM pods gone", 3*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-l", "app=vms", "-o", "name")
		return out == ""
	})
	for name, node := range nodes {
		waitKube(t, k, name+"'s domains gone", time.Minute, func() bool {
			doms, err := node.Domains()
			return err == nil && len(doms) == 0
		})
	}
}
