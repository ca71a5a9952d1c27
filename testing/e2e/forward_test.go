package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/debs"
	"github.com/virtlet/virtlet/testing/harness"
)

// containerPod writes a crictl config of a plain container pod (no
// target-runtime annotation, no virtlet handler) and of its busybox
// container running script.
func containerPod(t *testing.T, d *harness.Daemon, name, image, script string) (pod, ctr string) {
	t.Helper()
	pod = harness.WriteJSON(t, d.Dir, name+"-pod.json", map[string]interface{}{
		"metadata":      map[string]interface{}{"name": name, "namespace": "default", "uid": "uid-" + name},
		"log_directory": filepath.Join(d.Dir, "pods", "default_"+name),
		"linux":         map[string]interface{}{},
	})
	ctr = harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
		"metadata": map[string]interface{}{"name": name},
		"image":    map[string]string{"image": image},
		"command":  []string{"/bin/sh", "-c", script},
		"log_path": name + "/0.log",
		"linux":    map[string]interface{}{},
	})
	return pod, ctr
}

// TestForwardToContainerd: with --forward-runtime a node runs VM pods and
// container pods side by side; every call of a container pod is served by
// containerd (containerd 2.2 and runc 1.3, local images), lists merge both,
// and the owner of an ID survives a daemon restart.
func TestForwardToContainerd(t *testing.T) {
	parallel(t)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 84})
	ctrd := harness.StartContainerd(t, tn, harness.ContainerdOptions{})
	d, c := startForwarding(t, tn, ctrd)

	c.Must(t, "pull", tinyRef)
	vmPodCfg, vmCtrCfg := vmPod(t, d, "fwd-vm", nil, 160<<20)
	vmSB := c.Must(t, "runp", vmPodCfg)
	vm := c.Must(t, "create", vmSB, vmCtrCfg, vmPodCfg)
	c.Must(t, "start", vm)

	boxSB, box := runBox(t, c, d)
	defer c.Run("rmp", "-f", boxSB, vmSB)

	t.Run("both run and both are listed", func(t *testing.T) {
		checkListed(t, c, map[string]string{vmSB: "SANDBOX_READY", boxSB: "SANDBOX_READY", vm: "CONTAINER_RUNNING", box: "CONTAINER_RUNNING"})
		checkImages(t, c, "virtlet.cloud/", harness.BusyboxImage, harness.PauseImage)
		// The container pod is containerd's: containerd's own CLI sees it.
		if out := ctrdTasks(t, ctrd); !strings.Contains(out, box) {
			t.Errorf("containerd runs no task %s:\n%s", box, out)
		}
	})

	t.Run("logs, exec, stats and network of the container pod", func(t *testing.T) {
		checkBoxServed(t, c, boxSB, box, tn)
		waitStats(t, c, box, vm)
	})

	t.Run("the VM pod stays Virtlet's", func(t *testing.T) {
		waitLog(t, c, vm, "@@TINY-READY", 3*time.Minute)
		// The exec reaches the guest's agent: the VM answers with its
		// pod's name as host name.
		if out, errOut, err := c.Run("exec", "-s", "--timeout", "60", vm, "hostname"); err != nil || strings.TrimSpace(out) != "fwd-vm" {
			t.Errorf("exec in the VM: %q %v %s", out, err, errOut)
		}
		if strings.Contains(ctrdTasks(t, ctrd), vm) {
			t.Errorf("containerd runs the VM's container %s", vm)
		}
	})

	t.Run("a VM image in a container pod is refused, naming the fix", func(t *testing.T) {
		podCfg, ctrCfg := containerPod(t, d, "fwd-mixup", tinyRef, "true")
		sb := c.Must(t, "runp", podCfg)
		defer c.Run("rmp", "-f", sb)
		_, errOut, err := c.Run("create", sb, ctrCfg, podCfg)
		if err == nil || !strings.Contains(errOut, "kubernetes.io/target-runtime: virtlet.cloud") || !strings.Contains(errOut, "InvalidArgument") {
			t.Fatalf("VM image in a container pod: %v %s", err, errOut)
		}
	})

	t.Run("IDs keep their owner across a daemon restart", func(t *testing.T) {
		d.Stop()
		d.Start("--forward-runtime", ctrd.Endpoint)
		var st struct{ Status struct{ State string } }
		c.JSON(t, &st, "inspect", box)
		if st.Status.State != "CONTAINER_RUNNING" {
			t.Fatalf("container pod after the restart: %+v", st)
		}
		if out := c.Must(t, "exec", "-s", box, "echo", "still-forwarded"); out != "still-forwarded" {
			t.Errorf("exec after the restart: %q", out)
		}
		c.JSON(t, &st, "inspect", vm)
		if st.Status.State != "CONTAINER_RUNNING" {
			t.Fatalf("VM after the restart: %+v", st)
		}
	})

	t.Run("removal goes to the owner and leaves nothing", func(t *testing.T) {
		removeBox(t, c, ctrd, boxSB, box)
		if ids := podIDs(t, c); !slices.Equal(ids, []string{vmSB}) {
			t.Errorf("pods after removing the container pod: %v, want only the VM pod %s", ids, vmSB)
		}
	})

	t.Run("a forward runtime that is down makes the node not ready, naming it", func(t *testing.T) {
		type condition struct {
			Type    string
			Status  bool
			Reason  string
			Message string
		}
		var info struct {
			Status struct{ Conditions []condition }
		}
		readInfo := func() {
			out := c.Must(t, "info")
			info.Status.Conditions = nil
			if err := json.Unmarshal([]byte(out), &info); err != nil {
				t.Fatalf("crictl info: %v\n%s", err, out)
			}
		}
		// The daemon the previous step restarted is ready once it has
		// reconciled its records; only then is the forward the reason.
		harness.Eventually(t, 2*time.Minute, "the restarted daemon to be ready", func() bool {
			readInfo()
			return slices.ContainsFunc(info.Status.Conditions, func(c condition) bool { return c.Type == "RuntimeReady" && c.Status })
		})
		ctrd.Stop(t)
		readInfo()
		for _, cond := range info.Status.Conditions {
			if cond.Type == "RuntimeReady" && (cond.Status || cond.Reason != "ForwardRuntimeUnreachable" || !strings.Contains(cond.Message, ctrd.Endpoint)) {
				t.Errorf("RuntimeReady with containerd down: %+v", cond)
			}
		}
		// VM pods are still served.
		var st struct{ Status struct{ State string } }
		c.JSON(t, &st, "inspect", vm)
		if st.Status.State != "CONTAINER_RUNNING" {
			t.Errorf("VM with containerd down: %+v", st)
		}
	})
}

// TestForwardToDebianContainerd: the container-pod half of
// TestForwardToContainerd against Debian's own containerd and runc (apt's
// candidates, 1.6 and 1.1 on Debian 12: what the README's `apt-get install
// containerd runc` gives a node), run from their .debs: a container pod's
// sandbox, container, logs, exec, port-forward, stats and removal go
// through the daemon's forward to them, and the lists merge them with a
// VM pod's sandbox and a VM image of Virtlet's (no VM runs). The images
// are the local pause and busybox ones.
func TestForwardToDebianContainerd(t *testing.T) {
	parallel(t)
	bin, err := harness.DebianContainerdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := debs.Candidate("containerd")
	if err != nil {
		t.Fatal(err)
	}
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 83})
	ctrd := harness.StartContainerd(t, tn, harness.ContainerdOptions{BinDir: bin})
	d, c := startForwarding(t, tn, ctrd)
	// The containerd serving is the package's: the server reports the
	// package's version as its revision.
	version, err := ctrd.Ctr("version")
	if _, server, _ := strings.Cut(version, "Server:"); err != nil || !strings.Contains(server, "Revision: "+pkg.Version) {
		t.Fatalf("ctr version: %v, want Debian's containerd %s serving:\n%s", err, pkg.Version, version)
	}

	c.Must(t, "pull", tinyRef)
	vmPodCfg, _ := vmPod(t, d, "deb-vm", nil, 160<<20)
	vmSB := c.Must(t, "runp", vmPodCfg)
	boxSB, box := runBox(t, c, d)
	defer c.Run("rmp", "-f", boxSB, vmSB)

	t.Run("the container pod runs on Debian's containerd, listed beside Virtlet's pod", func(t *testing.T) {
		checkListed(t, c, map[string]string{vmSB: "SANDBOX_READY", boxSB: "SANDBOX_READY", box: "CONTAINER_RUNNING"})
		checkImages(t, c, "virtlet.cloud/", harness.BusyboxImage, harness.PauseImage)
		if out := ctrdTasks(t, ctrd); !strings.Contains(out, box) {
			t.Errorf("containerd runs no task %s:\n%s", box, out)
		}
	})

	t.Run("logs, exec, stats and network of the container pod", func(t *testing.T) {
		checkBoxServed(t, c, boxSB, box, tn)
		waitStats(t, c, box)
	})

	t.Run("the node is ready and claims nothing Debian's containerd lacks", func(t *testing.T) {
		rt, _ := d.CRI(t)
		// The runtime is ready once the daemon has reconciled its records
		// with the hypervisor, which a loaded machine may take a while to
		// do after the start (kubelet polls Status the same way).
		var st *runtimeapi.StatusResponse
		harness.Eventually(t, 2*time.Minute, "the runtime reconciled", func() bool {
			var err error
			st, err = rt.Status(context.Background(), &runtimeapi.StatusRequest{})
			if err != nil {
				t.Fatalf("Status: %v", err)
			}
			for _, cond := range st.GetStatus().GetConditions() {
				if cond.Type == runtimeapi.RuntimeReady && !cond.Status && cond.Reason == "Reconciling" {
					return false
				}
			}
			return true
		})
		ready := map[string]bool{}
		for _, cond := range st.GetStatus().GetConditions() {
			ready[cond.Type] = cond.Status
			if !cond.Status {
				t.Errorf("condition %s is false: %s %s", cond.Type, cond.Reason, cond.Message)
			}
		}
		if !ready[runtimeapi.RuntimeReady] || !ready[runtimeapi.NetworkReady] {
			t.Errorf("conditions %v: want RuntimeReady and NetworkReady true", st.GetStatus().GetConditions())
		}
		// containerd 1.6 reports no runtime handlers (a newer CRI field):
		// no handler may tell kubelet of user namespaces or recursive
		// read-only mounts, which it and runc 1.1 cannot give.
		for _, h := range st.GetRuntimeHandlers() {
			if f := h.GetFeatures(); f.GetUserNamespaces() || f.GetRecursiveReadOnlyMounts() {
				t.Errorf("runtime handler %q claims %+v", h.Name, f)
			}
		}
	})

	t.Run("removal goes to containerd and leaves Virtlet's pod", func(t *testing.T) {
		removeBox(t, c, ctrd, boxSB, box)
		if ids := podIDs(t, c); !slices.Equal(ids, []string{vmSB}) {
			t.Errorf("pods after removing the container pod: %v, want only the VM pod %s", ids, vmSB)
		}
	})
}

// startForwarding starts a daemon on the test network that forwards
// container pods to ctrd, and its crictl; containerd's log is shown when
// the test fails.
func startForwarding(t *testing.T, tn *harness.TestNetwork, ctrd *harness.Containerd) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Start("--forward-runtime", ctrd.Endpoint)
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log:\n%s", tail(ctrd.Log(), 4000))
		}
	})
	return d, c
}

// runBox runs the forward tests' container pod through the daemon: a
// sandbox and a busybox container that logs a line and answers one on
// port 8080 (for port-forward). It returns their IDs.
func runBox(t *testing.T, c *harness.Crictl, d *harness.Daemon) (sb, box string) {
	t.Helper()
	podCfg, ctrCfg := containerPod(t, d, "fwd-box", harness.BusyboxImage,
		"nc -ll -p 8080 -e /bin/echo pf-hello & echo hello-from-busybox; while true; do sleep 1; done")
	sb = c.Must(t, "runp", podCfg)
	box = c.Must(t, "create", sb, ctrCfg, podCfg)
	c.Must(t, "start", box)
	return sb, box
}

// checkListed checks that the merged lists (crictl pods and ps) hold each
// sandbox and container ID in its state.
func checkListed(t *testing.T, c *harness.Crictl, want map[string]string) {
	t.Helper()
	var pods struct{ Items []struct{ ID, State string } }
	c.JSON(t, &pods, "pods", "-o", "json")
	var ctrs struct {
		Containers []struct {
			ID    string
			State string
			Image struct{ Image string }
		}
	}
	c.JSON(t, &ctrs, "ps", "-o", "json")
	got := map[string]string{}
	for _, p := range pods.Items {
		got[p.ID] = p.State
	}
	for _, x := range ctrs.Containers {
		got[x.ID] = x.State
	}
	for id, state := range want {
		if got[id] != state {
			t.Errorf("%s: %q, want %s (pods %+v, containers %+v)", id, got[id], state, pods, ctrs)
		}
	}
}

// checkImages checks that the merged image list names each of want.
func checkImages(t *testing.T, c *harness.Crictl, want ...string) {
	t.Helper()
	images := c.Must(t, "images", "-o", "json")
	for _, w := range want {
		if !strings.Contains(images, w) {
			t.Errorf("crictl images has no %s:\n%s", w, images)
		}
	}
}

// checkBoxServed checks what containerd serves for runBox's pod through
// the daemon: its log, exec (synchronous, and streaming through
// containerd's streaming server), its address on the test network, and a
// port-forward into its network namespace.
func checkBoxServed(t *testing.T, c *harness.Crictl, sb, box string, tn *harness.TestNetwork) {
	t.Helper()
	waitLog(t, c, box, "hello-from-busybox", time.Minute)
	if out := c.Must(t, "exec", "-s", box, "echo", "exec-through-the-forward"); out != "exec-through-the-forward" {
		t.Errorf("exec: %q", out)
	}
	if out := c.Must(t, "exec", box, "echo", "streamed-exec"); out != "streamed-exec" {
		t.Errorf("streaming exec: %q", out)
	}
	_, subnet, err := net.ParseCIDR(tn.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	ips := c.PodNetwork(t, sb).IPs
	if len(ips) == 0 || !subnet.Contains(net.ParseIP(ips[0])) {
		t.Errorf("container pod IPs %v: want one of the test network %s", ips, tn.Subnet)
	}
	local := harness.FreePort(t)
	fwd := startCrictl(t, c, "port-forward", sb, fmt.Sprintf("%d:8080", local))
	fwd.waitFor(t, "Forwarding from", 20*time.Second)
	harness.Eventually(t, 30*time.Second, "a line through the port-forward", func() bool {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
		if err != nil {
			return false
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return line == "pf-hello\n"
	})
}

// waitStats waits until crictl stats reports CPU use for each container.
func waitStats(t *testing.T, c *harness.Crictl, ids ...string) {
	t.Helper()
	var stats struct {
		Stats []struct {
			Attributes struct{ ID string }
			CPU        struct{ UsageCoreNanoSeconds struct{ Value string } } // int64 as a JSON string
		}
	}
	harness.Eventually(t, time.Minute, fmt.Sprintf("stats of %d containers", len(ids)), func() bool {
		c.JSON(t, &stats, "stats", "-o", "json")
		seen := 0
		for _, s := range stats.Stats {
			if slices.Contains(ids, s.Attributes.ID) && s.CPU.UsageCoreNanoSeconds.Value != "" && s.CPU.UsageCoreNanoSeconds.Value != "0" {
				seen++
			}
		}
		return seen == len(ids)
	})
}

// removeBox stops and removes runBox's container and pod through the
// daemon and checks that containerd no longer runs the container.
func removeBox(t *testing.T, c *harness.Crictl, ctrd *harness.Containerd, sb, box string) {
	t.Helper()
	c.Must(t, "stop", box)
	c.Must(t, "rm", box)
	c.Must(t, "stopp", sb)
	c.Must(t, "rmp", sb)
	if out := ctrdTasks(t, ctrd); strings.Contains(out, box) {
		t.Errorf("containerd still runs %s:\n%s", box, out)
	}
}

// podIDs lists the IDs of the merged pod list.
func podIDs(t *testing.T, c *harness.Crictl) []string {
	t.Helper()
	var pods struct{ Items []struct{ ID string } }
	c.JSON(t, &pods, "pods", "-o", "json")
	var ids []string
	for _, p := range pods.Items {
		ids = append(ids, p.ID)
	}
	return ids
}

// ctrdTasks lists containerd's running tasks in the CRI namespace.
func ctrdTasks(t *testing.T, c *harness.Containerd) string {
	t.Helper()
	out, err := c.Ctr("tasks", "ls")
	if err != nil {
		t.Fatalf("ctr tasks ls: %v\n%s", err, out)
	}
	return out
}
