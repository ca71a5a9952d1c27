package streaming

import (
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// diag shows a pod's user only the plugin log lines that name that pod
// or its VM.
func TestAboutPodKeepsOnlyThePodsLines(t *testing.T) {
	sb := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	ctr := "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	d := core.Diagnosis{Sandbox: core.Sandbox{ID: sb, Name: "web", Namespace: "team-a"},
		Containers: []core.Container{{ID: ctr, Spec: ports.VMSpec{Name: "virtlet-cccccccccccc-vm"}}}}
	line := func(msg string, fields map[string]string) vmtools.LogLine {
		return vmtools.LogLine{Message: msg, Fields: fields}
	}
	lines := []vmtools.LogLine{
		line("domain defined", map[string]string{"vm": "virtlet-cccccccccccc-vm"}),
		line("qcow2 disk created", map[string]string{"vm": ctr, "volume": "data"}),
		line("DHCP", map[string]string{"sandbox": sb}),
		line("network up", map[string]string{"pod": "team-a/web"}),
		line("another pod's domain", map[string]string{"vm": "virtlet-dddddddddddd-other"}),
		line("another pod's network", map[string]string{"pod": "team-b/web", "sandbox": "ffff"}),
		line("a line about no pod, quoting one: RBD image team-b/secret-db ready", map[string]string{"volume": "db"}),
		line("plugin running", nil),
		line("an empty pod field", map[string]string{"pod": ""}),
	}
	got := aboutPod(lines, d)
	var msgs []string
	for _, l := range got {
		msgs = append(msgs, l.Message)
	}
	want := []string{"domain defined", "qcow2 disk created", "DHCP", "network up"}
	if len(msgs) != len(want) {
		t.Fatalf("kept %q, want %q", msgs, want)
	}
	for i := range want {
		if msgs[i] != want[i] {
			t.Fatalf("kept %q, want %q", msgs, want)
		}
	}
}

// A pod's diagnostics list the plugins' health but not their last error,
// which is node-wide and may quote another pod's data.
func TestDiagnosticsWithholdPluginErrors(t *testing.T) {
	in := mustJSON(map[string]map[string]interface{}{
		"libvirt": {"state": "running", "restarts": 2, "lastError": `panic: define domain of pod other-tenant/secret-pod`},
		"images":  {"state": "running"},
	})
	out := string(withheldErrors(in))
	if strings.Contains(out, "other-tenant") || !strings.Contains(out, `"lastError":"withheld: `) {
		t.Errorf("diagnostics' plugins: %s", out)
	}
	if !strings.Contains(out, `"restarts":2`) || !strings.Contains(out, `"images":{"state":"running"}`) {
		t.Errorf("the plugins' health is lost: %s", out)
	}
}
