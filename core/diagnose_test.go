package core_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// nodeInspector records what it is asked and answers one file.
type nodeInspector struct {
	mu   sync.Mutex
	reqs []ports.NodeInspection
}

func (n *nodeInspector) InspectNode(ctx context.Context, req ports.NodeInspection) ports.NodeReport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.reqs = append(n.reqs, req)
	return ports.NodeReport{Files: []ports.NodeFile{{Name: "ip-a.txt", Data: []byte("1: lo")}}, Problems: []string{"one problem"}}
}

func (n *nodeInspector) last() ports.NodeInspection {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reqs[len(n.reqs)-1]
}

// A pod's diagnostics ask the node about that pod alone; the node's
// diagnostics about the node and every Virtlet pod on it.
func TestDiagnosticsAskTheNode(t *testing.T) {
	e := newEnv(t)
	inspector := &nodeInspector{}
	e.node = inspector
	e.start(t)
	ctx := context.Background()
	sbA, idA := e.runningVM(t, "a")
	sbB, idB := e.runningVM(t, "b")
	vmA, _ := e.rt.ContainerStatus(ctx, idA)
	vmB, _ := e.rt.ContainerStatus(ctx, idB)
	nsA := ports.PodNetNS{Pod: "default/a", Path: "/var/run/netns/fake-" + sbA}
	nsB := ports.PodNetNS{Pod: "default/b", Path: "/var/run/netns/fake-" + sbB}
	d, err := e.rt.Diagnose(ctx, idA)
	if err != nil {
		t.Fatal(err)
	}
	podReq := inspector.last()
	if _, err := e.rt.DiagnoseNode(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what      string
		got, want ports.NodeInspection
	}{
		{"pod a", podReq, ports.NodeInspection{NetNS: []ports.PodNetNS{nsA}, VMs: []string{vmA.Spec.Name}}},
		{"node", inspector.last(), ports.NodeInspection{Node: true, NetNS: []ports.PodNetNS{nsA, nsB}, VMs: []string{vmA.Spec.Name, vmB.Spec.Name}}},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: asked the node %+v, want %+v", tc.what, tc.got, tc.want)
		}
	}
	if len(d.Node.Files) != 1 || d.Node.Files[0].Name != "ip-a.txt" || len(d.Node.Problems) != 1 {
		t.Errorf("the pod's diagnosis lacks the node's report: %+v", d.Node)
	}
}

// Without a node inspector, diagnostics say the node was not read.
func TestDiagnosticsWithoutNodeInspector(t *testing.T) {
	e := newEnv(t)
	_, id := e.runningVM(t, "a")
	d, err := e.rt.Diagnose(context.Background(), id)
	if err != nil || !strings.Contains(strings.Join(d.Problems, "\n"), "reads nothing of the node") {
		t.Errorf("diagnose: %q %v", d.Problems, err)
	}
	if _, err := e.rt.DiagnoseNode(context.Background()); !errors.Is(err, ports.ErrUnimplemented) {
		t.Errorf("diagnose node: %v", err)
	}
}
