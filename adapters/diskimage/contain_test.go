package diskimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// What a run of the tool leaves behind dies with it, and it has no
// network: a qemu-img that a crafted image took over cannot keep a
// process of the tool's user around (other runs grant that user other
// images) or reach a service.
func TestToolRunsAreContained(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the tool changes user and namespaces only when run by root")
	}
	dir := harness.SearchableTempDir(t)
	marker := "contain-test-" + filepath.Base(dir)
	script := filepath.Join(dir, "qemu-img")
	// A stand-in that starts a detached child, then reports its network
	// links as "format".
	os.WriteFile(script, []byte("#!/bin/sh\nsetsid sh -c 'exec -a "+marker+" sleep 300' </dev/null >/dev/null 2>&1 &\n"+
		"echo \"{\\\"format\\\": \\\"$(awk -F: 'NR > 2 {print $1}' /proc/net/dev | tr -d ' ' | tr '\\n' ' ')\\\"}\"\n"), 0o755)
	image := filepath.Join(dir, "image")
	os.WriteFile(image, []byte("x"), 0o600)
	old := qemuImg
	qemuImg = script
	defer func() { qemuImg = old }()
	info, err := Tool{Timeout: 30 * time.Second}.Info(context.Background(), image, "")
	if err != nil {
		t.Fatal(err)
	}
	if links := strings.Fields(info.Format); len(links) != 1 || links[0] != "lo" {
		t.Errorf("the tool's network links: %q, want lo alone", links)
	}
	time.Sleep(200 * time.Millisecond)
	if out, _ := exec.Command("pgrep", "-f", marker).Output(); len(strings.TrimSpace(string(out))) > 0 {
		exec.Command("pkill", "-f", marker).Run()
		t.Errorf("a child of the tool outlived it: pids %s", out)
	}
}
