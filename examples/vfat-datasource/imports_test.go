package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The example is what a third party writes: it may use the standard
// library, the plugin SDK and the ports, nothing else of the daemon.
func TestUsesOnlyTheSDKAndPorts(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports := strings.Fields(string(out))
	if len(imports) == 0 {
		t.Fatal("no imports listed")
	}
	for _, imp := range imports {
		if strings.Contains(imp, ".") && imp != "github.com/virtlet/virtlet/plugins/sdk" && imp != "github.com/virtlet/virtlet/ports" {
			t.Errorf("example plugin imports %s", imp)
		}
	}
}
