package streaming

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

// fakeNode answers a node inspection with one file per thing asked.
type fakeNode struct{ asked []ports.NodeInspection }

func (n *fakeNode) InspectNode(ctx context.Context, req ports.NodeInspection) ports.NodeReport {
	n.asked = append(n.asked, req)
	var r ports.NodeReport
	if req.Node {
		for _, name := range []string{"ip-a.txt", "ip-r.txt", "ps.txt", "netns.txt", "libvirt/libvirtd.log"} {
			r.Files = append(r.Files, ports.NodeFile{Name: name, Data: []byte("node")})
		}
	}
	for _, ns := range req.NetNS {
		r.Files = append(r.Files, ports.NodeFile{Name: "netns/" + ns.Path[strings.LastIndexByte(ns.Path, '/')+1:] + "/ip-a.txt", Data: []byte(ns.Pod)})
	}
	for _, vm := range req.VMs {
		r.Files = append(r.Files, ports.NodeFile{Name: "libvirt/qemu/" + vm + ".log", Data: []byte("[cut by virtlet: …]\nqemu"), Size: 2 << 20, Truncated: true})
	}
	return r
}

// toolsWithVM runs a core over the fakes with one running VM pod.
func toolsWithVM(t *testing.T, node ports.NodeInspector) (*Tools, string) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), ImageSources: map[string]ports.ImageSource{"https": fakes.NewImageSource()},
		ImageFiles: fakes.NewImageFiles(t.TempDir()), Store: fakes.NewStore(), Network: fakes.NewNetwork(),
		Datasources: map[string]ports.Datasource{"nocloud": fakes.NewDatasource("nocloud")}, Node: node}, core.Options{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rt.Run(ctx)
	if err := rt.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := rt.RunSandbox(ctx, core.SandboxConfig{Name: "web", Namespace: "team-a", UID: "uid-web", LogDirectory: t.TempDir(),
		Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}})
	if err != nil {
		t.Fatal(err)
	}
	img, err := rt.PullImage(ctx, "virtlet.cloud/example.com/x.img", nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := rt.CreateContainer(ctx, sb, core.ContainerConfig{Name: "vm", Image: img, LogPath: "vm.log"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	return &Tools{RT: rt, Version: "test", Log: log}, id
}

// A pod's diag holds its own namespace and VM log; the node's diag holds
// the node's files, and only where the operator turned it on.
func TestDiagCarriesWhatTheNodeShows(t *testing.T) {
	node := &fakeNode{}
	tools, id := toolsWithVM(t, node)
	ctx := context.Background()
	run := func(cmd string) (string, error) {
		var out bytes.Buffer
		_, err := tools.Run(ctx, id, []string{cmd}, nil, &out, io.Discard)
		return out.String(), err
	}
	out, err := run(vmtools.Diag)
	if err != nil {
		t.Fatal(err)
	}
	var pod vmtools.Diagnostics
	if err := json.Unmarshal([]byte(out), &pod); err != nil {
		t.Fatal(err)
	}
	if got := fileNames(pod.Files); !strings.HasPrefix(got, "netns/fake-") || !strings.Contains(got, "/ip-a.txt libvirt/qemu/virtlet-") || strings.Contains(got, "ps.txt") {
		t.Errorf("a pod's diag holds %s", got)
	}
	if f := pod.Files[len(pod.Files)-1]; !f.Truncated || f.Size != 2<<20 || !strings.HasPrefix(f.Content, "[cut by virtlet") {
		t.Errorf("the QEMU log does not say it was cut: %+v", f)
	}
	for _, tc := range []struct {
		on      bool
		want    string
		wantErr string
	}{
		{false, "", "turns them on with diagNodeData"},
		{true, "ip-a.txt ip-r.txt ps.txt netns.txt libvirt/libvirtd.log netns/fake-", ""},
	} {
		asked := len(node.asked)
		tools.NodeData = tc.on
		out, err := run(vmtools.DiagNode)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ports.ErrFailedPrecondition) || out != "" || len(node.asked) != asked {
				t.Errorf("node diag off: %q %v; the node was asked %d times", out, err, len(node.asked)-asked)
			}
			continue
		}
		var d vmtools.NodeDiagnostics
		if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.Version != "test" || !strings.HasPrefix(fileNames(d.Files), tc.want) {
			t.Errorf("node diag on: %v %+v", err, d)
		}
	}
}

func fileNames(files []vmtools.File) string {
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	return strings.Join(names, " ")
}
