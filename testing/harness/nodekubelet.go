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
	for _, p := range []string{rootDir, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSysctls(sysctls); err != nil {
		t.Fatal(err)
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
	if err := os.WriteFile(config, []byte("featureGates: {PodAndContainerStatsFromCRI: true}\n"+settings.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	// kubelet would set host sysctls: its own mount namespace (below the
	// node's) binds those files over.
	argv := append(node.Wrap(), "unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c",
		kubeletCommand(sysctls, filepath.Join(k.Bin, "kubelet"), config, k.kubeconfig(user), rootDir,
			"--hostname-override="+node.Name, "--node-ip="+node.IP, "--node-labels=extraRuntime=virtlet"))
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
