package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func vmPodOn(name, node string, phase corev1.PodPhase) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vm"}}}, Status: corev1.PodStatus{Phase: phase}}
}

// dump asks every running VM pod for its diagnostics and every node, once,
// for its own; a node whose daemon withholds them says why.
func TestCollectAsksEachNodeOnce(t *testing.T) {
	pods := []corev1.Pod{vmPodOn("a", "n1", corev1.PodRunning), vmPodOn("b", "n1", corev1.PodRunning), vmPodOn("c", "n2", corev1.PodRunning),
		vmPodOn("d", "n2", corev1.PodPending), {ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "nginx"}}}}}
	asked := map[string][]string{}
	exec := func(ctx context.Context, pod *corev1.Pod, cmd []string, stdin io.Reader, stdout, stderr io.Writer) error {
		asked[cmd[0]] = append(asked[cmd[0]], pod.Name)
		switch {
		case cmd[0] == vmtools.Diag:
			return json.NewEncoder(stdout).Encode(vmtools.Diagnostics{Node: pod.Spec.NodeName, Files: []vmtools.File{{Name: "libvirt/qemu/virtlet-" + pod.Name + ".log", Content: "qemu"}}})
		case pod.Spec.NodeName == "n1":
			return json.NewEncoder(stdout).Encode(vmtools.NodeDiagnostics{Node: "n1", Files: []vmtools.File{{Name: "ps.txt", Content: "PID"}}})
		}
		fmt.Fprintln(stderr, "the node's diagnostics are off on node n2: … turns them on with diagNodeData")
		return errors.New("command terminated with exit code 1")
	}
	r := collect(context.Background(), pods, exec)
	if got := strings.Join(asked[vmtools.Diag], ","); got != "a,b,c" {
		t.Errorf("diag asked of %s", got)
	}
	if got := strings.Join(asked[vmtools.DiagNode], ","); got != "a,c" {
		t.Errorf("diag-node asked of %s, want once per node", got)
	}
	if len(r.Pods) != 3 || len(r.Pods[0].Diagnostics.Files) != 1 || strings.Join(r.Skipped, ",") != "default/d: Pending" {
		t.Errorf("pods %+v, skipped %q", r.Pods, r.Skipped)
	}
	if len(r.Nodes) != 2 || r.Nodes[0].Diagnostics == nil || r.Nodes[0].Diagnostics.Files[0].Name != "ps.txt" ||
		r.Nodes[1].Diagnostics != nil || !strings.Contains(r.Nodes[1].Withheld, "diagNodeData") {
		t.Errorf("nodes %+v", r.Nodes)
	}
}

// A dump's directory holds each pod's own files and each node's, where
// Virtlet's diag dump kept them (ip-a.txt, ps.txt, netns.txt, libvirt's logs).
func TestDumpLaysOutNodeFiles(t *testing.T) {
	qemu := vmtools.File{Name: "libvirt/qemu/virtlet-0123456789ab-vm.log", Content: "[cut by virtlet: the first 10 of 1048586 bytes are left out]\nqemu", Truncated: true, Size: 1048586}
	netns := vmtools.File{Name: "netns/virtlet-aa/ip-a.txt", Content: "1: lo:"}
	r := dumpReport{
		Pods: []podDiag{{Namespace: "default", Pod: "vm", Node: "node-1", Diagnostics: vmtools.Diagnostics{Version: "v1", Files: []vmtools.File{netns, qemu}}}},
		Nodes: []nodeDiag{
			{Node: "node-1", Diagnostics: &vmtools.NodeDiagnostics{Node: "node-1", Problems: []string{"QEMU log of VM x: not found"}, Files: []vmtools.File{
				{Name: "ip-a.txt", Content: "1: lo:"}, {Name: "ip-r.txt", Content: "default via"}, {Name: "ps.txt", Content: "PID"},
				{Name: "netns.txt", Content: "virtlet-aa\tpod default/vm"}, {Name: "libvirt/libvirtd.log", Content: "libvirt version"}, netns, qemu}}},
			{Node: "node-2", Withheld: "the node's diagnostics are off on node node-2"},
		},
	}
	for _, via := range []string{"dump", "unpack"} {
		dir := t.TempDir()
		if via == "dump" {
			if err := r.write(dir, io.Discard); err != nil {
				t.Fatal(err)
			}
		} else {
			unpack(t, r, dir)
		}
		for _, tc := range []struct{ path, want string }{
			{"node-1/default_vm/netns/virtlet-aa/ip-a.txt", "1: lo:"},
			{"node-1/default_vm/libvirt/qemu/virtlet-0123456789ab-vm.log", qemu.Content},
			{"node-1/node/ip-a.txt", "1: lo:"},
			{"node-1/node/ip-r.txt", "default via"},
			{"node-1/node/ps.txt", "PID"},
			{"node-1/node/netns.txt", "virtlet-aa\tpod default/vm"},
			{"node-1/node/netns/virtlet-aa/ip-a.txt", "1: lo:"},
			{"node-1/node/libvirt/libvirtd.log", "libvirt version"},
			{"node-1/node/libvirt/qemu/virtlet-0123456789ab-vm.log", qemu.Content},
			{"node-1/node/node.json", `"QEMU log of VM x: not found"`},
			{"node-2/node/withheld.txt", "off on node node-2"},
		} {
			got, err := os.ReadFile(filepath.Join(dir, tc.path))
			if err != nil || !strings.Contains(string(got), tc.want) {
				t.Errorf("%s: %s: %q %v, want %q", via, tc.path, got, err, tc.want)
			}
		}
		// The files are not written twice: diag.json and node.json name none.
		for _, p := range []string{"node-1/default_vm/diag.json", "node-1/node/node.json"} {
			if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || strings.Contains(string(b), "cut by virtlet") {
				t.Errorf("%s: %s holds the files: %v", via, p, err)
			}
		}
	}
}

// unpack runs diag unpack on r's JSON.
func unpack(t *testing.T, r dumpReport, dir string) {
	t.Helper()
	dump, _ := json.Marshal(r)
	file := filepath.Join(t.TempDir(), "diag.json")
	os.WriteFile(file, dump, 0o644)
	root := newRoot("virtletctl")
	root.SetArgs([]string{"diag", "unpack", file, dir})
	root.SetOut(io.Discard)
	if err := root.Execute(); err != nil {
		t.Fatalf("unpack: %v", err)
	}
}

// unpack refuses a dump whose file names would leave their directory or
// replace another file, and writes nothing then.
func TestUnpackRefusesBadFileNames(t *testing.T) {
	pod := func(f ...vmtools.File) []podDiag {
		return []podDiag{{Namespace: "ns", Pod: "p", Node: "n", Diagnostics: vmtools.Diagnostics{Files: f}}}
	}
	node := func(name string, f ...vmtools.File) []nodeDiag {
		return []nodeDiag{{Node: name, Diagnostics: &vmtools.NodeDiagnostics{Files: f}}}
	}
	for _, tc := range []struct {
		what string
		r    dumpReport
	}{
		{"a pod file leaving", dumpReport{Pods: pod(vmtools.File{Name: "../../../etc/cron.d/x"})}},
		{"an absolute name", dumpReport{Pods: pod(vmtools.File{Name: "/etc/passwd"})}},
		{"a dot-dot inside", dumpReport{Pods: pod(vmtools.File{Name: "netns/../../x"})}},
		{"replacing diag.json", dumpReport{Pods: pod(vmtools.File{Name: "diag.json"})}},
		{"too deep", dumpReport{Pods: pod(vmtools.File{Name: "a/b/c/d/e"})}},
		{"a node file leaving", dumpReport{Pods: pod(), Nodes: node("n", vmtools.File{Name: "../x"})}},
		{"replacing node.json", dumpReport{Pods: pod(), Nodes: node("n", vmtools.File{Name: "node.json"})}},
		{"a node named ..", dumpReport{Pods: pod(), Nodes: node("..")}},
		{"twice the same file", dumpReport{Pods: pod(), Nodes: node("n", vmtools.File{Name: "ps.txt"}, vmtools.File{Name: "ps.txt"})}},
	} {
		dir := t.TempDir()
		if err := tc.r.write(filepath.Join(dir, "out"), io.Discard); err == nil || !strings.Contains(err.Error(), "cannot name") {
			t.Errorf("%s: %v", tc.what, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: wrote %v", tc.what, entries)
		}
	}
}
