package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The daemon's systemd unit is valid for systemd and hardened: systemd's
// own offline review rates it well below the unhardened unit's 9.6, and
// every capability it keeps says why.
func TestUnitIsHardened(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	data, err := os.ReadFile(filepath.Join("node", "virtlet.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "virtlet.service")
	// verify checks that the binary exists.
	os.WriteFile(unit, []byte(strings.Replace(string(data), "/usr/local/bin/virtlet", "/bin/true", 1)), 0o644)
	if out, err := exec.Command("systemd-analyze", "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=true", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for virtlet.service: ([0-9.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 7.5 {
		t.Errorf("exposure %.1f, want at most 7.5 (the unhardened unit: 9.6)", score)
	}
	for _, key := range []string{"NoNewPrivileges=yes", "ProtectSystem=full", "ProtectHome=yes"} {
		if !strings.Contains(string(data), "\n"+key+"\n") {
			t.Errorf("the unit lacks %s", key)
		}
	}
	caps := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`).FindStringSubmatch(string(data))
	if caps == nil {
		t.Fatal("the unit has no CapabilityBoundingSet")
	}
	for _, c := range strings.Fields(caps[1]) {
		if !regexp.MustCompile(`(?m)^#.*\b` + c + `\b`).MatchString(string(data)) {
			t.Errorf("capability %s is kept without a comment saying why", c)
		}
	}
}
