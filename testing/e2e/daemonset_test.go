package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/deploy"
	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// A node on containerd alone becomes a Virtlet node by `kubectl apply -k`
// and a label, as kata-deploy makes a Kata node: the installer image,
// built by `make image` and pulled by the node's containerd from a
// registry, puts Virtlet's files in place, starts the daemon and restarts
// kubelet on it; a seed-001 VM pod runs there while the installer pod
// itself keeps running on containerd behind the daemon. Deleting the
// DaemonSet makes the node a containerd node again with nothing of Virtlet
// left: kubelet's configuration byte for byte as it was, no file below the
// install's root.
//
// What this machine cannot show: systemd. The installer runs the host's
// systemctl through a stand-in the test serves (harness.Systemctl), which
// starts the installed unit's ExecStart and restarts the harness's
// kubelet. Every Virtlet file goes below a directory of the test
// (VIRTLET_INSTALL_PREFIX), which the installer writes through the
// host's root mounted at /host as on a real node.
func TestKubeDaemonSetInstall(t *testing.T) {
	parallel(t)
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	k := harness.StartControlPlane(t, kubeBin)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 44})
	ctrd := harness.StartContainerd(t, tn, harness.ContainerdOptions{})
	reg, err := containerdisk.StartRegistry()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	ctrd.Mirror(t, "ghcr.io", "http://"+reg.Addr)
	k.StartKubeletOn(ctrd.Endpoint, "")
	if rt := nodeRuntime(t, k); !strings.HasPrefix(rt, "containerd://") {
		t.Fatalf("the node starts on %q, want containerd", rt)
	}
	kubeletConfig, err := os.ReadFile(k.KubeletConfig())
	if err != nil {
		t.Fatal(err)
	}

	// The image, as an operator builds it (make image), in the registry
	// the node's containerd pulls ghcr.io's images from.
	tag := "e2e-" + harness.RunID()
	begin := time.Now()
	func() {
		holdBuildingBin(t)
		cmd := exec.Command("make", "-s", "image", fmt.Sprintf("IMAGE=docker://%s/virtlet/virtlet-node:%s", reg.Addr, tag), "IMAGE_INSECURE=1")
		cmd.Dir = harness.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make image: %v\n%s", err, out)
		}
	}()
	t.Logf("make image pushed %s:%s in %.1fs", deploy.InstallerImage, tag, time.Since(begin).Seconds())

	// The node's root for Virtlet's files, with what a node has there.
	root := harness.VMDir(t)
	for _, d := range []string{"run", "var/lib", "etc", "usr/local"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	before := treeOf(t, root)
	// The installed daemon's VMs run as the default VM and pool users.
	t.Cleanup(func() {
		harness.RevokeUsers(harness.UserRange{First: 2000000000, Last: 2000131071})
	})
	systemctl := harness.NewSystemctl(t, k, filepath.Join(root, "etc/systemd/system"))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("systemctl calls: %q\nthe installed daemon's log tail:\n%s", systemctl.Calls(), tail(systemctl.UnitLog("virtlet.service"), 4000))
			out, _ := k.Kubectl("logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=virtlet-installer", "--tail=100")
			t.Logf("the installer's log:\n%s", out)
		}
	})

	// `kubectl apply -k` of an overlay of deploy/: this test's tag, and
	// the node's paths (kubelet's files are the harness's; Virtlet's go
	// below root; systemctl is the stand-in).
	overlay := t.TempDir()
	base, err := filepath.Rel(overlay, filepath.Join(harness.RepoRoot(), "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: %s
  newTag: %s
patches:
- target: {kind: DaemonSet, name: virtlet-installer}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/env
      value:
      - {name: KUBELET_CONFIG, value: %q}
      - {name: KUBELET_KUBECONFIG, value: %q}
      - {name: VIRTLET_INSTALL_PREFIX, value: %q}
      - {name: VIRTLET_HOST_SYSTEMCTL, value: %q}
`, base, deploy.InstallerImage, tag, k.KubeletConfig(), k.KubeletKubeconfig(), root, systemctl.Script)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	// kubectl's kustomize and virtletctl gen print the same objects.
	sameObjects(t, k)
	if out, err := k.Kubectl("apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k: %v\n%s", err, out)
	}
	// The cluster's settings for the node, read by the daemon at its
	// start: the seeds' cirros, the pod network, the streaming port.
	cirros, err := images.Translation(map[string]string{"cirros": "tiny.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	applyMapping(t, k, "VirtletImageMapping", "seed-images", cirros)
	applyMapping(t, k, "VirtletConfigMapping", "installed-node", fmt.Sprintf("nodeName: %s\nconfig: {streamPort: %d, cniConfigDir: %s, cniPluginDir: %s}",
		k.Node, harness.FreePort(t), tn.ConfDir, harness.CNIBinDir))
	// The label makes it a Virtlet node (`virtletctl gen --node`).
	if out, err := k.Kubectl("label", "node", k.Node, deploy.NodeLabel+"="+deploy.NodeLabelValue); err != nil {
		t.Fatalf("label the node: %v\n%s", err, out)
	}

	labelled := time.Now()
	waitKube(t, k, "the node on Virtlet", 5*time.Minute, func() bool { return strings.HasPrefix(nodeRuntime(t, k), "virtlet") })
	t.Logf("the node runs on %s %.1fs after its label", nodeRuntime(t, k), time.Since(labelled).Seconds())
	waitKube(t, k, "the installer pod Ready behind the daemon", 3*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=virtlet-installer",
			"-o", `jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}`)
		return out == "True"
	})
	if got, want := systemctl.Calls(), []string{"daemon-reload", "enable --now virtlet.service", "restart kubelet.service"}; !slices.Equal(got, want) {
		t.Errorf("systemctl calls %q, want %q", got, want)
	}
	kubelet, _ := os.ReadFile(k.KubeletConfig())
	for _, want := range []string{"containerRuntimeEndpoint: unix://" + root + "/run/virtlet.sock\n", "PodAndContainerStatsFromCRI: true"} {
		if !strings.Contains(string(kubelet), want) {
			t.Errorf("kubelet's configuration lacks %q:\n%s", want, kubelet)
		}
	}
	manifest, _ := os.ReadFile(filepath.Join(root, "etc/virtlet/plugins.d/10-libvirt.yaml"))
	if !strings.Contains(string(manifest), "command: "+root+"/usr/libexec/virtlet/virtlet-plugin-libvirt\n") {
		t.Errorf("the libvirt plugin's manifest does not name the installed plugin:\n%s", manifest)
	}
	config, _ := os.ReadFile(filepath.Join(root, "etc/virtlet/virtlet.yaml"))
	if !strings.Contains(string(config), "forwardRuntime: "+ctrd.Endpoint+"\n") {
		t.Errorf("virtlet.yaml does not forward to the node's containerd %s:\n%s", ctrd.Endpoint, config)
	}

	// seed-001 on the installed node.
	if err := k.Apply(seed001); err != nil {
		t.Fatal(err)
	}
	waitKube(t, k, "cirros-vm's guest ready", 5*time.Minute, func() bool {
		out, _ := k.Kubectl("logs", "cirros-vm")
		return strings.Contains(out, "@@TINY-READY")
	})
	t.Log("seed-001's cirros-vm booted on the installed node")
	if out, err := k.Kubectl("delete", "pod", "cirros-vm", "--wait=true", "--timeout=3m"); err != nil {
		t.Fatalf("delete cirros-vm: %v\n%s", err, out)
	}

	// Delete the DaemonSet: the node goes back.
	deleted := time.Now()
	if out, err := k.Kubectl("delete", "daemonset", "-n", "kube-system", "virtlet-installer", "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("delete the DaemonSet: %v\n%s", err, out)
	}
	waitKube(t, k, "the installer pod gone", 5*time.Minute, func() bool {
		out, _ := k.Kubectl("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=virtlet-installer", "-o", "name")
		return out == ""
	})
	k.WaitNodeReady()
	t.Logf("uninstalled, the node Ready on %s, %.1fs after the DaemonSet's deletion", nodeRuntime(t, k), time.Since(deleted).Seconds())
	if rt := nodeRuntime(t, k); !strings.HasPrefix(rt, "containerd://") {
		t.Errorf("the node runs on %q after the uninstall, want containerd", rt)
	}
	if got, want := systemctl.Calls()[3:], []string{"restart kubelet.service", "disable --now virtlet.service", "daemon-reload"}; !slices.Equal(got, want) {
		t.Errorf("systemctl calls of the uninstall %q, want %q", got, want)
	}
	if systemctl.Running("virtlet.service") {
		t.Error("the daemon still runs")
	}
	if now, _ := os.ReadFile(k.KubeletConfig()); string(now) != string(kubeletConfig) {
		t.Errorf("kubelet's configuration after the uninstall:\n%s\nwant, as before:\n%s", now, kubeletConfig)
	}
	if after := treeOf(t, root); !slices.Equal(after, before) {
		t.Errorf("below the install's root after the uninstall:\n%s\nwant, as before:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if drivers, _ := filepath.Glob(filepath.Join(k.Dir, "volume-plugins", "*")); len(drivers) > 0 {
		t.Errorf("flexvolume drivers left: %v", drivers)
	}
}

// nodeRuntime is the runtime kubelet reports for the node.
func nodeRuntime(t *testing.T, k *harness.Kube) string {
	out, _ := k.Kubectl("get", "node", k.Node, "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}")
	return out
}

// treeOf lists every path below root with its type.
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil {
			out = append(out, strings.TrimPrefix(p, root)+" "+info.Mode().Type().String())
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// sameObjects checks that `kubectl kustomize deploy/` and `virtletctl gen
// --tag latest` print the same objects.
func sameObjects(t *testing.T, k *harness.Kube) {
	t.Helper()
	kustomized, err := k.Kubectl("kustomize", filepath.Join(harness.RepoRoot(), "deploy"))
	if err != nil {
		t.Fatalf("kubectl kustomize deploy/: %v\n%s", err, kustomized)
	}
	// make image built it.
	gen, err := exec.Command(filepath.Join(harness.RepoRoot(), "bin", "virtletctl"), "gen", "--tag", "latest").Output()
	if err != nil {
		t.Fatalf("virtletctl gen: %v", err)
	}
	objects := func(stream string) []string {
		var out []string
		for _, doc := range strings.Split(stream, "\n---\n") {
			var obj map[string]interface{}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("not YAML: %v\n%s", err, doc)
			}
			if obj == nil {
				continue
			}
			b, _ := yaml.Marshal(obj)
			out = append(out, string(b))
		}
		sort.Strings(out)
		return out
	}
	if a, b := objects(kustomized), objects(string(gen)); !slices.Equal(a, b) {
		t.Errorf("kubectl kustomize deploy/ printed:\n%s\nvirtletctl gen --tag latest printed:\n%s", strings.Join(a, "---\n"), strings.Join(b, "---\n"))
	}
}
