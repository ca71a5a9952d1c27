package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/testing/harness"
)

// `make install` lays out a node: binaries, pinned plugin manifests, the
// config, the flexvolume driver, the systemd unit and kubelet's drop-in;
// the installed daemon starts from the installed config and manifests
// alone and reports every plugin running.
func TestNodeInstall(t *testing.T) {
	parallel(t)
	holdBuildingBin(t)
	// Every path under the test's root: the installed manifests and
	// config name absolute paths, which must be the installed ones.
	root := harness.VMDir(t)
	make_ := exec.Command("make", "install", "PREFIX="+root+"/usr/local", "SYSCONFDIR="+root+"/etc",
		"KUBELET_VOLUME_PLUGIN_DIR="+root+"/usr/libexec/kubernetes/kubelet-plugins/volume/exec")
	make_.Dir = harness.RepoRoot()
	if out, err := make_.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	bin := filepath.Join(root, "usr/local/bin")
	for _, f := range []string{
		"usr/local/bin/virtlet", "usr/local/bin/virtletctl", "usr/local/bin/kubectl-virtlet", "usr/local/bin/virtlet-plugin-libvirt",
		"etc/virtlet/virtlet.yaml", "etc/virtlet/images",
		"usr/libexec/kubernetes/kubelet-plugins/volume/exec/virtlet~flexvolume_driver/flexvolume_driver",
		"etc/systemd/system/virtlet.service", "etc/systemd/system/kubelet.service.d/10-virtlet.conf",
		"usr/local/share/bash-completion/completions/virtletctl", "usr/local/share/zsh/vendor-completions/_virtletctl",
		"usr/local/share/fish/vendor_completions.d/virtletctl.fish", "usr/local/lib/tmpfiles.d/virtlet-ksm.conf",
	} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	// KSM on at boot, tuned as make bench's P5 measures it.
	if ksm, _ := os.ReadFile(filepath.Join(root, "usr/local/lib/tmpfiles.d/virtlet-ksm.conf")); !strings.Contains(string(ksm), "w /sys/kernel/mm/ksm/run - - - - 1") {
		t.Errorf("the KSM tmpfiles.d entry does not turn KSM on:\n%s", ksm)
	}
	// The completions are virtletctl's own (cobra's), for its commands.
	if bash, _ := os.ReadFile(filepath.Join(root, "usr/local/share/bash-completion/completions/virtletctl")); !strings.Contains(string(bash), "__start_virtletctl") {
		t.Errorf("the bash completion is not virtletctl's:\n%.300s", bash)
	}
	unit, _ := os.ReadFile(filepath.Join(root, "etc/systemd/system/virtlet.service"))
	for _, want := range []string{"ExecStart=" + bin + "/virtlet --config " + root + "/etc/virtlet/virtlet.yaml", "After=network-online.target libvirtd.service", "Before=kubelet.service"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("virtlet.service lacks %q:\n%s", want, unit)
		}
	}
	if dropIn, _ := os.ReadFile(filepath.Join(root, "etc/systemd/system/kubelet.service.d/10-virtlet.conf")); !strings.Contains(string(dropIn), "--container-runtime-endpoint=unix:///run/virtlet.sock --feature-gates=PodAndContainerStatsFromCRI=true") {
		t.Errorf("kubelet drop-in:\n%s", dropIn)
	}
	// The manifests pin the installed binaries: the loader accepts each.
	manifests := filepath.Join(root, "etc/virtlet/plugins.d")
	ms, err := manifest.LoadDir(manifests)
	if err != nil {
		t.Fatalf("installed manifests: %v", err)
	}
	if len(ms) < 5 {
		t.Errorf("%d manifests installed, want every shipped plugin", len(ms))
	}

	// The installed daemon from the installed config, but for the
	// sockets and state, which must not touch the node's.
	state := filepath.Join(root, "state")
	sock := filepath.Join(root, "virtlet.sock")
	daemon := exec.Command(filepath.Join(bin, "virtlet"), "--config", filepath.Join(root, "etc/virtlet/virtlet.yaml"),
		"--listen", "unix://"+sock, "--admin-socket", filepath.Join(root, "admin.sock"), "--state-dir", state,
		"--streaming-address", "127.0.0.1:0")
	logs := &harness.Screen{}
	daemon.Stdout, daemon.Stderr = logs, logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			daemon.Process.Signal(os.Interrupt)
			daemon.Wait()
		}
	}
	defer stop()
	c := &harness.Crictl{Bin: crictl, Endpoint: "unix://" + sock, Timeout: time.Minute}
	// Ready as a runtime (the node has no pod network config here, so
	// NetworkReady is false and says why), every installed plugin running.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var info struct {
			Plugins map[string]struct {
				State string `json:"state"`
			} `json:"plugins"`
		}
		out, _, err := c.Run("info")
		if err == nil {
			err = json.Unmarshal([]byte(out), &info)
		}
		running := 0
		for _, m := range ms {
			if info.Plugins[m.Name].State == "running" {
				running++
			}
		}
		if err == nil && running == len(ms) && c.Conditions(t)["RuntimeReady"].Status {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the installed daemon is not ready: %v, %d of %d plugins running\n%s\ndaemon log:\n%s", err, running, len(ms), out, tail(logs.String(), 3000))
		}
		time.Sleep(500 * time.Millisecond)
	}

	// make uninstall takes every installed file back: below the root, only
	// what the daemon itself made (its state, sockets) and empty
	// directories are left.
	stop()
	unmake := exec.Command("make", "uninstall", "PREFIX="+root+"/usr/local", "SYSCONFDIR="+root+"/etc",
		"KUBELET_VOLUME_PLUGIN_DIR="+root+"/usr/libexec/kubernetes/kubelet-plugins/volume/exec")
	unmake.Dir = harness.RepoRoot()
	if out, err := unmake.CombinedOutput(); err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	var left []string
	filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "state" || rel == "virtlet.sock" || rel == "admin.sock" {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.IsDir() {
			left = append(left, rel)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("make uninstall left %v", left)
	}
}

// Every binary of a node answers --version with the build's version (the
// harness stamps it as make does), plugins included: run by hand, a plugin
// prints its name and version instead of go-plugin's refusal.
func TestEveryBinaryAnswersVersion(t *testing.T) {
	parallel(t)
	names := []string{"virtlet", "virtlet-flexvolume-driver", "virtlet-installer"}
	for name := range harness.ShippedPlugins {
		names = append(names, name)
	}
	for _, name := range names {
		out, err := exec.Command(filepath.Join(bins, name), "--version").CombinedOutput()
		if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), " "+harness.Version) {
			t.Errorf("%s --version: %v %q, want its name and %s", name, err, out, harness.Version)
		}
	}
}
