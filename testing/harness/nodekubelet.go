package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// StartNodeKubelet runs a kubelet on node (its namespaces) whose runtime
// is d, a daemon on the same node, as node.Name with node.IP as its
// InternalIP, and waits for the node to be Ready. Its files are below
// k.Dir/nodes/<name>; it stops, and its cgroups go, after the test.
func (k *Kube) StartNodeKubelet(node *Node, d *Daemon) {
	t := k.t
	t.Helper()
	dir := filepath.Join(k.Dir, "nodes", node.Name)
	rootDir, sysctls := filepath.Join(dir, "kubelet"), filepath.Join(dir, "sysctl")
	for _, p := range []string{rootDir, sysctls, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range map[string]string{"overcommit_memory": "1", "panic": "10", "panic_on_oops": "1"} {
		os.WriteFile(filepath.Join(sysctls, name), []byte(v+"\n"), 0o644)
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
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
volumePluginDir: %s
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
resolvConf: ""
clusterDomain: cluster.local
protectKernelDefaults: true
evictionHard: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
syncFrequency: 10s
cgroupRoot: /%s
featureGates: {PodAndContainerStatsFromCRI: true}
`, node.IP, d.Socket, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins"),
		filepath.Join(pki, user+"-serving.crt"), filepath.Join(pki, user+"-serving.key"), filepath.Join(pki, "ca.crt"),
		defaultEvictionHard, cgroupRoot)), 0o644); err != nil {
		t.Fatal(err)
	}
	// kubelet would set host sysctls: its own mount namespace (below the
	// node's) binds those files over.
	argv := append(node.Wrap(), "unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c", fmt.Sprintf(
		"mount --bind %[1]s/overcommit_memory /proc/sys/vm/overcommit_memory && mount --bind %[1]s/panic /proc/sys/kernel/panic && "+
			"mount --bind %[1]s/panic_on_oops /proc/sys/kernel/panic_on_oops && exec %[2]s --config=%[3]s --kubeconfig=%[4]s --root-dir=%[5]s "+
			"--hostname-override=%[6]s --node-ip=%[7]s --node-labels=%[8]s --v=2",
		sysctls, filepath.Join(k.Bin, "kubelet"), config, k.kubeconfig(user), rootDir, node.Name, node.IP, "extraRuntime=virtlet"))
	done := k.start("kubelet-"+node.Name, argv[0], argv[1:]...)
	k.mu.Lock()
	cmd := k.procs[len(k.procs)-1]
	k.mu.Unlock()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		for _, m := range cgroupMounts() {
			if err := RemoveCgroupTree(filepath.Join(m.dir, cgroupRoot)); err != nil {
				t.Errorf("%s's kubelet's cgroups: %v", node.Name, err)
			}
		}
	})
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		out, err := k.Kubectl("get", "node", node.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && out == "True" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready after 3m: %s %v\nits kubelet's log tail:\n%s", node.Name, out, err, tail(k.Log("kubelet-"+node.Name), 4000))
		}
	}
}
