package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/deploy"
	"github.com/virtlet/virtlet/plugins/buildinfo"
	"github.com/virtlet/virtlet/ports"
)

func TestSplitTarget(t *testing.T) {
	for _, tt := range []struct {
		in, user, pod, err string
	}{
		{in: "my-vm", pod: "my-vm"},
		{in: "debian@my-vm", user: "debian", pod: "my-vm"},
		{in: "a@b@my-vm", user: "a@b", pod: "my-vm"},
		{in: "@my-vm", err: "empty user name"},
		{in: "debian@", err: "no pod name"},
	} {
		user, pod, err := splitTarget(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || user != tt.user || pod != tt.pod {
			t.Errorf("%q: %q %q %v", tt.in, user, pod, err)
		}
	}
}

// Installed as kubectl-virtlet, the tool calls itself `kubectl virtlet`.
func TestNameFollowsArgv0(t *testing.T) {
	var out bytes.Buffer
	root := newRoot("kubectl-virtlet")
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "kubectl virtlet [command]") {
		t.Fatalf("help as kubectl-virtlet:\n%s", out.String())
	}
	if commandName("virtletctl") != "virtletctl" {
		t.Fatal("virtletctl is not virtletctl")
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	root := newRoot("virtletctl")
	for _, c := range root.Commands() {
		for _, sub := range append(c.Commands(), c) {
			if sub.Short == "" {
				t.Errorf("%s has no short help", sub.CommandPath())
			}
		}
	}
}

// gen prints objects kubectl can apply: every document parses as a
// Kubernetes object of the expected kind; bad node names are refused.
func TestGenPrintsTheClusterObjects(t *testing.T) {
	root := newRoot("virtletctl")
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"gen", "--node", "node-1", "--tag", "v1.2"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		var obj struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Handler string `json:"handler"`
			Spec    struct {
				Template struct {
					Spec struct {
						NodeSelector map[string]string `json:"nodeSelector"`
						Containers   []struct {
							Image string `json:"image"`
						} `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
			Rules []struct {
				APIGroups []string `json:"apiGroups"`
				Resources []string `json:"resources"`
				Verbs     []string `json:"verbs"`
			} `json:"rules"`
			Subjects []struct {
				Kind, Name string
			} `json:"subjects"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil || obj.APIVersion == "" {
			t.Fatalf("not an object: %v\n%s", err, doc)
		}
		kinds = append(kinds, obj.Kind+"/"+obj.Metadata.Name)
		switch obj.Kind {
		case "RuntimeClass":
			if obj.Handler != "virtlet" {
				t.Errorf("RuntimeClass handler %q", obj.Handler)
			}
		case "Node":
			if obj.Metadata.Labels["extraRuntime"] != "virtlet" {
				t.Errorf("node labels %v", obj.Metadata.Labels)
			}
		case "DaemonSet":
			pod := obj.Spec.Template.Spec
			if len(pod.Containers) != 1 || pod.Containers[0].Image != "ghcr.io/virtlet/virtlet-node:v1.2" || pod.NodeSelector["extraRuntime"] != "virtlet" {
				t.Errorf("the installer's DaemonSet: %+v", pod)
			}
		case "ClusterRole":
			// Reading Virtlet's mappings, nothing else.
			if got := fmt.Sprint(obj.Rules); got != "[{[virtlet.k8s] [virtletimagemappings virtletconfigmappings] [get list watch]}]" {
				t.Errorf("ClusterRole rules %s", got)
			}
		case "ClusterRoleBinding":
			if got := fmt.Sprint(obj.Subjects); got != "[{Group system:nodes}]" {
				t.Errorf("ClusterRoleBinding subjects %s", got)
			}
		}
	}
	// The only grant: the nodes read Virtlet's mappings; ConfigMaps and
	// Secrets they read as their nodes.
	want := "RuntimeClass/virtlet CustomResourceDefinition/virtletimagemappings.virtlet.k8s CustomResourceDefinition/virtletconfigmappings.virtlet.k8s " +
		"ClusterRole/virtlet:mapping-reader ClusterRoleBinding/virtlet:mapping-reader DaemonSet/virtlet-installer Node/node-1"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("gen printed %s, want %s", got, want)
	}

	for _, bad := range []string{"v1:x", "a/b"} {
		root = newRoot("virtletctl")
		root.SetArgs([]string{"gen", "--tag", bad})
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--tag %q: not an image tag", bad)) {
			t.Errorf("gen --tag %s: %v", bad, err)
		}
	}
	root = newRoot("virtletctl")
	root.SetArgs([]string{"gen", "--no-installer"})
	var noInst bytes.Buffer
	root.SetOut(&noInst)
	if err := root.Execute(); err != nil || strings.Contains(noInst.String(), "kind: DaemonSet") || !strings.Contains(noInst.String(), "kind: RuntimeClass") {
		t.Errorf("gen --no-installer: %v\n%s", err, noInst.String())
	}

	root = newRoot("virtletctl")
	root.SetArgs([]string{"gen", "--node", "Bad_Name"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `--node "Bad_Name"`) {
		t.Errorf("gen --node Bad_Name: %v", err)
	}
}

func TestMissingArgumentsSayWhat(t *testing.T) {
	for _, args := range [][]string{{"ssh"}, {"vnc"}, {"virsh", "pod"}} {
		root := newRoot("virtletctl")
		root.SetArgs(args)
		root.SetErr(&bytes.Buffer{})
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "arg") {
			t.Errorf("%v: %v", args, err)
		}
	}
	root := newRoot("virtletctl")
	root.SetArgs([]string{"diag", "dump"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--json") {
		t.Errorf("diag dump without a directory: %v", err)
	}
}

func TestIsVMPod(t *testing.T) {
	virtlet := "virtlet"
	for _, tt := range []struct {
		pod  corev1.Pod
		want bool
	}{
		{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}}}, true},
		{corev1.Pod{Spec: corev1.PodSpec{RuntimeClassName: &virtlet}}, true},
		{corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "virtlet.cloud/cirros"}}}}, true},
		{corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "busybox"}}}}, false},
	} {
		if got := isVMPod(&tt.pod); got != tt.want {
			t.Errorf("%+v: %v", tt.pod, got)
		}
	}
}

func TestDumpWritesOneDirectoryPerPod(t *testing.T) {
	dir := t.TempDir()
	r := dumpReport{Pods: []podDiag{{Namespace: "default", Pod: "vm", Node: "node-1", Diagnostics: vmtools.Diagnostics{
		Version: "v1", VMs: map[string]vmtools.VMInfo{"0123456789abcdef": {Definition: "<domain/>"}},
		PluginLogs: []vmtools.LogLine{{Time: time.Unix(0, 0).UTC(), Plugin: "libvirt", Level: "info", Message: "domain defined", Fields: map[string]string{"vm": "virtlet-x"}}},
	}}}, Skipped: []string{"default/other: Pending"}}
	var out bytes.Buffer
	if err := r.write(dir, &out); err != nil {
		t.Fatal(err)
	}
	pd := filepath.Join(dir, "node-1", "default_vm")
	for name, want := range map[string]string{
		"domain-0123456789abc.xml": "<domain/>",
		"plugin-logs.txt":          "1970-01-01T00:00:00.000Z libvirt [info] domain defined vm=\"virtlet-x\"\n",
	} {
		got, err := os.ReadFile(filepath.Join(pd, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q %v, want %q", name, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(pd, "diag.json")); err != nil {
		t.Error(err)
	}
	if !strings.Contains(out.String(), "skipped default/other: Pending") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestPrintStatus(t *testing.T) {
	started := time.Date(2026, 11, 25, 15, 0, 0, 0, time.UTC)
	st := vmtools.VMStatus{Pod: "default/vm", VM: "virtlet-0123456789ab-vm", State: "running", StartedAt: started, VCPUs: 2, MemoryBytes: 512 << 20,
		Guest: &ports.GuestInfo{OS: "Debian GNU/Linux 12 (bookworm)", Kernel: "6.1.0-56-amd64", Hostname: "vm", TimeZone: "UTC",
			Interfaces: []ports.GuestInterface{{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []string{"127.0.0.1/8"}},
				{Name: "eth0", MAC: "52:54:00:a1:b2:c3", Addresses: []string{"198.18.0.5/24", "fd00:198:18::5/64"}}}}}
	var b strings.Builder
	if err := printStatus(&b, st, started.Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := `Pod:         default/vm
VM:          virtlet-0123456789ab-vm
State:       running for 1m30s (since 2026-11-25T15:00:00Z)
vCPUs:       2
Memory:      512 MiB
Guest OS:    Debian GNU/Linux 12 (bookworm) (kernel 6.1.0-56-amd64)
Hostname:    vm
Time zone:   UTC
Interfaces:  lo 00:00:00:00:00:00 127.0.0.1/8
             eth0 52:54:00:a1:b2:c3 198.18.0.5/24 fd00:198:18::5/64
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	st.Guest, st.GuestError, st.State = nil, "the VM vm has no guest agent", "running"
	printStatus(&b, st, started)
	if !strings.Contains(b.String(), "Guest:   no answer: the VM vm has no guest agent") {
		t.Errorf("a guest without an agent:\n%s", b.String())
	}
	b.Reset()
	st.State, st.HaltedAt = "halted", started.Add(time.Minute)
	printStatus(&b, st, started.Add(3*time.Minute))
	if !strings.Contains(b.String(), "State:   halted for 2m0s (since 2026-11-25T15:01:00Z; the pod and disks are kept: start boots it)") {
		t.Errorf("a halted VM:\n%s", b.String())
	}
}

// vnc takes its local port after the pod, as Virtlet's did, or as
// --address; not both, and only a port number.
func TestVNCListenAddress(t *testing.T) {
	for _, tc := range []struct {
		port       []string
		address    string
		addressSet bool
		want, err  string
	}{
		{address: "127.0.0.1:0", want: "127.0.0.1:0"},
		{address: "0.0.0.0:5901", addressSet: true, want: "0.0.0.0:5901"},
		{port: []string{"5901"}, address: "127.0.0.1:0", want: "127.0.0.1:5901"},
		{port: []string{"0"}, address: "127.0.0.1:0", want: "127.0.0.1:0"},
		{port: []string{"5901"}, address: "127.0.0.1:5902", addressSet: true, err: "not both"},
		{port: []string{"65536"}, err: `local port "65536"`},
		{port: []string{"vnc"}, err: `local port "vnc"`},
	} {
		got, err := vncListenAddress(tc.port, tc.address, tc.addressSet)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v %q: %q %v, want an error with %q", tc.port, tc.address, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v %q: %q %v, want %q", tc.port, tc.address, got, err, tc.want)
		}
	}
}

// version reads each Virtlet node's daemon version from the node's status
// and prints them as text, --short, -o json or -o yaml.
func TestVersionOutputs(t *testing.T) {
	node := func(name, runtime string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: runtime}}}
	}
	clientset := fake.NewSimpleClientset(node("b", "virtlet://1.2.3"), node("a", "virtlet://1.2.4"), node("c", "containerd://1.6.20"))
	client := buildinfo.Version()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "client: " + client + "\nnode a: virtlet 1.2.4\nnode b: virtlet 1.2.3\n"},
		{[]string{"--client"}, "client: " + client + "\n"},
		{[]string{"--short"}, "Client Version: " + client + "\nServer Version (a): 1.2.4\nServer Version (b): 1.2.3\n"},
		{[]string{"-o", "json"}, `{
  "clientVersion": "` + client + `",
  "nodes": [
    {
      "node": "a",
      "virtletVersion": "1.2.4"
    },
    {
      "node": "b",
      "virtletVersion": "1.2.3"
    }
  ]
}
`},
		{[]string{"-o", "yaml", "--client"}, "clientVersion: " + client + "\n"},
	} {
		k := &kube{client: clientset}
		cmd := newVersion(k, "virtletctl")
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err != nil || out.String() != tc.want {
			t.Errorf("version %v: %v\n%s\nwant:\n%s", tc.args, err, out.String(), tc.want)
		}
	}
	cmd := newVersion(&kube{client: clientset}, "virtletctl")
	cmd.SetArgs([]string{"-o", "xml"})
	cmd.SetOut(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "want json or yaml") {
		t.Errorf("-o xml: %v", err)
	}
}

// virsh takes the pod first, or anywhere as Virtlet's @POD.
func TestVirshTarget(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		pod, rest string
		err       string
	}{
		{args: []string{"my-vm", "dominfo"}, pod: "my-vm", rest: "dominfo"},
		{args: []string{"dumpxml", "@my-vm"}, pod: "my-vm", rest: "dumpxml"},
		{args: []string{"dumpxml", "@my-vm", "--inactive"}, pod: "my-vm", rest: "dumpxml --inactive"},
		{args: []string{"domstats", "@a", "@b"}, err: "one pod"},
		{args: []string{"dominfo", "@"}, err: "names no pod"},
	} {
		pod, rest, err := virshTarget(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || pod != tc.pod || strings.Join(rest, " ") != tc.rest {
			t.Errorf("%v: pod %q, virsh %q, %v; want %q, %q", tc.args, pod, rest, err, tc.pod, tc.rest)
		}
	}
}

// diag unpack lays a JSON dump out as dump writes a directory, and refuses
// names that would leave it.
func TestDiagUnpack(t *testing.T) {
	r := dumpReport{Pods: []podDiag{{Namespace: "default", Pod: "vm", Node: "node-1", Diagnostics: vmtools.Diagnostics{
		Version: "v1", VMs: map[string]vmtools.VMInfo{"0123456789abcdef": {Definition: "<domain/>"}}}}}}
	dump, _ := json.Marshal(r)
	file := filepath.Join(t.TempDir(), "diag.json")
	os.WriteFile(file, dump, 0o644)
	for _, args := range [][]string{{file}, {"-"}, {}} {
		dir := t.TempDir()
		root := newRoot("virtletctl")
		root.SetArgs(append(append([]string{"diag", "unpack"}, args...), dir))
		root.SetIn(bytes.NewReader(dump))
		root.SetOut(io.Discard)
		if err := root.Execute(); err != nil {
			t.Fatalf("unpack %v: %v", args, err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, "node-1", "default_vm", "domain-0123456789abc.xml")); err != nil || string(got) != "<domain/>" {
			t.Errorf("unpack %v: domain XML %q %v", args, got, err)
		}
	}
	for _, bad := range []podDiag{
		{Namespace: "..", Pod: "x", Node: "n"},
		{Namespace: "ns", Pod: "x", Node: "../../etc"},
		{Namespace: "ns", Pod: "x", Node: "n", Diagnostics: vmtools.Diagnostics{VMs: map[string]vmtools.VMInfo{"../evil": {}}}},
	} {
		dir := t.TempDir()
		if err := (dumpReport{Pods: []podDiag{bad}}).write(filepath.Join(dir, "out"), io.Discard); err == nil || !strings.Contains(err.Error(), "cannot name") {
			t.Errorf("%+v: %v", bad, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%+v: wrote %v", bad, entries)
		}
	}
}

// install copies the binary as kubectl's virtlet plugin, replacing an
// earlier copy whole.
func TestInstallAsKubectlPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "virtletctl")
	os.WriteFile(src, []byte("new binary"), 0o700)
	dir := filepath.Join(t.TempDir(), "bin")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "kubectl-virtlet"), []byte("old binary, longer than the new"), 0o755)
	target, err := installAs(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(target)
	st, _ := os.Stat(target)
	if target != filepath.Join(dir, "kubectl-virtlet") || string(got) != "new binary" || st.Mode().Perm() != 0o755 {
		t.Errorf("installed %s: %q %v", target, got, st.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left %v", entries)
	}
	t.Setenv("PATH", dir+":/usr/bin")
	if !onPath(dir) || onPath(t.TempDir()) {
		t.Error("onPath")
	}
}

// validate reports each Virtlet node's problems, each naming the node and
// what to do, and succeeds only when there is none.
func TestValidate(t *testing.T) {
	node := func(name, runtime string, ready corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{deploy.NodeLabel: deploy.NodeLabelValue}},
			Status: corev1.NodeStatus{
				NodeInfo:   corev1.NodeSystemInfo{ContainerRuntimeVersion: runtime, KubeletVersion: "v1.36.3"},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletNotReady", Message: "container runtime network not ready"}},
			},
		}
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "virtlet"}, Handler: "virtlet"}
	unlabelled := node("plain", "containerd://1.6.20", corev1.ConditionTrue)
	unlabelled.Labels = nil
	sock := "unix:///run/virtlet.sock"
	gate := map[string]bool{"PodAndContainerStatsFromCRI": true}
	configs := map[string]kubeletConfig{
		"good":      {ContainerRuntimeEndpoint: sock, FeatureGates: gate},
		"not-ready": {ContainerRuntimeEndpoint: sock, FeatureGates: gate},
		"images":    {ContainerRuntimeEndpoint: sock, ImageServiceEndpoint: "unix:///run/containerd/containerd.sock", FeatureGates: gate},
		"no-gate":   {ContainerRuntimeEndpoint: sock},
	}
	configz := func(_ context.Context, n string) (kubeletConfig, error) {
		cfg, ok := configs[n]
		if !ok {
			return kubeletConfig{}, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/proxy"}, n, errors.New("no"))
		}
		return cfg, nil
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    []string
		ok      bool
	}{
		{"all good", []runtime.Object{rc, node("good", "virtlet://0.3.0", corev1.ConditionTrue), unlabelled}, []string{
			"RuntimeClass virtlet: handler virtlet\n", "node good: ready; runtime virtlet://0.3.0; kubelet v1.36.3\n", "validation successful\n"}, true},
		{"no nodes, no runtime class", []runtime.Object{unlabelled}, []string{
			"problem: RuntimeClass virtlet does not exist", "problem: no node has the label extraRuntime=virtlet"}, false},
		{"node problems", []runtime.Object{rc, node("not-ready", "virtlet://0.3.0", corev1.ConditionFalse),
			node("images", "virtlet://0.3.0", corev1.ConditionTrue), node("forbidden", "containerd://1.6.20", corev1.ConditionTrue),
			node("no-gate", "virtlet://0.3.0", corev1.ConditionTrue)}, []string{
			"problem: node not-ready: not Ready (KubeletNotReady: container runtime network not ready)",
			`problem: node images: kubelet's imageServiceEndpoint "unix:///run/containerd/containerd.sock" is not its containerRuntimeEndpoint`,
			`problem: node forbidden: its container runtime is "containerd://1.6.20", not Virtlet`,
			"problem: node no-gate: kubelet's feature gate PodAndContainerStatsFromCRI is off",
			"warning: node forbidden: not checked: kubelet's configuration (/configz through the node proxy): you need get on nodes/proxy"}, false},
	} {
		v := validator{k: &kube{client: fake.NewSimpleClientset(tc.objects...)}, configz: configz}
		var out bytes.Buffer
		err := v.run(context.Background(), &out)
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v\n%s", tc.name, err, out.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out.String())
			}
		}
		if strings.Contains(out.String(), "plain") {
			t.Errorf("%s: an unlabelled node was checked:\n%s", tc.name, out.String())
		}
	}
}
