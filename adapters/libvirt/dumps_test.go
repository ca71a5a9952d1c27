package libvirt

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A VM's dumps are the files libvirtd names after its domain and a time;
// pruning keeps the newest and touches no other domain's (one whose name
// extends this one's included) or any other file.
func TestPruneDumps(t *testing.T) {
	dir := t.TempDir()
	// libvirt shortens the names to 20 bytes: virtlet-0123456789ab.
	for _, n := range []string{
		"7-virtlet-0123456789ab-2026-11-27-10:00:00", "12-virtlet-0123456789ab-2026-11-27-09:00:00", "3-virtlet-0123456789ab-2026-11-27-11:00:00",
		"5-virtlet-0123456789ac-2026-11-27-08:00:00", // another VM's
		"virtlet-0123456789ab-2026-11-27-08:00:00",   // no domain id: not libvirt's
		"4-virtlet-0123456789ab-notes",               // not a dump
	} {
		os.WriteFile(filepath.Join(dir, n), []byte("mem"), 0o600)
	}
	const domain = "virtlet-0123456789ab-vm"
	removed, err := pruneDumps(dir, domain, 1)
	want := []string{filepath.Join(dir, "12-virtlet-0123456789ab-2026-11-27-09:00:00"), filepath.Join(dir, "7-virtlet-0123456789ab-2026-11-27-10:00:00")}
	if err != nil || !slices.Equal(removed, want) {
		t.Fatalf("removed %v %v, want %v", removed, err, want)
	}
	if removed, err := pruneDumps(dir, domain, 0); err != nil || len(removed) != 1 {
		t.Fatalf("removing the VM's last dump: %v %v", removed, err)
	}
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, []string{"4-virtlet-0123456789ab-notes", "5-virtlet-0123456789ac-2026-11-27-08:00:00", "virtlet-0123456789ab-2026-11-27-08:00:00"}) {
		t.Errorf("left %v", left)
	}
	if removed, err := pruneDumps(filepath.Join(dir, "absent"), "x", 0); err != nil || removed != nil {
		t.Errorf("no dump directory: %v %v", removed, err)
	}
}
