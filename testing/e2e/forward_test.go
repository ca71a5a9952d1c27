package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 84})
	ctrd := harness.StartContainerd(t, tn)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Start("--forward-runtime", ctrd.Endpoint)
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	defer func() {
		if t.Failed() {
			t.Logf("containerd log:\n%s", tail(ctrd.Log(), 4000))
		}
	}()

	c.Must(t, "pull", tinyRef)
	vmPodCfg, vmCtrCfg := vmPod(t, d, "fwd-vm", nil, 160<<20)
	vmSB := c.Must(t, "runp", vmPodCfg)
	vm := c.Must(t, "create", vmSB, vmCtrCfg, vmPodCfg)
	c.Must(t, "start", vm)

	boxPodCfg, boxCtrCfg := containerPod(t, d, "fwd-box", harness.BusyboxImage,
		"nc -ll -p 8080 -e /bin/echo pf-hello & echo hello-from-busybox; while true; do sleep 1; done")
	boxSB := c.Must(t, "runp", boxPodCfg)
	box := c.Must(t, "create", boxSB, boxCtrCfg, boxPodCfg)
	c.Must(t, "start", box)
	defer c.Run("rmp", "-f", boxSB, vmSB)

	t.Run("both run and both are listed", func(t *testing.T) {
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
		for id, want := range map[string]string{vmSB: "SANDBOX_READY", boxSB: "SANDBOX_READY", vm: "CONTAINER_RUNNING", box: "CONTAINER_RUNNING"} {
			if got[id] != want {
				t.Errorf("%s: %q, want %s (pods %+v, containers %+v)", id, got[id], want, pods, ctrs)
			}
		}
		images := c.Must(t, "images", "-o", "json")
		for _, want := range []string{"virtlet.cloud/", harness.BusyboxImage, harness.PauseImage} {
			if !strings.Contains(images, want) {
				t.Errorf("crictl images has no %s:\n%s", want, images)
			}
		}
		// The container pod is containerd's: containerd's own CLI sees it.
		if out := ctrdTasks(t, ctrd); !strings.Contains(out, box) {
			t.Errorf("containerd runs no task %s:\n%s", box, out)
		}
	})

	t.Run("logs, exec, stats and network of the container pod", func(t *testing.T) {
		waitLog(t, c, box, "hello-from-busybox", time.Minute)
		if out := c.Must(t, "exec", "-s", box, "echo", "exec-through-the-forward"); out != "exec-through-the-forward" {
			t.Errorf("exec: %q", out)
		}
		// Streaming exec: the URL is containerd's streaming server.
		if out := c.Must(t, "exec", box, "echo", "streamed-exec"); out != "streamed-exec" {
			t.Errorf("streaming exec: %q", out)
		}
		ips := c.PodNetwork(t, boxSB).IPs
		if len(ips) == 0 || !strings.HasPrefix(ips[0], "198.18.84.") {
			t.Errorf("container pod IPs %v: want one of the test network 198.18.84.0/24", ips)
		}
		// Port-forward: containerd's streaming server, into the pod's netns.
		local := harness.FreePort(t)
		fwd := startCrictl(t, c, "port-forward", boxSB, fmt.Sprintf("%d:8080", local))
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
		var stats struct {
			Stats []struct {
				Attributes struct{ ID string }
				CPU        struct{ UsageCoreNanoSeconds struct{ Value string } } // int64 as a JSON string
			}
		}
		harness.Eventually(t, time.Minute, "stats of both containers", func() bool {
			c.JSON(t, &stats, "stats", "-o", "json")
			seen := 0
			for _, s := range stats.Stats {
				if (s.Attributes.ID == box || s.Attributes.ID == vm) && s.CPU.UsageCoreNanoSeconds.Value != "" && s.CPU.UsageCoreNanoSeconds.Value != "0" {
					seen++
				}
			}
			return seen == 2
		})
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
		c.Must(t, "stop", box)
		c.Must(t, "rm", box)
		c.Must(t, "stopp", boxSB)
		c.Must(t, "rmp", boxSB)
		if out := ctrdTasks(t, ctrd); strings.Contains(out, box) {
			t.Errorf("containerd still runs %s:\n%s", box, out)
		}
		var pods struct{ Items []struct{ ID string } }
		c.JSON(t, &pods, "pods", "-o", "json")
		var ids []string
		for _, p := range pods.Items {
			ids = append(ids, p.ID)
		}
		if !slices.Equal(ids, []string{vmSB}) {
			t.Errorf("pods after removing the container pod: %v, want only the VM pod %s", ids, vmSB)
		}
	})

	t.Run("a forward runtime that is down makes the node not ready, naming it", func(t *testing.T) {
		ctrd.Stop(t)
		var info struct {
			Status struct {
				Conditions []struct {
					Type    string
					Status  bool
					Reason  string
					Message string
				}
			}
		}
		out := c.Must(t, "info")
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("crictl info: %v\n%s", err, out)
		}
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

// ctrdTasks lists containerd's running tasks in the CRI namespace.
func ctrdTasks(t *testing.T, c *harness.Containerd) string {
	t.Helper()
	out, err := c.Ctr("tasks", "ls")
	if err != nil {
		t.Fatalf("ctr tasks ls: %v\n%s", err, out)
	}
	return out
}
