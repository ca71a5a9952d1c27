package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// NodeKubelet is a kubelet running on a Node.
type NodeKubelet struct {
	k    *Kube
	node *Node
	argv []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{}
}

// StartNodeKubelet runs a kubelet on node (its namespaces) whose runtime
// is d, a daemon on the same node, as node.Name with node.IP as its
// InternalIP, and waits for the node to be Ready. Its files are below
// k.Dir/nodes/<name>; it stops, and its cgroups go, after the test. It
// renews its node's lease every 2 s (an 8 s lease), so that the cluster
// control plane's short grace period (StartClusterControlPlane) notices a
// node gone in seconds, not minutes.
func (k *Kube) StartNodeKubelet(node *Node, d *Daemon) *NodeKubelet {
	t := k.t
	t.Helper()
	dir := filepath.Join(k.Dir, "nodes", node.Name)
	rootDir, sysctls := filepath.Join(dir, "kubelet"), filepath.Join(dir, "sysctl")
	for _, p := range []string{rootDir, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSysctls(sysctls); err != nil {
		t.Fatal(err)
	}
	// Virtlet's flexvolume driver, as StartKubelet installs it, told
	// where the node's daemon's admin socket is.
	if k.FlexvolumeDriver != "" {
		if err := installFlexvolumeDriver(filepath.Join(dir, "volume-plugins"), d.AdminSocket(), k.FlexvolumeDriver); err != nil {
			t.Fatal(err)
		}
	}
	// Its volume mounts are seen by the daemon: a shared mount, in the
	// node's mount namespace, where both run.
	node.Must(t, "sh", "-c", fmt.Sprintf("mount --bind %[1]s %[1]s && mount --make-shared %[1]s", rootDir))
	user := "kubelet-" + node.Name
	k.issue(user, "system:node:"+node.Name, []string{"system:nodes"}, false, nil)
	k.issue(user+"-serving", node.Name, nil, true, []string{node.Name}, net.ParseIP(node.IP))
	pki := filepath.Join(k.Dir, "pki")
	cgroupRoot := KubeletCgroupRoot(RunID(), filepath.Base(k.Dir)[len("virtlet-kube-"):]+"-"+node.Name)
	if err := makeCgroupRoot(cgroupRoot); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "kubelet.yaml")
	settings := kubeletSettings{Address: node.IP, Port: 10250, HealthzPort: 10248, Endpoint: "unix://" + d.Socket,
		PodLogs: filepath.Join(dir, "pod-logs"), VolumePlugins: filepath.Join(dir, "volume-plugins"),
		Cert: filepath.Join(pki, user+"-serving.crt"), Key: filepath.Join(pki, user+"-serving.key"), CA: filepath.Join(pki, "ca.crt"),
		CgroupRoot: cgroupRoot}
	extra := "featureGates: {PodAndContainerStatsFromCRI: true}\nnodeLeaseDurationSeconds: 8\n"
	if k.ClusterDNS != "" {
		extra += "clusterDNS: [" + k.ClusterDNS + "]\n"
	}
	if err := os.WriteFile(config, []byte(extra+settings.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	// kubelet would set host sysctls: its own mount namespace (below the
	// node's) binds those files over.
	argv := append(node.Wrap(), "unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c",
		kubeletCommand(sysctls, filepath.Join(k.Bin, "kubelet"), config, k.kubeconfig(user), rootDir,
			"--hostname-override="+node.Name, "--node-ip="+node.IP, "--node-labels=extraRuntime=virtlet"))
	kl := &NodeKubelet{k: k, node: node, argv: argv}
	kl.Start()
	t.Cleanup(func() {
		kl.stop(syscall.SIGTERM, 15*time.Second)
		for _, m := range cgroupMounts() {
			if err := RemoveCgroupTree(filepath.Join(m.dir, cgroupRoot)); err != nil {
				t.Errorf("%s's kubelet's cgroups: %v", node.Name, err)
			}
		}
	})
	kl.WaitReady(3 * time.Minute)
	return kl
}

// Start runs the kubelet (again, after Kill), its log appended to the
// one before.
func (kl *NodeKubelet) Start() {
	done := kl.k.start("kubelet-"+kl.node.Name, kl.argv[0], kl.argv[1:]...)
	kl.k.mu.Lock()
	cmd := kl.k.procs[len(kl.k.procs)-1]
	kl.k.mu.Unlock()
	kl.mu.Lock()
	kl.cmd, kl.done = cmd, done
	kl.mu.Unlock()
}

// Kill ends the kubelet with SIGKILL, as a crash or a node's power loss
// would: it cleans nothing up.
func (kl *NodeKubelet) Kill() { kl.stop(syscall.SIGKILL, time.Minute) }

// stop sends sig, then SIGKILL after wait, and waits for the kubelet to
// exit.
func (kl *NodeKubelet) stop(sig syscall.Signal, wait time.Duration) {
	kl.mu.Lock()
	cmd, done := kl.cmd, kl.done
	kl.cmd = nil
	kl.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(wait):
		cmd.Process.Kill()
		<-done
	}
}

// WaitReady waits until the API server shows the node Ready.
func (kl *NodeKubelet) WaitReady(timeout time.Duration) {
	kl.k.t.Helper()
	kl.waitReadyIs(func(status string) bool { return status == "True" }, "Ready", timeout)
}

// WaitNotReady waits until the API server shows the node not Ready
// (False: its kubelet says so; Unknown: its kubelet went silent).
func (kl *NodeKubelet) WaitNotReady(timeout time.Duration) {
	kl.k.t.Helper()
	kl.waitReadyIs(func(status string) bool { return status == "False" || status == "Unknown" }, "NotReady", timeout)
}

func (kl *NodeKubelet) waitReadyIs(ok func(string) bool, what string, timeout time.Duration) {
	t, k, name := kl.k.t, kl.k, kl.node.Name
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(500 * time.Millisecond) {
		out, err := k.Kubectl("get", "node", name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && ok(out) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not %s after %s: Ready=%s %v\nits kubelet's log tail:\n%s", name, what, timeout, out, err, tail(k.Log("kubelet-"+name), 4000))
		}
	}
}

// StartNodeKubeProxy runs kube-proxy on node in nftables mode: its tables
// are in the node's network namespace, where the node's pods' traffic to
// a ClusterIP is rewritten, and go with it. It masquerades all Service
// traffic, so that a pod reaching a Service endpoint on its own node's
// bridge (where replies do not pass the node's conntrack) gets its
// answer, and the service range is routed into a bridge without ports, so that
// nothing sent to an address kube-proxy does not rewrite leaves the node.
func (k *Kube) StartNodeKubeProxy(node *Node) {
	t := k.t
	t.Helper()
	node.Must(t, "ip", "link", "add", "services", "type", "bridge") // no ports: what reaches it goes nowhere
	node.Must(t, "ip", "link", "set", "services", "up")
	node.Must(t, "ip", "route", "add", ServiceCIDR, "dev", "services")
	k.proxyIdentity.Do(func() { k.issue("kube-proxy", "system:kube-proxy", nil, false, nil) })
	config := filepath.Join(k.Dir, "nodes", node.Name, "kube-proxy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [%s/32]
masqueradeAll: true
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, k.kubeconfig("kube-proxy"), node.Name, node.IP, node.IP)), 0o644); err != nil {
		t.Fatal(err)
	}
	argv := append(node.Wrap(), filepath.Join(k.Bin, "kube-proxy"), "--config="+config, "--v=2")
	done := k.start("kube-proxy-"+node.Name, argv[0], argv[1:]...)
	k.mu.Lock()
	proxy := k.procs[len(k.procs)-1].Process
	k.mu.Unlock()
	t.Cleanup(func() {
		proxy.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			proxy.Kill()
			<-done
		}
	})
	Eventually(t, time.Minute, node.Name+"'s kube-proxy rules", func() bool {
		_, err := node.Run("nft", "list", "table", "ip", "kube-proxy")
		return err == nil
	})
}
