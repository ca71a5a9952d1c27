package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// virtletctl against a real API server and kubelet (v1.36, built from the
// Go module proxy) whose runtime is the daemon: a VM pod applied with
// kubectl runs the cloud image; `virtletctl ssh` runs a command in the
// guest through the API server's port-forward (also as the kubectl plugin
// `kubectl virtlet`); virsh, status, diag, vnc and version reach the node's daemon
// through the pod's exec subresource; kubectl exec runs through the guest
// agent; kubelet's summary API shows the VM's usage.
func TestKubeVirtletctlThroughTheAPIServer(t *testing.T) {
	parallel(t)
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	ctlDir := t.TempDir()
	ctl := filepath.Join(ctlDir, "virtletctl")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/virtlet/virtlet/plugins/buildinfo.version=v0.0.0-virtletctl", "-o", ctl, "./cmd/virtletctl")
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build virtletctl: %v\n%s", err, out)
	}
	os.Symlink(ctl, filepath.Join(ctlDir, "kubectl-virtlet"))

	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 81})
	cloudTr := cloudTranslation(t)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("cloud.yaml", cloudTr)
	d.Translate("test-images.yaml", translation)
	d.Start()
	k := harness.StartControlPlane(t, kubeBin)
	// kubelet takes a pod's usage from the runtime (the VM's), not from
	// the pod's cgroup, which QEMU is not in.
	k.FeatureGates = "{PodAndContainerStatsFromCRI: true}"
	k.StartKubelet(d)
	key, pub := sshKey(t)

	manifest := filepath.Join(t.TempDir(), "pod.yaml")
	pubJSON, _ := json.Marshal(pub)
	// root logged in on the display's console, for vnc --web: by UEFI
	// the cloud image boots Debian's kernel, which has text consoles on
	// the display (the BIOS path's own kernel has none).
	autologinJSON, _ := json.Marshal(autologinUserData)
	os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: ctl-vm
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletVCPUCount: "1"
    VirtletSSHKeys: %s
    VirtletCloudInitUserData: %s
    VirtletFirmware: uefi
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers:
  - name: ctl-vm
    image: virtlet.cloud/debian-cloud
    tty: true
    stdin: true
    resources:
      limits: {memory: 512Mi}
`, pubJSON, autologinJSON, k.Node)), 0o644)
	if out, err := k.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v %s", err, out)
	}
	t.Cleanup(func() { k.Kubectl("delete", "pod", "ctl-vm", "--grace-period=0", "--force", "--wait=false") })
	if out, err := k.Kubectl("wait", "--for=condition=Ready", "pod/ctl-vm", "--timeout=5m"); err != nil {
		describe, _ := k.Kubectl("describe", "pod", "ctl-vm")
		t.Fatalf("the VM pod is not Ready: %v %s\n%s\nkubelet log:\n%s", err, out, describe, tail(k.Log("kubelet"), 4000))
	}
	started := time.Now()

	run := func(args ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, ctl, append([]string{"--kubeconfig", k.Kubeconfig}, args...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}

	var out, errOut string
	deadline := time.Now().Add(8 * time.Minute)
	for {
		out, errOut, err = run("ssh", "-i", key, "debian@ctl-vm", "--", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "echo ssh-ok from $(hostname)")
		if err == nil && strings.Contains(out, "ssh-ok from ctl-vm") {
			break
		}
		if time.Now().After(deadline) {
			logs, _ := k.Kubectl("logs", "ctl-vm")
			t.Fatalf("virtletctl ssh never worked: %v\nstdout: %s\nstderr: %s\nconsole:\n%s", err, out, errOut, tail(logs, 3000))
		}
		time.Sleep(3 * time.Second)
	}
	t.Logf("virtletctl ssh through the API server %s after the pod was Ready", time.Since(started).Round(time.Second))

	// As the kubectl plugin.
	// kubectl takes no flags before a plugin's name: the kubeconfig comes
	// from the environment.
	kubectl := exec.Command(filepath.Join(kubeBin, "kubectl"), "virtlet", "ssh", "-i", key, "debian@ctl-vm", "--", "-o", "BatchMode=yes", "uname -n")
	kubectl.Env = append(os.Environ(), "PATH="+ctlDir+":"+os.Getenv("PATH"), "KUBECONFIG="+k.Kubeconfig)
	if b, err := kubectl.CombinedOutput(); err != nil || !strings.Contains(string(b), "ctl-vm") {
		t.Errorf("kubectl virtlet ssh: %v %s", err, b)
	}

	// Without -i: virtletctl picks the key in ~/.ssh that the pod's
	// VirtletSSHKeys accepts, under a name ssh would not try by itself.
	home := t.TempDir()
	os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
	for _, f := range []string{"", ".pub"} {
		b, _ := os.ReadFile(key + f)
		os.WriteFile(filepath.Join(home, ".ssh", "vm_key"+f), b, 0o600)
	}
	noI := exec.Command(ctl, "--kubeconfig", k.Kubeconfig, "ssh", "debian@ctl-vm", "--", "-o", "BatchMode=yes", "-o", "IdentityAgent=none", "echo picked-key")
	noI.Env = append(os.Environ(), "HOME="+home)
	if b, err := noI.CombinedOutput(); err != nil || !strings.Contains(string(b), "picked-key") {
		t.Errorf("virtletctl ssh without -i, the pod's key in ~/.ssh/vm_key: %v %s", err, b)
	}

	t.Run("kubectl exec through the guest agent", func(t *testing.T) {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			out, err := k.Kubectl("exec", "ctl-vm", "--", "hostname")
			if err == nil && out == "ctl-vm" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kubectl exec hostname: %v %s", err, out)
			}
			time.Sleep(3 * time.Second)
		}
		out, err := k.Kubectl("exec", "ctl-vm", "--", "sh", "-c", "exit 3")
		if err == nil || !strings.Contains(out, "exit code 3") {
			t.Errorf("kubectl exec exit 3: %v %s", err, out)
		}
	})

	t.Run("status", func(t *testing.T) {
		out, errOut, err := run("status", "ctl-vm")
		podIP, _ := k.Kubectl("get", "pod", "ctl-vm", "-o", "jsonpath={.status.podIP}")
		for _, want := range []string{"State:       running for ", "Guest OS:    Debian GNU/Linux 12 (bookworm) (kernel ", "Hostname:    ctl-vm", " " + strings.TrimSpace(podIP) + "/"} {
			if err != nil || !strings.Contains(out, want) {
				t.Errorf("virtletctl status lacks %q: %v\n%s%s", want, err, out, errOut)
			}
		}
	})

	t.Run("virsh", func(t *testing.T) {
		out, errOut, err := run("virsh", "ctl-vm", "--", "dominfo")
		if err != nil || !strings.Contains(out, "running") || !strings.Contains(out, "virtlet-") {
			t.Fatalf("virsh dominfo: %v %s %s", err, out, errOut)
		}
		_, errOut, err = run("virsh", "ctl-vm", "--", "destroy")
		if err == nil || !strings.Contains(errOut, "only commands that read") {
			t.Fatalf("virsh destroy: %v %s", err, errOut)
		}
		// Nothing reaches another domain: domstats takes no domain list,
		// and no option names a domain or a connection.
		for _, args := range [][]string{{"domstats", "virtlet-other"}, {"dominfo", "--domain", "virtlet-other"}, {"dumpxml", "--connect=qemu:///system"}} {
			_, errOut, err = run(append([]string{"virsh", "ctl-vm", "--"}, args...)...)
			if err == nil || !strings.Contains(errOut, "virsh "+args[0]) {
				t.Errorf("virsh %v: %v %s", args, err, errOut)
			}
		}
		// Virtlet's form: the pod as @POD among virsh's arguments.
		if out, errOut, err := run("virsh", "domstate", "@ctl-vm"); err != nil || !strings.Contains(out, "running") {
			t.Fatalf("virsh domstate @ctl-vm (the VM after a refused destroy): %v %s %s", err, out, errOut)
		}
	})

	t.Run("diag dump", func(t *testing.T) {
		out, errOut, err := run("diag", "dump", "--json")
		if err != nil {
			t.Fatalf("diag dump: %v %s", err, errOut)
		}
		var report struct {
			Pods []struct {
				Pod         string
				Node        string
				Diagnostics struct {
					Version    string
					VMs        map[string]struct{ Definition string }
					PluginLogs []json.RawMessage
					Plugins    map[string]struct {
						State    string
						Restarts int
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil || len(report.Pods) != 1 {
			t.Fatalf("diag dump --json: %v\n%s", err, out)
		}
		p := report.Pods[0].Diagnostics
		if p.Version != harness.Version || len(p.VMs) != 1 || len(p.PluginLogs) == 0 {
			t.Fatalf("diagnostics: version %q (want %q), %d VMs (want 1), %d plugin log lines (want some)", p.Version, harness.Version, len(p.VMs), len(p.PluginLogs))
		}
		// The plugin never went: the look into the pod's network
		// namespace ends a thread of the daemon, which once took the
		// plugin it had forked with it.
		if lv := p.Plugins["libvirt"]; lv.State != "running" || lv.Restarts != 0 {
			t.Fatalf("the libvirt plugin is %s after %d restarts; its last words:\n%s", lv.State, lv.Restarts, pluginWords(d, "libvirt"))
		}
		for _, vm := range p.VMs {
			if !strings.Contains(vm.Definition, "org.qemu.guest_agent.0") {
				t.Errorf("the domain XML lacks the agent channel")
			}
		}
		dir := t.TempDir()
		if _, errOut, err := run("diag", "dump", dir); err != nil {
			t.Fatalf("diag dump DIR: %v %s", err, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, k.Node, "default_ctl-vm", "plugin-logs.txt")); err != nil {
			t.Error(err)
		}
	})

	t.Run("vnc", func(t *testing.T) {
		port := harness.FreePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The local port after the pod, as Virtlet's virtletctl took it.
		vnc := exec.CommandContext(ctx, ctl, "--kubeconfig", k.Kubeconfig, "vnc", "ctl-vm", strconv.Itoa(port))
		stdout, _ := vnc.StdoutPipe()
		vnc.Stderr = os.Stderr
		if err := vnc.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); vnc.Wait() }() // virtletctl vnc serves until stopped
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		if !strings.Contains(line, fmt.Sprintf("127.0.0.1:%d", port)) {
			t.Fatalf("virtletctl vnc says %q", line)
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		banner := make([]byte, 12)
		_, err = io.ReadFull(conn, banner)
		conn.Close()
		if err != nil || !strings.HasPrefix(string(banner), "RFB 003.") {
			t.Fatalf("VNC banner %q %v; the libvirt plugin's last words:\n%s", banner, err, pluginWords(d, "libvirt"))
		}
	})

	t.Run("vnc --web", func(t *testing.T) { vncWebInBrowser(t, k, d, ctl, "ctl-vm") })

	t.Run("version", func(t *testing.T) {
		out, errOut, err := run("version")
		if err != nil || !strings.Contains(out, "client: v0.0.0-virtletctl") || !strings.Contains(out, "node "+k.Node+": virtlet "+strings.TrimPrefix(harness.Version, "v")) {
			t.Fatalf("version: %v %s %s", err, out, errOut)
		}
		if out, errOut, err := run("--version"); err != nil || strings.TrimSpace(out) != "virtletctl v0.0.0-virtletctl" {
			t.Errorf("--version: %v %q %s", err, out, errOut)
		}
		// Every shipped plugin reports the build's version (stamped into
		// every binary), as the daemon logs it when the plugin starts.
		running := pluginVersions(d.Log())
		for _, p := range plugins() {
			if v := running[p.Name]; v != harness.Version {
				t.Errorf("plugin %s reports version %q, want the build's %q", p.Name, v, harness.Version)
			}
		}
	})

	t.Run("validate", func(t *testing.T) {
		// Before the install's cluster objects: the node is not a Virtlet
		// node yet, and there is no RuntimeClass.
		out, _, err := run("validate")
		if err == nil || !strings.Contains(out, "problem: no node has the label extraRuntime=virtlet") ||
			!strings.Contains(out, "problem: RuntimeClass virtlet does not exist") {
			t.Fatalf("validate before gen: %v\n%s", err, out)
		}
		objects, errOut, err := run("gen", "--node", k.Node)
		if err != nil {
			t.Fatalf("gen: %v %s", err, errOut)
		}
		file := filepath.Join(t.TempDir(), "virtlet.yaml")
		os.WriteFile(file, []byte(objects), 0o644)
		if out, err := k.Kubectl("apply", "-f", file); err != nil {
			t.Fatalf("kubectl apply gen's objects: %v %s", err, out)
		}
		// kubelet's configuration comes through the API server's node
		// proxy, which refuses this kubelet: it listens on a loopback
		// address. validate says it could not check it.
		out, errOut, err = run("validate")
		if err != nil || !strings.Contains(out, "node "+k.Node+": ready; runtime virtlet://") || !strings.Contains(out, "validation successful") ||
			!strings.Contains(out, "warning: node "+k.Node+": not checked: kubelet's configuration") || !strings.Contains(out, "address not allowed") {
			t.Fatalf("validate after gen: %v\n%s%s", err, out, errOut)
		}
		// The fields validate reads are those of kubelet's /configz (read
		// here as the API server would).
		raw, err := k.KubeletGet("/configz")
		var configz struct {
			KubeletConfig map[string]any `json:"kubeletconfig"`
		}
		if err != nil || json.Unmarshal([]byte(raw), &configz) != nil || configz.KubeletConfig["containerRuntimeEndpoint"] != "unix://"+d.Socket {
			t.Errorf("kubelet's /configz has no containerRuntimeEndpoint %q: %v %.300s", "unix://"+d.Socket, err, raw)
		}
		if gates, _ := configz.KubeletConfig["featureGates"].(map[string]any); gates["PodAndContainerStatsFromCRI"] != true {
			t.Errorf("kubelet's /configz has no featureGates.PodAndContainerStatsFromCRI: %v", configz.KubeletConfig["featureGates"])
		}
	})

	t.Run("kubelet's summary API", func(t *testing.T) {
		// The pod's figures are what its QEMU costs the node, within 10 %:
		// its resident memory, and its CPU time.
		untilQEMUAgrees(t, k, d, "ctl-vm", "the summary API's pod figures", func(q qemuSpan) (bool, string) {
			pod, err := podSummary(k, "ctl-vm")
			q = q.after()
			ok := err == nil && pod.CPU.UsageCoreNanoSeconds > 0 && pod.Memory.WorkingSetBytes > 0 &&
				q.rssWithin(float64(pod.Memory.WorkingSetBytes), 0.1) && q.cpuWithin(float64(pod.CPU.UsageCoreNanoSeconds), 0.1)
			return ok, fmt.Sprintf("working set %d, CPU %d ns (%v); %s", pod.Memory.WorkingSetBytes, pod.CPU.UsageCoreNanoSeconds, err, q)
		})
	})

	t.Run("kubelet's /metrics/cadvisor", func(t *testing.T) {
		// With PodAndContainerStatsFromCRI kubelet's cAdvisor endpoint is
		// made of the runtime's metrics alone: the VM pod's series are
		// there, in cAdvisor's names, the pod's (container="") at what its
		// QEMU costs, its network per interface.
		untilQEMUAgrees(t, k, d, "ctl-vm", "kubelet's /metrics/cadvisor", func(q qemuSpan) (bool, string) {
			raw, err := k.KubeletGet("/metrics/cadvisor")
			q = q.after()
			series := func(name, labels string) (float64, bool) {
				m := regexp.MustCompile(`(?m)^` + name + `\{` + labels + `\} ([0-9.e+]+)`).FindStringSubmatch(raw)
				if m == nil {
					return 0, false
				}
				v, err := strconv.ParseFloat(m[1], 64)
				return v, err == nil
			}
			podCPU, ok1 := series("container_cpu_usage_seconds_total", `container="",id="[0-9a-f]+",namespace="default",pod="ctl-vm"`)
			podWS, ok2 := series("container_memory_working_set_bytes", `container="",id="[0-9a-f]+",namespace="default",pod="ctl-vm"`)
			vmWS, ok3 := series("container_memory_working_set_bytes", `container="ctl-vm",id="[0-9a-f]+",namespace="default",pod="ctl-vm"`)
			rx, ok4 := series("container_network_receive_bytes_total", `id="[0-9a-f]+",interface="eth0",namespace="default",pod="ctl-vm"`)
			// CRI's metric values are whole numbers: CPU in whole seconds.
			ok := err == nil && ok1 && ok2 && ok3 && ok4 && rx > 0 && vmWS > 0 && q.rssWithin(podWS, 0.1) &&
				podCPU >= float64(q.cpu0/time.Second)-1 && podCPU <= float64(q.cpu1/time.Second)+1
			detail := fmt.Sprintf("pod CPU %.0f s, working set %.0f, the guest's %.0f, eth0 received %.0f bytes (%v); %s", podCPU, podWS, vmWS, rx, err, q)
			if !ok {
				detail += "; the pod's series:"
				for _, l := range strings.Split(raw, "\n") {
					if strings.Contains(l, "ctl-vm") {
						detail += "\n" + l
					}
				}
			}
			return ok, detail
		})
	})

	t.Run("run strategies", func(t *testing.T) {
		runStrategies(t, k, run)
	})

	if out, err := k.Kubectl("delete", "pod", "ctl-vm", "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete: %v %s", err, out)
	}
	c := d.Crictl(crictl)
	harness.Eventually(t, 2*time.Minute, "the pod's VM removed", func() bool { return len(harness.DomainsUsing(d.Dir)) == 0 })
	if out := c.Must(t, "ps", "-a", "-q"); out != "" {
		t.Errorf("containers left after kubectl delete: %s", out)
	}
}

// pluginWords is what the daemon's log says a plugin's process printed
// (its stderr, a panic) and of its exits, the last 60 lines.
func pluginWords(d *harness.Daemon, plugin string) string {
	var out []string
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, `"plugin":"`+plugin+`"`) && (strings.Contains(l, `"level":"error"`) || strings.Contains(l, `"level":"warning"`) ||
			strings.Contains(l, "panic") || strings.Contains(l, "exit") || strings.Contains(l, "stderr") || strings.Contains(l, "goroutine")) {
			out = append(out, l)
		}
	}
	if len(out) > 60 {
		out = out[len(out)-60:]
	}
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func head(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// runStrategies: virtletctl stop, start and restart on the VM of a
// StatefulSet (the tiny guest, an exec readiness probe through its agent):
// stop takes the pod out of service (not Ready) without a restart or a new
// container, status says halted, start brings back the same VM with the
// file written on its disk before the stop, restart power-cycles it; the
// restart count stays 0 throughout.
func runStrategies(t *testing.T, k *harness.Kube, run func(args ...string) (string, string, error)) {
	if err := k.Apply(fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: halt
spec:
  serviceName: halt
  replicas: 1
  selector:
    matchLabels: {app: halt}
  template:
    metadata:
      labels: {app: halt}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
    spec:
      nodeName: %s
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 10
      containers:
      - name: vm
        image: virtlet.cloud/tiny
        tty: true
        stdin: true
        resources:
          limits: {memory: 256Mi}
        readinessProbe:
          exec: {command: [cat, /proc/uptime]}
          periodSeconds: 2
          timeoutSeconds: 5
          failureThreshold: 1
`, k.Node)); err != nil {
		t.Fatal(err)
	}
	defer k.Kubectl("delete", "statefulset", "halt", "--wait=false")
	ready := func(want string) func() bool {
		return func() bool {
			out, _ := k.Kubectl("get", "pod", "halt-0", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return out == want
		}
	}
	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(4 * time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				describe, _ := k.Kubectl("describe", "pod", "halt-0")
				logs, _ := k.Kubectl("logs", "halt-0")
				t.Fatalf("%s: not after 4m\n%s\nconsole:\n%s", what, describe, tail(logs, 2000))
			}
			time.Sleep(time.Second)
		}
	}
	wait("halt-0 Ready", ready("True"))
	if out, err := k.Kubectl("exec", "halt-0", "--", "sh", "-c", keepMarker); err != nil {
		t.Fatalf("write a file on the VM's disk: %v %s", err, out)
	}
	uid, _ := k.Kubectl("get", "pod", "halt-0", "-o", "jsonpath={.metadata.uid}")
	containerID, _ := k.Kubectl("get", "pod", "halt-0", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	same := func(when string) {
		t.Helper()
		out, _ := k.Kubectl("get", "pod", "halt-0", "-o", "jsonpath={.metadata.uid} {.status.phase} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}")
		if want := uid + " Running " + containerID + " 0"; out != want {
			t.Errorf("%s: pod %q, want %q (same pod and container, no restart)", when, out, want)
		}
	}

	out, errOut, err := run("stop", "halt-0", "--grace-period", "20s")
	if err != nil || !strings.Contains(out, "halted") {
		t.Fatalf("virtletctl stop: %v %s %s", err, out, errOut)
	}
	wait("halt-0 not Ready while its VM is halted", ready("False"))
	same("halted")
	if out, _, _ := run("status", "halt-0"); !regexp.MustCompile(`State:\s+halted for `).MatchString(out) || !strings.Contains(out, "no answer: the VM is halted") {
		t.Errorf("virtletctl status of a halted VM:\n%s", out)
	}
	if out, err := k.Kubectl("exec", "halt-0", "--", "true"); err == nil || !strings.Contains(out, "halted") {
		t.Errorf("kubectl exec into a halted VM: %v %s", err, out)
	}

	if out, errOut, err := run("start", "halt-0"); err != nil || !strings.Contains(out, "started") {
		t.Fatalf("virtletctl start: %v %s %s", err, out, errOut)
	}
	wait("halt-0 Ready again after start", ready("True"))
	if out, err := k.Kubectl("exec", "halt-0", "--", "sh", "-c", readMarker); err != nil || out != "kept-across-boots" {
		t.Errorf("the file written before the stop, after start: %v %q", err, out)
	}
	same("started")

	if out, errOut, err := run("restart", "halt-0", "--grace-period", "20s"); err != nil || !strings.Contains(out, "restarted") {
		t.Fatalf("virtletctl restart: %v %s %s", err, out, errOut)
	}
	wait("halt-0 Ready after restart", ready("True"))
	if out, err := k.Kubectl("exec", "halt-0", "--", "sh", "-c", readMarker); err != nil || out != "kept-across-boots" {
		t.Errorf("the file written before the stop, after restart: %v %q", err, out)
	}
	same("restarted")
	// kubectl logs is the console of every boot.
	wait("kubectl logs to show 3 boots (first, start, restart)", func() bool {
		logs, _ := k.Kubectl("logs", "halt-0")
		return strings.Count(logs, "@@TINY-READY") == 3
	})
	if out, err := k.Kubectl("delete", "statefulset", "halt", "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete statefulset: %v %s", err, out)
	}
	wait("halt-0 gone", func() bool { _, err := k.Kubectl("get", "pod", "halt-0"); return err != nil })
}

// pluginVersions reads, from a daemon's JSON log, the version each plugin
// reported when it started (its latest start).
func pluginVersions(log string) map[string]string {
	out := map[string]string{}
	for _, e := range harness.LogEntries(log) {
		if name, ok := e["plugin"].(string); ok && e["msg"] == "plugin running" {
			out[name], _ = e["version"].(string)
		}
	}
	return out
}

// podStats is a pod's part of kubelet's summary API.
type podStats struct {
	CPU    struct{ UsageCoreNanoSeconds uint64 }
	Memory struct{ WorkingSetBytes uint64 }
}

// podSummary reads a pod's figures from kubelet's summary API, straight
// from the kubelet: the API server's node proxy refuses loopback
// addresses.
func podSummary(k *harness.Kube, name string) (podStats, error) {
	raw, err := k.KubeletGet("/stats/summary")
	if err != nil {
		return podStats{}, err
	}
	var summary struct {
		Pods []struct {
			PodRef struct{ Name string }
			podStats
		}
	}
	if err := json.Unmarshal([]byte(raw), &summary); err != nil {
		return podStats{}, err
	}
	for _, p := range summary.Pods {
		if p.PodRef.Name == name {
			return p.podStats, nil
		}
	}
	return podStats{}, fmt.Errorf("no pod %s in the summary", name)
}

// qemuSpan is a pod's QEMU's CPU time and resident memory before a
// reading of kubelet's (cpu0, rss0) and after it (cpu1, rss1).
type qemuSpan struct {
	pid        int
	domain     string
	cpu0, cpu1 time.Duration
	rss0, rss1 int64
}

// after samples QEMU again, after the reading.
func (q qemuSpan) after() qemuSpan {
	q.cpu1, q.rss1 = harness.ProcessCPU(q.pid), harness.QEMURSS(q.domain)
	return q
}

func (q qemuSpan) rssWithin(v, tol float64) bool {
	return within(v, float64(min(q.rss0, q.rss1)), float64(max(q.rss0, q.rss1)), tol)
}

func (q qemuSpan) cpuWithin(nanos, tol float64) bool {
	return within(nanos, float64(q.cpu0), float64(q.cpu1), tol)
}

func (q qemuSpan) String() string {
	return fmt.Sprintf("QEMU: RSS %d–%d, CPU %.1f–%.1f s", q.rss0, q.rss1, q.cpu0.Seconds(), q.cpu1.Seconds())
}

// untilQEMUAgrees reads kubelet's figures of the pod (read, which calls
// after once it has them) until they agree with its QEMU's own, for two
// minutes; it logs them, or fails with what read last said.
func untilQEMUAgrees(t *testing.T, k *harness.Kube, d *harness.Daemon, pod, what string, read func(qemuSpan) (bool, string)) {
	t.Helper()
	q := qemuSpan{domain: vmDomain(t, k, d, pod)}
	qemu, err := harness.QEMUPID(q.domain)
	if err != nil {
		t.Fatal(err)
	}
	q.pid, _ = strconv.Atoi(qemu)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		q.cpu0, q.rss0 = harness.ProcessCPU(q.pid), harness.QEMURSS(q.domain)
		ok, detail := read(q)
		if ok {
			t.Logf("%s of pod %s: %s", what, pod, detail)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of pod %s are not its QEMU's: %s", what, pod, detail)
		}
		time.Sleep(5 * time.Second)
	}
}

// within tells whether v lies in [lo, hi] widened by the fraction tol.
func within(v, lo, hi, tol float64) bool {
	return v >= lo*(1-tol) && v <= hi*(1+tol)
}

// vmDomain is the libvirt domain of a kube VM pod's VM, as the daemon
// reports it.
func vmDomain(t *testing.T, k *harness.Kube, d *harness.Daemon, pod string) string {
	t.Helper()
	id, err := k.Kubectl("get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	if err != nil || !strings.HasPrefix(id, "virtlet://") {
		t.Fatalf("pod %s's container ID: %v %q", pod, err, id)
	}
	return inspectCtr(t, d.Crictl(crictl), strings.TrimPrefix(id, "virtlet://")).VM.Name
}
