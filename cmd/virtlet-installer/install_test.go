package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const kubeletYAML = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# the operator's comment
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
volumePluginDir: /var/lib/kubelet/volume-plugins
featureGates: {SomeGate: true}
`

// fixture is a host root with a kubelet configuration and a file the
// install replaces, a stage as `make install` writes one, and a systemctl
// stand-in that logs its calls and fails one on demand, once.
type fixture struct {
	in    *installer
	host  string
	calls string // the stand-in's log
}

func newFixture(t *testing.T, failOn string) *fixture {
	t.Helper()
	// Short: the daemon's socket below it must fit a unix socket path
	// (t.TempDir names it after the test).
	dir, err := os.MkdirTemp("", "vi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	host, stage := filepath.Join(dir, "host"), filepath.Join(dir, "stage")
	files := map[string]string{
		"host/var/lib/kubelet/config.yaml":                   kubeletYAML,
		"host/etc/kubernetes/kubelet.conf":                   "kubeconfig",
		"host/usr/local/bin/virtletctl":                      "an older virtletctl",
		"host/proc/1/mountinfo":                              "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n",
		"stage/usr/local/bin/virtlet":                        "daemon",
		"stage/usr/local/bin/virtletctl":                     "virtletctl",
		"stage/usr/libexec/virtlet/virtlet-plugin-libvirt":   "plugin",
		"stage/etc/virtlet/plugins.d/10-libvirt.yaml":        "command: /usr/libexec/virtlet/virtlet-plugin-libvirt\n",
		"stage/etc/virtlet/virtlet.yaml":                     "listen: unix:///run/virtlet.sock\nstateDir: /var/lib/virtlet\n#forwardRuntime: x\n",
		"stage/etc/systemd/system/virtlet.service":           "ExecStart=/usr/local/bin/virtlet --config /etc/virtlet/virtlet.yaml\n",
		"stage/etc/systemd/system/kubelet.service.d/10.conf": "the deprecated flag",
		"stage/usr/libexec/kubernetes/kubelet-plugins/volume/exec/virtlet~flexvolume_driver/flexvolume_driver": "driver",
	}
	for p, c := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("virtletctl", filepath.Join(stage, "usr/local/bin/kubectl-virtlet")); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(dir, "calls")
	script := filepath.Join(dir, "systemctl")
	body := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\n", calls)
	if failOn != "" {
		// Once: the undo's own call succeeds.
		body += fmt.Sprintf("[ \"$*\" = %q ] && [ ! -e %[2]s.failed ] && { touch %[2]s.failed; echo refused >&2; exit 1; }\n", failOn, calls)
	}
	body += "exit 0\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	// The daemon's socket: the stand-in starts no daemon.
	if err := os.MkdirAll(filepath.Join(host, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(host, "run/virtlet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &fixture{
		in: &installer{hostRoot: host, stage: stage, kubeletConfig: "/var/lib/kubelet/config.yaml",
			kubeletKubeconfig: "/etc/kubernetes/kubelet.conf", systemctl: []string{script}, version: "v-test"},
		host: host, calls: calls,
	}
}

// snapshot is every path below root with its mode and content's digest.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		info, _ := e.Info()
		v := info.Mode().String()
		switch {
		case info.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			v += fmt.Sprintf(" %x", sha256.Sum256(b))
		case info.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += " -> " + l
		}
		out[strings.TrimPrefix(p, root)] = v
		return nil
	})
	return out
}

func diff(before, after map[string]string) []string {
	var d []string
	for p, v := range after {
		if before[p] != v {
			d = append(d, fmt.Sprintf("%s: %q, was %q", p, v, before[p]))
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			d = append(d, p+": gone")
		}
	}
	return d
}

func TestInstallThenUninstallRestoresTheNode(t *testing.T) {
	f := newFixture(t, "")
	before := snapshot(t, f.host)
	if err := f.in.install(context.Background()); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(f.host, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"usr/local/bin/virtlet":                      "daemon",
		"usr/local/bin/virtletctl":                   "virtletctl",
		"usr/libexec/virtlet/virtlet-plugin-libvirt": "plugin",
		"var/lib/kubelet/volume-plugins/virtlet~flexvolume_driver/flexvolume_driver": "driver",
	} {
		if got := read(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	if l, err := os.Readlink(filepath.Join(f.host, "usr/local/bin/kubectl-virtlet")); err != nil || l != "virtletctl" {
		t.Errorf("kubectl-virtlet: %q %v", l, err)
	}
	for _, p := range []string{"etc/systemd/system/kubelet.service.d", "usr/libexec/kubernetes"} {
		if _, err := os.Lstat(filepath.Join(f.host, p)); err == nil {
			t.Errorf("%s installed: the installer edits kubelet's configuration file instead", p)
		}
	}
	config := read("etc/virtlet/virtlet.yaml")
	for _, want := range []string{"forwardRuntime: unix:///run/containerd/containerd.sock\n", "kubeconfig: /etc/kubernetes/kubelet.conf\n"} {
		if !strings.Contains(config, want) {
			t.Errorf("virtlet.yaml lacks %q:\n%s", want, config)
		}
	}
	kubelet := read("var/lib/kubelet/config.yaml")
	for _, want := range []string{"containerRuntimeEndpoint: unix:///run/virtlet.sock\n", "  PodAndContainerStatsFromCRI: true\n", "  SomeGate: true\n", "volumePluginDir: /var/lib/kubelet/volume-plugins\n"} {
		if !strings.Contains(kubelet, want) {
			t.Errorf("kubelet's configuration lacks %q:\n%s", want, kubelet)
		}
	}
	calls, _ := os.ReadFile(f.calls)
	if want := "daemon-reload\nenable --now virtlet.service\nrestart kubelet.service\n"; string(calls) != want {
		t.Errorf("systemctl calls:\n%s\nwant:\n%s", calls, want)
	}
	// A restarted pod finds the node installed and does nothing.
	if err := f.in.install(context.Background()); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(f.host, "var/lib/virtlet/images"), 0o755) // the daemon's state
	os.Remove(f.calls)
	rec, err := f.in.load()
	if err != nil || rec == nil || !rec.Complete {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if err := f.in.uninstall(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if d := diff(before, snapshot(t, f.host)); len(d) > 0 {
		t.Errorf("the node after uninstall differs from before:\n%s", strings.Join(d, "\n"))
	}
	calls, _ = os.ReadFile(f.calls)
	if want := "restart kubelet.service\ndisable --now virtlet.service\ndaemon-reload\n"; string(calls) != want {
		t.Errorf("systemctl calls of the uninstall:\n%s\nwant:\n%s", calls, want)
	}
}

// A failed step undoes the steps before it: the node is as it was.
func TestFailedInstallLeavesTheNodeAsItWas(t *testing.T) {
	for _, failOn := range []string{"enable --now virtlet.service", "restart kubelet.service"} {
		t.Run(failOn, func(t *testing.T) {
			f := newFixture(t, failOn)
			before := snapshot(t, f.host)
			err := f.in.install(context.Background())
			if err == nil || !strings.Contains(err.Error(), "systemctl "+failOn) || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("install: %v, want systemctl %s refused", err, failOn)
			}
			if d := diff(before, snapshot(t, f.host)); len(d) > 0 {
				t.Errorf("the node after a failed install differs from before:\n%s", strings.Join(d, "\n"))
			}
		})
	}
}

// With a prefix every Virtlet file and the paths the installed files name
// go below it; kubelet's files stay where kubelet has them.
func TestPrefixedInstall(t *testing.T) {
	f := newFixture(t, "")
	f.in.prefix = "/srv/node"
	os.MkdirAll(filepath.Join(f.host, "srv/node/run"), 0o755)
	l, err := net.Listen("unix", filepath.Join(f.host, "srv/node/run/virtlet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := f.in.install(context.Background()); err != nil {
		t.Fatal(err)
	}
	unit, _ := os.ReadFile(filepath.Join(f.host, "srv/node/etc/systemd/system/virtlet.service"))
	if want := "ExecStart=/srv/node/usr/local/bin/virtlet --config /srv/node/etc/virtlet/virtlet.yaml\n"; string(unit) != want {
		t.Errorf("unit %q, want %q", unit, want)
	}
	config, _ := os.ReadFile(filepath.Join(f.host, "srv/node/etc/virtlet/virtlet.yaml"))
	for _, want := range []string{"listen: unix:///srv/node/run/virtlet.sock\n", "stateDir: /srv/node/var/lib/virtlet\n", "adminSocket: /srv/node/run/virtlet/admin.sock\n"} {
		if !strings.Contains(string(config), want) {
			t.Errorf("virtlet.yaml lacks %q:\n%s", want, config)
		}
	}
	drv, _ := os.ReadFile(filepath.Join(f.host, "var/lib/kubelet/volume-plugins/virtlet~flexvolume_driver/flexvolume_driver"))
	if !strings.Contains(string(drv), "VIRTLET_ADMIN_SOCKET=/srv/node/run/virtlet/admin.sock exec /srv/node/usr/libexec/virtlet/virtlet-flexvolume-driver") {
		t.Errorf("flexvolume driver wrapper:\n%s", drv)
	}
	kubelet, _ := os.ReadFile(filepath.Join(f.host, "var/lib/kubelet/config.yaml"))
	if !strings.Contains(string(kubelet), "containerRuntimeEndpoint: unix:///srv/node/run/virtlet.sock\n") {
		t.Errorf("kubelet's configuration:\n%s", kubelet)
	}
}

// kubelet on Virtlet with no record is another install's node: refused.
func TestRefusesANodeAlreadyOnVirtlet(t *testing.T) {
	f := newFixture(t, "")
	p := filepath.Join(f.host, "var/lib/kubelet/config.yaml")
	os.WriteFile(p, []byte(strings.Replace(kubeletYAML, "/run/containerd/containerd.sock", "/run/virtlet.sock", 1)), 0o644)
	before := snapshot(t, f.host)
	err := f.in.install(context.Background())
	if err == nil || !strings.Contains(err.Error(), "KUBELET_CONFIG /var/lib/kubelet/config.yaml: kubelet's containerRuntimeEndpoint is Virtlet's already") {
		t.Fatalf("install: %v", err)
	}
	if d := diff(before, snapshot(t, f.host)); len(d) > 0 {
		t.Errorf("the node differs:\n%s", strings.Join(d, "\n"))
	}
}

// The daemon's state with a mount below it (a VM pod not deleted) is left,
// named, rather than removed through the mount.
func TestUninstallLeavesStateWithMounts(t *testing.T) {
	f := newFixture(t, "")
	if err := f.in.install(context.Background()); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(f.host, "var/lib/virtlet/volumes/share"), 0o755)
	os.MkdirAll(filepath.Join(f.host, "proc/1"), 0o755)
	os.WriteFile(filepath.Join(f.host, "proc/1/mountinfo"), []byte("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:50 / /var/lib/virtlet/volumes/share rw - tmpfs tmpfs rw\n"), 0o644)
	rec, _ := f.in.load()
	err := f.in.uninstall(context.Background(), rec)
	if err == nil || !strings.Contains(err.Error(), "/var/lib/virtlet is left: mounts below it (/var/lib/virtlet/volumes/share)") {
		t.Fatalf("uninstall: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.host, "var/lib/virtlet/volumes/share")); err != nil {
		t.Errorf("the state below a mount was removed: %v", err)
	}
	// What is left stays recorded for `virtlet-installer uninstall`.
	if rec, err := f.in.load(); err != nil || rec == nil {
		t.Errorf("record after a partial uninstall: %+v %v", rec, err)
	}
}

// A node installed by make install (the unit, no record) is refused.
func TestRefusesANodeInstalledOtherwise(t *testing.T) {
	f := newFixture(t, "")
	unit := filepath.Join(f.host, "etc/systemd/system/virtlet.service")
	os.MkdirAll(filepath.Dir(unit), 0o755)
	os.WriteFile(unit, []byte("ExecStart=/usr/local/bin/virtlet\n"), 0o644)
	before := snapshot(t, f.host)
	err := f.in.install(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/etc/systemd/system/virtlet.service is on this node and no install of this installer is recorded") {
		t.Fatalf("install: %v", err)
	}
	if d := diff(before, snapshot(t, f.host)); len(d) > 0 {
		t.Errorf("the node differs:\n%s", strings.Join(d, "\n"))
	}
}
