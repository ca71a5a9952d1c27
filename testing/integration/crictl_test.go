// Package integration drives the real daemon, as a separate process with
// its plugins as separate processes, with the real crictl (cri-tools
// v1.34.0). The hypervisor here is the test-only fake plugin; the real-VM
// suites live in testing/e2e.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/cni"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/harness"
)

var (
	bins   string // built binaries
	crictl string
)

func TestMain(m *testing.M) {
	var err error
	if crictl, err = harness.Tool("crictl", "CRICTL"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if bins, err = os.MkdirTemp("", "virtlet-integration-bin-"); err != nil {
		panic(err)
	}
	err = harness.Build(bins, map[string]string{
		"virtlet-fake-plugin":        "github.com/virtlet/virtlet/testing/fakeplugin",
		"virtlet-example-scratch":    "github.com/virtlet/virtlet/examples/scratch-volume",
		"virtlet-plugin-nocloud":     "github.com/virtlet/virtlet/cmd/virtlet-plugin-nocloud",
		"virtlet-plugin-configdrive": "github.com/virtlet/virtlet/cmd/virtlet-plugin-configdrive",
		"virtlet-plugin-cni":         "github.com/virtlet/virtlet/cmd/virtlet-plugin-cni",
		"virtlet-plugin-qcow2":       "github.com/virtlet/virtlet/cmd/virtlet-plugin-qcow2",
		"virtlet-plugin-raw":         "github.com/virtlet/virtlet/cmd/virtlet-plugin-raw",
		"virtlet-plugin-ninep":       "github.com/virtlet/virtlet/cmd/virtlet-plugin-ninep",
		"virtlet-plugin-ceph":        "github.com/virtlet/virtlet/cmd/virtlet-plugin-ceph",
		"virtlet-flexvolume-driver":  "github.com/virtlet/virtlet/cmd/virtlet-flexvolume-driver",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The CNI plugin installs its host-bridge firewall rules for good; the
	// suite leaves the host's firewall as it found it.
	firewall := cni.HostBridgeRuleState()
	code := m.Run()
	cni.RestoreHostBridgeRules(firewall)
	os.RemoveAll(bins)
	os.Exit(code)
}

func startDaemon(t *testing.T, extra ...harness.Plugin) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	return startDaemonWith(t, nil, extra...)
}

// startDaemonWith is startDaemon with extra daemon arguments.
func startDaemonWith(t *testing.T, args []string, extra ...harness.Plugin) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	fake := filepath.Join(bins, "virtlet-fake-plugin")
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append([]harness.Plugin{
		{Name: "fake-hypervisor", Kind: "hypervisor", Binary: fake, Args: []string{"hypervisor"}},
		{Name: "fake-images", Kind: "image", Binary: fake, Args: []string{"image"}},
		{Name: "scratch", Kind: "volume", Binary: filepath.Join(bins, "virtlet-example-scratch")},
		{Name: "nocloud", Kind: "datasource", Binary: filepath.Join(bins, "virtlet-plugin-nocloud")},
		{Name: "configdrive", Kind: "datasource", Binary: filepath.Join(bins, "virtlet-plugin-configdrive")},
	}, extra...))
	d.Start(args...)
	return d, d.Crictl(crictl)
}

// pluginCount is the number of plugin processes startDaemon runs.
const pluginCount = 5

const image = "virtlet.cloud/example.com/tiny.qcow2"

// vmPod writes the CRI pod and container configs of a VM pod the way
// kubelet would send them for the cirros-vm example (docs/vm-pods.md), and returns their paths.
func vmPod(t *testing.T, d *harness.Daemon, name string, annotations map[string]string) (pod, ctr string) {
	t.Helper()
	ann := map[string]string{
		"kubernetes.io/target-runtime": "virtlet.cloud",
		"VirtletVCPUCount":             "2",
		"VirtletDiskDriver":            "virtio",
		"VirtletRootVolumeSize":        "1Gi",
		"VirtletSSHKeys":               "ssh-rsa AAAAB3NzaC1yc2E me@localhost\n",
	}
	for k, v := range annotations {
		if v == "" {
			delete(ann, k)
		} else {
			ann[k] = v
		}
	}
	podCfg := map[string]interface{}{
		"metadata":      map[string]interface{}{"name": name, "namespace": "default", "uid": "uid-" + name, "attempt": 0},
		"annotations":   ann,
		"labels":        map[string]string{"app": name},
		"log_directory": filepath.Join(d.Dir, "pods", "default_"+name),
	}
	ctrCfg := map[string]interface{}{
		"metadata": map[string]interface{}{"name": name},
		"image":    map[string]string{"image": image},
		"log_path": name + "/0.log",
		"linux":    map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 160 << 20}},
		"labels":   map[string]string{"vm": name},
		"envs":     []map[string]string{{"key": "MY_FOO_VAR", "value": "foo"}},
		"tty":      true,
		"stdin":    true,
	}
	return harness.WriteJSON(t, d.Dir, name+"-pod.json", podCfg), harness.WriteJSON(t, d.Dir, name+"-ctr.json", ctrCfg)
}

var hexID = regexp.MustCompile(`^[0-9a-f]{64}$`)

type containerInspect struct {
	Status struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		ExitCode int    `json:"exitCode"`
		Reason   string `json:"reason"`
		LogPath  string `json:"logPath"`
		Image    struct {
			Image string `json:"image"`
		} `json:"image"`
		ImageRef string `json:"imageRef"`
	} `json:"status"`
	// crictl merges the verbose info into the top level.
	VM struct {
		Name        string `json:"name"`
		VCPUs       int    `json:"vcpus"`
		MemoryBytes int64  `json:"memoryBytes"`
		Disks       []struct {
			Bus       string `json:"bus"`
			SizeBytes int64  `json:"sizeBytes"`
		} `json:"disks"`
	} `json:"vm"`
}

type podInspect struct {
	Status struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		Metadata struct {
			Name, Namespace, UID string
		} `json:"metadata"`
		Annotations map[string]string `json:"annotations"`
	} `json:"status"`
}

func TestCrictlWalksEveryLayer(t *testing.T) {
	d, c := startDaemon(t)

	// version: the real build version, CRI v1.
	version := c.Must(t, "version")
	for _, want := range []string{"RuntimeName:  virtlet", "RuntimeVersion:  " + harness.Version, "RuntimeApiVersion:  v1"} {
		if !strings.Contains(version, want) {
			t.Errorf("crictl version lacks %q:\n%s", want, version)
		}
	}

	// info: real readiness, probed through the plugins.
	var info struct {
		Plugins map[string]struct {
			State    string `json:"state"`
			PID      int    `json:"pid"`
			Restarts int    `json:"restarts"`
		} `json:"plugins"`
	}
	c.JSON(t, &info, "info")
	conds := c.Conditions(t)
	if rr, nr := conds["RuntimeReady"], conds["NetworkReady"]; !rr.Status || rr.Reason != "" || nr.Status || nr.Reason != "NoNetworkPlugin" {
		t.Errorf("conditions %+v", conds)
	}
	if len(info.Plugins) != pluginCount {
		t.Errorf("plugins %+v", info.Plugins)
	}
	for name, p := range info.Plugins {
		if p.State != "running" || !harness.Alive(p.PID) || p.Restarts != 0 {
			t.Errorf("plugin %s: %+v", name, p)
		}
	}

	// images: pull through the image plugin, list, inspect.
	pulled := c.Must(t, "pull", image)
	if !strings.Contains(pulled, "Image is up to date for sha256:") {
		t.Fatalf("pull: %s", pulled)
	}
	imageID := pulled[strings.Index(pulled, "sha256:"):]
	var images struct {
		Images []struct {
			ID       string   `json:"id"`
			RepoTags []string `json:"repoTags"`
			Size     string   `json:"size"`
		} `json:"images"`
	}
	c.JSON(t, &images, "images", "-o", "json")
	if len(images.Images) != 1 || images.Images[0].ID != imageID || images.Images[0].RepoTags[0] != image+":latest" || images.Images[0].Size == "0" {
		t.Fatalf("images %+v", images)
	}
	if table := c.Must(t, "images"); !strings.Contains(table, "virtlet.cloud/example.com/tiny.qcow2") || !strings.Contains(table, "latest") {
		t.Errorf("crictl images:\n%s", table)
	}
	var inspecti struct {
		Status struct {
			ID string `json:"id"`
		} `json:"status"`
	}
	c.JSON(t, &inspecti, "inspecti", image)
	if inspecti.Status.ID != imageID {
		t.Errorf("inspecti %+v", inspecti)
	}

	// The VM pod's lifecycle.
	podJSON, ctrJSON := vmPod(t, d, "cirros-vm", nil)
	sandbox := c.Must(t, "runp", podJSON)
	if !hexID.MatchString(sandbox) {
		t.Fatalf("runp printed %q", sandbox)
	}
	if again := c.Must(t, "runp", podJSON); again != sandbox {
		t.Fatalf("second runp of the same pod gave %s, want %s", again, sandbox)
	}
	ctr := c.Must(t, "create", sandbox, ctrJSON, podJSON)
	if !hexID.MatchString(ctr) {
		t.Fatalf("create printed %q", ctr)
	}
	c.Must(t, "start", ctr)

	var ps struct {
		Containers []struct {
			ID           string                `json:"id"`
			PodSandboxID string                `json:"podSandboxId"`
			State        string                `json:"state"`
			Metadata     struct{ Name string } `json:"metadata"`
		} `json:"containers"`
	}
	c.JSON(t, &ps, "ps", "-o", "json")
	if len(ps.Containers) != 1 || ps.Containers[0].ID != ctr || ps.Containers[0].PodSandboxID != sandbox ||
		ps.Containers[0].State != "CONTAINER_RUNNING" || ps.Containers[0].Metadata.Name != "cirros-vm" {
		t.Fatalf("ps %+v", ps)
	}
	var ci containerInspect
	c.JSON(t, &ci, "inspect", ctr)
	if ci.Status.State != "CONTAINER_RUNNING" || ci.Status.ImageRef != imageID || ci.VM.VCPUs != 2 ||
		ci.VM.MemoryBytes != 160<<20 || ci.VM.Disks[0].Bus != "virtio" || ci.VM.Disks[0].SizeBytes != 1<<30 ||
		ci.Status.LogPath != filepath.Join(d.Dir, "pods", "default_cirros-vm", "cirros-vm/0.log") {
		t.Fatalf("inspect %+v", ci)
	}
	var pi podInspect
	c.JSON(t, &pi, "inspectp", sandbox)
	if pi.Status.ID != sandbox || pi.Status.State != "SANDBOX_READY" || pi.Status.Metadata.Name != "cirros-vm" ||
		pi.Status.Annotations["VirtletVCPUCount"] != "2" {
		t.Fatalf("inspectp %+v", pi)
	}
	if logs := c.Must(t, "logs", ctr); !strings.Contains(logs, fakehypervisor.BootMarker) || !strings.Contains(logs, "2 vCPUs, 160 MiB") {
		t.Fatalf("crictl logs: %q", logs)
	}

	// A graceful stop within the grace period exits 0.
	c.Must(t, "stop", "--timeout", "10", ctr)
	c.JSON(t, &ci, "inspect", ctr)
	if ci.Status.State != "CONTAINER_EXITED" || ci.Status.ExitCode != 0 || ci.Status.Reason != "Completed" {
		t.Fatalf("after stop: %+v", ci.Status)
	}
	c.Must(t, "rm", ctr)
	c.Must(t, "stopp", sandbox)
	c.JSON(t, &pi, "inspectp", sandbox)
	if pi.Status.State != "SANDBOX_NOTREADY" {
		t.Fatalf("after stopp: %s", pi.Status.State)
	}
	c.Must(t, "rmp", sandbox)
	if pods := c.Must(t, "pods", "-q"); pods != "" {
		t.Fatalf("pods after rmp: %q", pods)
	}
	if ctrs := c.Must(t, "ps", "-a", "-q"); ctrs != "" {
		t.Fatalf("containers after rm: %q", ctrs)
	}
	c.Must(t, "rmi", image)
	if imgs := c.Must(t, "images", "-q"); imgs != "" {
		t.Fatalf("images after rmi: %q", imgs)
	}

	// Every call was logged once, with method, pod and duration.
	found := map[string]bool{}
	for _, e := range d.LogEntries() {
		if e["msg"] == "CRI call" && e["duration"] != nil {
			found[fmt.Sprint(e["method"])+" "+fmt.Sprint(e["pod"])] = true
		}
	}
	for _, want := range []string{"RunPodSandbox default/cirros-vm", "CreateContainer default/cirros-vm", "StartContainer default/cirros-vm",
		"StopContainer default/cirros-vm", "RemovePodSandbox default/cirros-vm"} {
		if !found[want] {
			t.Errorf("no log entry for %s; have %v", want, found)
		}
	}
	if info, err := os.Stat(d.Socket); err != nil || info.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v %v", info.Mode(), err)
	}
}

func TestBadInputsGetClearErrors(t *testing.T) {
	d, c := startDaemon(t)
	c.Must(t, "pull", image)

	podJSON, ctrJSON := vmPod(t, d, "bad-vm", map[string]string{"VirtletVCPUCount": "lots", "VirtletDiskDriver": "ide"})
	sandbox := c.Must(t, "runp", podJSON)
	_, errOut, err := c.Run("create", sandbox, ctrJSON, podJSON)
	if err == nil {
		t.Fatal("create with bad annotations succeeded")
	}
	for _, want := range []string{"InvalidArgument", `annotation VirtletDiskDriver: invalid value \"ide\"`, `annotation VirtletVCPUCount: invalid value \"lots\"`, "1 to 255"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("create error lacks %q:\n%s", want, errOut)
		}
	}
	if ctrs := c.Must(t, "ps", "-a", "-q"); ctrs != "" {
		t.Fatalf("a refused VM left a container: %q", ctrs)
	}

	plainPod, _ := vmPod(t, d, "nginx", map[string]string{"kubernetes.io/target-runtime": ""})
	_, errOut, err = c.Run("runp", plainPod)
	if err == nil || !strings.Contains(errOut, "not a VM pod") || !strings.Contains(errOut, "kubernetes.io/target-runtime: virtlet.cloud") {
		t.Fatalf("runp of a plain pod: %v\n%s", err, errOut)
	}

	okPod, okCtr := vmPod(t, d, "vm", nil)
	sb := c.Must(t, "runp", okPod)
	c.Must(t, "create", sb, okCtr, okPod)
	sidecar := harness.WriteJSON(t, d.Dir, "sidecar.json", map[string]interface{}{
		"metadata": map[string]string{"name": "sidecar"}, "image": map[string]string{"image": image}})
	_, errOut, err = c.Run("create", sb, sidecar, okPod)
	if err == nil || !strings.Contains(errOut, "a VM pod has exactly one container") {
		t.Fatalf("second container: %v\n%s", err, errOut)
	}

	_, errOut, err = c.Run("pull", "nginx:1.27")
	if err == nil || !strings.Contains(errOut, "not a VM image") {
		t.Fatalf("pull of a container image: %v\n%s", err, errOut)
	}
}

func pluginPID(t *testing.T, d *harness.Daemon, arg string) int {
	t.Helper()
	for pid, cmdline := range d.Children() {
		if strings.HasSuffix(cmdline, "virtlet-fake-plugin "+arg) {
			return pid
		}
	}
	t.Fatalf("no %s plugin among %v", arg, d.Children())
	return 0
}

func TestKilledPluginComesBack(t *testing.T) {
	d, c := startDaemon(t)
	c.Must(t, "pull", image)
	podJSON, ctrJSON := vmPod(t, d, "vm", nil)
	sb := c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)

	// What a call takes with the plugin up, in this run: crictl's own
	// start and one round trip.
	base := time.Now()
	if _, errOut, err := c.Run("inspect", ctr); err != nil {
		t.Fatalf("inspect: %v %s", err, errOut)
	}
	usual := time.Since(base)
	old := pluginPID(t, d, "hypervisor")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A call in the gap fails at once, naming the plugin: it does not wait
	// for the plugin (that would succeed) nor for its stop timeout.
	begin := time.Now()
	_, errOut, err := c.Run("stop", "--timeout", "5", ctr)
	if err == nil {
		t.Fatal("stop succeeded while the hypervisor plugin was down")
	}
	if !strings.Contains(errOut, "plugin fake-hypervisor (hypervisor)") || !strings.Contains(errOut, "Unavailable") {
		t.Fatalf("error in the gap: %s", errOut)
	}
	if took := time.Since(begin); took > 3*usual+2*time.Second {
		t.Fatalf("the call in the gap took %s (an inspect took %s with the plugin up)", took, usual)
	}
	// The plugin comes back as a new process, with the VM it had.
	harness.Eventually(t, 20*time.Second, "the hypervisor plugin to restart", func() bool {
		_, _, err := c.Run("stop", "--timeout", "5", ctr)
		return err == nil
	})
	if pid := pluginPID(t, d, "hypervisor"); pid == old {
		t.Fatal("no new plugin process")
	}
	var ci containerInspect
	c.JSON(t, &ci, "inspect", ctr)
	if ci.Status.State != "CONTAINER_EXITED" || ci.Status.ExitCode != 0 {
		t.Fatalf("after stop through the restarted plugin: %+v", ci.Status)
	}
	if !strings.Contains(d.Log(), "plugin process exited; restarting it") {
		t.Error("the restart is not in the daemon log")
	}
}

func TestDaemonRestartKeepsState(t *testing.T) {
	d, c := startDaemon(t)
	c.Must(t, "pull", image)
	podA, ctrA := vmPod(t, d, "vm-a", nil)
	podB, ctrB := vmPod(t, d, "vm-b", nil)
	sbA := c.Must(t, "runp", podA)
	running := c.Must(t, "create", sbA, ctrA, podA)
	c.Must(t, "start", running)
	sbB := c.Must(t, "runp", podB)
	created := c.Must(t, "create", sbB, ctrB, podB)

	plugins := d.Children()
	if len(plugins) != pluginCount {
		t.Fatalf("plugin processes %v", plugins)
	}
	d.Stop()
	for pid, cmd := range plugins {
		if harness.Alive(pid) {
			t.Fatalf("plugin %d (%s) survived the daemon's stop", pid, cmd)
		}
	}

	d.Start()
	var pods struct {
		Items []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"items"`
	}
	c.JSON(t, &pods, "pods", "-o", "json")
	got := map[string]string{}
	for _, p := range pods.Items {
		got[p.ID] = p.State
	}
	if len(got) != 2 || got[sbA] != "SANDBOX_READY" || got[sbB] != "SANDBOX_READY" {
		t.Fatalf("pods after restart: %v", got)
	}
	var ps struct {
		Containers []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"containers"`
	}
	c.JSON(t, &ps, "ps", "-a", "-o", "json")
	got = map[string]string{}
	for _, p := range ps.Containers {
		got[p.ID] = p.State
	}
	if len(got) != 2 || got[running] != "CONTAINER_RUNNING" || got[created] != "CONTAINER_CREATED" {
		t.Fatalf("containers after restart: %v", got)
	}
	c.Must(t, "stop", running)
	c.Must(t, "rmp", "-f", sbA, sbB)
}

func TestKilledDaemonLeavesNoPluginProcess(t *testing.T) {
	d, _ := startDaemon(t)
	plugins := d.Children()
	if len(plugins) != pluginCount {
		t.Fatalf("plugin processes %v", plugins)
	}
	d.Kill()
	harness.Eventually(t, 5*time.Second, "the plugins to die with the daemon", func() bool {
		for pid := range plugins {
			if harness.Alive(pid) {
				return false
			}
		}
		return true
	})
}

func TestBadManifestStopsStartup(t *testing.T) {
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), []harness.Plugin{
		{Name: "fake-hypervisor", Kind: "hypervisor", Binary: filepath.Join(bins, "virtlet-fake-plugin"), Args: []string{"hypervisor"}},
	})
	bad := filepath.Join(d.Dir, "plugins.d", "50-ceph.yaml")
	os.WriteFile(bad, []byte("name: ceph\nkind: storage\ncommand: /bin/true\nsha256: "+strings.Repeat("0", 64)+"\n"), 0o644)
	out, err := runDaemonUntilExit(d)
	if err == nil {
		t.Fatal("the daemon started with a bad manifest")
	}
	if !strings.Contains(out, bad) || !strings.Contains(out, "field kind") || !strings.Contains(out, `unknown plugin kind \"storage\"`) {
		t.Fatalf("start-up error does not name the file and field:\n%s", out)
	}
}

// runDaemonUntilExit runs the daemon expecting it to refuse to start.
func runDaemonUntilExit(d *harness.Daemon) (string, error) {
	cmd := exec.Command(d.Bin, "--listen", "unix://"+d.Socket, "--admin-socket", d.AdminSocket(), "--state-dir", d.StateDir,
		"--plugins-dir", filepath.Join(d.Dir, "plugins.d"), "--log-format", "json")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
