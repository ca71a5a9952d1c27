package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// A cluster of three Virtlet nodes on this one machine (issue 28): one
// API server, controller manager and scheduler on the host's address on
// the nodes' network, and three harness.Nodes, each with its own kubelet,
// daemon, libvirtd and pod subnet. A Deployment of six VM pods spread by
// topology lands two VMs on each node; kubectl logs, exec, attach and
// port-forward reach the VMs on every node through the API server and
// that node's kubelet and daemon, and so do virtletctl status and virsh,
// which find the VM in its own node's libvirtd; each VM reaches a VM of
// the next node by its pod address; each node's libvirtd holds its own
// VMs only. Scaled to zero, no domain is left on any node.
func TestKubeCluster(t *testing.T) {
	parallel(t)
	nodeNet, k := harness.StartCluster(t, 210)
	names := nodeImages(t, nodeNet)
	nodes := map[string]*harness.Node{}
	daemons := map[string]*harness.Daemon{}
	k.ClusterDNS = harness.ClusterDNSIP
	var mixed *harness.Containerd
	for i := 0; i < 3; i++ {
		var node *harness.Node
		var d *harness.Daemon
		if i == 0 {
			// node-1 is mixed: container pods go to its containerd.
			node, d, mixed = nodeNet.StartMixedNode(t, bins, 211, names)
		} else {
			node, d = nodeNet.StartVirtletNode(t, bins, 211+i, names)
		}
		k.StartNodeKubelet(node, d)
		k.StartNodeKubeProxy(node)
		nodes[node.Name] = node
		daemons[node.Name] = d
	}
	// The cluster's DNS and a web server, container pods of node-1.
	mixed.ImportCoreDNS(t)
	mixed.ImportBusybox(t, "virtlet-test.local/web:1", "httpd", "-f", "-p", "8080", "-h", "/www")
	if err := k.Apply(harness.ClusterDNS("node-1") + "---\n" + webContainer); err != nil {
		t.Fatal(err)
	}

	key, pub := sshKey(t)
	deployment := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: vms
spec:
  replicas: 6
  selector:
    matchLabels: {app: vms}
  template:
    metadata:
      labels: {app: vms}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        VirtletForceDHCPNetworkConfig: "true"
        VirtletSSHKeys: "` + strings.TrimSpace(pub) + `"
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
	vms := k.WaitVMs("vms", "six VM pods ready, two per node", 5*time.Minute, time.Second, func(vms []harness.ClusterVM) bool {
		byNode := harness.ByNode(vms)
		for _, on := range byNode {
			if len(on) != 2 {
				return false
			}
		}
		return len(byNode) == 3
	})
	// By node: each VM's next but one is a VM of the next node.
	slices.SortFunc(vms, func(a, b harness.ClusterVM) int { return strings.Compare(a.Node+a.Pod, b.Node+b.Pod) })
	for i, v := range vms {
		node := nodes[v.Node]
		if node == nil {
			t.Fatalf("%s runs on %s, not one of the test's nodes", v.Pod, v.Node)
		}
		if _, subnet, _ := net.ParseCIDR(node.PodNet); !subnet.Contains(net.ParseIP(v.IP)) {
			t.Errorf("%s on %s has address %s, not in its node's %s", v.Pod, v.Node, v.IP, node.PodNet)
		}
		if doms, err := node.Domains(); err != nil || len(doms) != 2 || !slices.ContainsFunc(doms, func(d string) bool { return strings.HasSuffix(d, "-"+v.Pod) }) {
			t.Errorf("%s's libvirtd lists %v (%v), want its two VMs, %s's among them", v.Node, doms, err, v.Pod)
		}
		// kubectl exec, through the API server and this node's kubelet,
		// into the VM, which reaches a VM of the next node.
		next := vms[(i+2)%len(vms)]
		out, err := k.Kubectl("exec", v.Pod, "--", "ping", "-c", "1", "-W", "3", next.IP)
		if err != nil || !strings.Contains(out, "1 packets received") {
			t.Errorf("kubectl exec %s (on %s) -- ping %s (%s on %s): %v\n%s", v.Pod, v.Node, next.IP, next.Pod, next.Node, err, out)
		}
	}
	t.Logf("VM pods: %v", vms)
	// kubectl attach and port-forward, through the API server, each VM's
	// node's kubelet and its daemon: the console answers a typed line,
	// and the guest's web server its page, which names the guest (its
	// host name is its pod's).
	for _, v := range vms {
		kubectlAttachTypes(t, k, v.Pod, "typed-into-"+v.Pod)
		local := harness.FreePort(t)
		fwd := exec.Command(filepath.Join(k.Bin, "kubectl"), "--kubeconfig", k.Kubeconfig, "port-forward", v.Pod, fmt.Sprintf("%d:80", local))
		fwdOut := &harness.Screen{}
		fwd.Stdout, fwd.Stderr = fwdOut, fwdOut
		if err := fwd.Start(); err != nil {
			t.Fatal(err)
		}
		var page string
		var err error
		ok := harness.EventuallyOK(time.Minute, func() bool {
			page, err = httpGet(fmt.Sprintf("http://127.0.0.1:%d/", local))
			return err == nil && strings.TrimSpace(page) == "tiny "+v.Pod
		})
		fwd.Process.Kill()
		fwd.Wait()
		if !ok {
			t.Errorf("kubectl port-forward %s %d:80 (on %s): got %q, %v\n%s", v.Pod, local, v.Node, page, err, tail(fwdOut.String(), 1000))
		}
	}
	// virtletctl status and virsh, through the API server and each node's
	// kubelet and daemon: the VM as its own node's libvirtd has it.
	ctl := filepath.Join(t.TempDir(), "virtletctl")
	build := exec.Command("go", "build", "-o", ctl, "./cmd/virtletctl")
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build virtletctl: %v\n%s", err, out)
	}
	for i, v := range vms {
		// virtletctl ssh, through the API server's port-forward to this
		// node's kubelet and daemon, into the tiny guest's dropbear (one
		// VM of each node).
		if i%2 == 0 {
			var out []byte
			var err error
			if !harness.EventuallyOK(time.Minute, func() bool {
				out, err = exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "ssh", "-i", key, "root@"+v.Pod, "--",
					"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
					"echo ssh-ok from $(hostname)").CombinedOutput()
				return err == nil && strings.Contains(string(out), "ssh-ok from "+v.Pod)
			}) {
				t.Errorf("virtletctl ssh root@%s (on %s): %v\n%s", v.Pod, v.Node, err, out)
			}
		}
		out, err := exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "status", v.Pod).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "State:       running for ") || !strings.Contains(string(out), " "+v.IP+"/") {
			t.Errorf("virtletctl status %s (on %s): %v\n%s", v.Pod, v.Node, err, out)
		}
		doms, _ := nodes[v.Node].Domains()
		i := slices.IndexFunc(doms, func(d string) bool { return strings.HasSuffix(d, "-"+v.Pod) })
		out, err = exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "virsh", v.Pod, "--", "dominfo").CombinedOutput()
		if err != nil || i < 0 || !strings.Contains(string(out), "Name:           "+doms[i]+"\n") || !strings.Contains(string(out), "running") {
			t.Errorf("virtletctl virsh %s -- dominfo (on %s, whose libvirtd has %v): %v\n%s", v.Pod, v.Node, doms, err, out)
		}
	}

	// A Service balancing to the VMs of every node: each node's
	// kube-proxy rewrites its pods' traffic to the ClusterIP, here from a
	// VM of node-1 to VMs of all three nodes.
	if err := k.Apply("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: vms}\n  ports: [{port: 80}]\n"); err != nil {
		t.Fatal(err)
	}
	clusterIP, err := k.Kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	answered := map[string]bool{} // by node
	var out string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last answers to %s from %s:\n%s", clusterIP, vms[0].Pod, out)
			for name, node := range nodes {
				rules, err := node.Run("nft", "list", "table", "ip", "kube-proxy")
				t.Logf("%s's kube-proxy rules (%v):\n%s\nits log:\n%s", name, err, tail(rules, 3000), tail(k.Log("kube-proxy-"+name), 3000))
			}
		}
	})
	waitKube(t, k, "the web Service answered from the VMs of every node", 2*time.Minute, func() bool {
		out, err = k.Kubectl("exec", vms[0].Pod, "--", "sh", "-c",
			// busybox nc: the tiny guest's wget crashes.
			fmt.Sprintf(`for i in 1 2 3 4 5 6 7 8 9 10; do printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s 80; echo; done`, clusterIP))
		if err != nil {
			out += "\n" + err.Error()
		}
		for _, line := range strings.Split(out, "\n") {
			for _, v := range vms {
				if strings.TrimSpace(line) == "tiny "+v.Pod {
					answered[v.Node] = true
				}
			}
		}
		return len(answered) == 3
	})
	t.Logf("%s (%s) → Service web %s: answered by the VMs of %v", vms[0].Pod, vms[0].Node, clusterIP, answered)

	// VM → container pod on the mixed node, by pod IP, and by Service
	// names that CoreDNS (a container pod there too) resolves: from a
	// VM of node-3, whose kube-proxy sends it the mixed node's way.
	waitKube(t, k, "the container pods (CoreDNS, web-ctr) ready", 3*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-A", "-l", "tier=containers", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {end}`)
		return slices.Equal(strings.Fields(out), []string{"True", "True"})
	})
	client := vms[len(vms)-1]
	ctrIP, err := k.Kubectl("get", "pods", "-l", "app=web-ctr", "-o", "jsonpath={.items[0].status.podIP}")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl("exec", client.Pod, "--", "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s 8080`, ctrIP)); err != nil || !strings.Contains(out, "busybox httpd") {
		t.Errorf("%s (%s) → the container pod web-ctr at %s: %v\n%s", client.Pod, client.Node, ctrIP, err, out)
	}
	for _, svc := range []string{"web-ctr", "web"} {
		ip, err := k.Kubectl("get", "service", svc, "-o", "jsonpath={.spec.clusterIP}")
		if err != nil {
			t.Fatal(err)
		}
		name := svc + ".default.svc.cluster.local"
		var out string
		if !harness.EventuallyOK(time.Minute, func() bool {
			out, _ = k.Kubectl("exec", client.Pod, "--", "nslookup", name)
			return strings.Contains(out, ip)
		}) {
			t.Errorf("%s (%s): nslookup %s, want %s:\n%s", client.Pod, client.Node, name, ip, out)
		}
	}
	webCtrIP, _ := k.Kubectl("get", "service", "web-ctr", "-o", "jsonpath={.spec.clusterIP}")
	// The short name, through the pod's search domains.
	if out, err := k.Kubectl("exec", client.Pod, "--", "sh", "-c",
		`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 $(nslookup web-ctr | sed -n 's/^Address:[[:space:]]*\([0-9.]*\)$/\1/p' | tail -1) 80`); err != nil || !strings.Contains(out, "busybox httpd") {
		t.Errorf("%s (%s) → Service web-ctr (%s) by its name: %v\n%s", client.Pod, client.Node, webCtrIP, err, out)
	}

	t.Run("a VM checkpointed on its node goes on on another", func(t *testing.T) {
		checkpointElsewhere(t, k, nodeNet, vms, nodes, daemons, pub)
	})

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
	// The container pods go too, through the daemon's forward, before
	// node-1's containerd and kubelet stop.
	for _, args := range [][]string{{"delete", "deployment", "web-ctr"}, {"delete", "deployment", "-n", "kube-system", "coredns"}} {
		if out, err := k.Kubectl(args...); err != nil {
			t.Errorf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	waitKube(t, k, "the container pods gone", 2*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-A", "-l", "tier=containers", "-o", "name")
		return out == ""
	})
}

// kubectlAttachTypes types a line into a VM pod's console through kubectl
// attach -it and waits for the tiny guest's answer in kubectl attach's
// output.
func kubectlAttachTypes(t *testing.T, k *harness.Kube, pod, line string) {
	t.Helper()
	// kubectl attach -it needs a terminal: script(1) gives it one.
	attach := exec.Command("script", "-q", "-e", "-c",
		fmt.Sprintf("%s --kubeconfig %s attach -it %s", filepath.Join(k.Bin, "kubectl"), k.Kubeconfig, pod), "/dev/null")
	stdin, err := attach.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	attached := &harness.Screen{}
	attach.Stdout, attach.Stderr = attached, attached
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); attach.Process.Kill(); attach.Wait() }()
	if !harness.EventuallyOK(time.Minute, func() bool {
		io.WriteString(stdin, line+"\r")
		time.Sleep(time.Second)
		return strings.Contains(attached.String(), "@@ECHO "+line)
	}) {
		t.Errorf("kubectl attach -it %s: no answer to %q:\n%s", pod, line, tail(attached.String(), 2000))
	}
}

// webContainer is a container pod serving busybox httpd's page on the
// mixed node, and the Service web-ctr in front of it.
const webContainer = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web-ctr}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web-ctr}
  template:
    metadata:
      labels: {app: web-ctr, tier: containers}
    spec:
      nodeSelector: {kubernetes.io/hostname: node-1}
      containers:
      - name: web
        image: virtlet-test.local/web:1
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-ctr}
spec:
  selector: {app: web-ctr}
  ports: [{port: 80, targetPort: 8080}]
`

// checkpointElsewhere checkpoints a Deployment's VM through the API
// server's node proxy (kubelet's checkpoint API on its node), serves the
// archive as an image, and restores it in a pod on another node: the guest
// answers from that node's pod network under the name it had (the same
// guest, not a new boot, which would take the new pod's name), and its
// console shows no boot.
func checkpointElsewhere(t *testing.T, k *harness.Kube, nodeNet *harness.NodeNet, vms []harness.ClusterVM, nodes map[string]*harness.Node, daemons map[string]*harness.Daemon, pub string) {
	from, to := vms[2], "node-3" // vms are sorted by node: node-2's first
	if from.Node != "node-2" {
		t.Fatalf("%s runs on %s, not node-2", from.Pod, from.Node)
	}
	out, err := k.Kubectl("create", "--raw", fmt.Sprintf("/api/v1/nodes/%s/proxy/checkpoint/default/%s/vm", from.Node, from.Pod), "-f", "/dev/null")
	var answer struct{ Items []string }
	if err != nil || json.Unmarshal([]byte(out), &answer) != nil || len(answer.Items) != 1 {
		t.Fatalf("checkpoint of %s through the API server: %v %s", from.Pod, err, out)
	}
	daemons[to].Translate("moved.yaml", serveCheckpoint(t, answer.Items[0], "moved", nodeNet.HostIP))
	info, err := os.Stat(answer.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: moved
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletForceDHCPNetworkConfig: "true"
    VirtletSSHKeys: "%s"
spec:
  nodeName: %s
  containers:
  - name: vm
    image: virtlet.cloud/moved
    tty: true
    stdin: true
    resources:
      limits: {memory: 160Mi}
`, strings.TrimSpace(pub), to)
	if err := k.Apply(pod); err != nil {
		t.Fatal(err)
	}
	defer k.Kubectl("delete", "pod", "moved", "--timeout=3m")
	if out, err := k.Kubectl("wait", "--for=condition=Ready", "pod/moved", "--timeout=3m"); err != nil {
		describe, _ := k.Kubectl("describe", "pod", "moved")
		t.Fatalf("the restored pod is not Ready: %v %s\n%s", err, out, describe)
	}
	ip, _ := k.Kubectl("get", "pod", "moved", "-o", "jsonpath={.status.podIP}")
	if _, subnet, _ := net.ParseCIDR(nodes[to].PodNet); subnet == nil || !subnet.Contains(net.ParseIP(ip)) {
		t.Errorf("the restored VM has address %s, not one of %s's", ip, to)
	}
	client := vms[0] // node-1's
	var got string
	if !harness.EventuallyOK(time.Minute, func() bool {
		got, _ = k.Kubectl("exec", client.Pod, "--", "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s 80`, ip))
		return strings.Contains(got, "tiny "+from.Pod)
	}) {
		logs, _ := k.Kubectl("logs", "moved")
		t.Fatalf("%s (%s) → the restored VM at %s: %q, want the page of %s's guest\nits console:\n%s", client.Pod, client.Node, ip, got, from.Pod, tail(logs, 3000))
	}
	if logs, _ := k.Kubectl("logs", "moved"); strings.Contains(logs, "@@TINY-INIT-START") || !strings.Contains(logs, "@@DHCP-BOUND iface=eth0 ip="+ip+" ") {
		t.Errorf("the restored VM's console shows a boot, or not its new address %s:\n%s", ip, tail(logs, 3000))
	}
	t.Logf("%s checkpointed on %s (%d MiB), restored on %s at %s, answers as %s", from.Pod, from.Node, info.Size()>>20, to, ip, from.Pod)
}
