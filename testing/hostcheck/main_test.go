package main

import "testing"

// Only a test bridge's name of the harness's form carries a run id.
func TestRunOfBridge(t *testing.T) {
	for name, want := range map[string]string{
		"vtab12cd85":   "ab12cd",
		"vtab12cd1":    "ab12cd",
		"vt0123459":    "012345",
		"vtab12cd":     "", // no network index
		"vtab12cd1234": "", // an index of four digits is not the harness's
		"vtAB12CD85":   "", // the harness writes lower-case hex
		"vltest85":     "", // another suite's (or an older run's) name
		"virbr0":       "", // libvirt's
		"xvtab12cd85":  "", // not at the start
	} {
		if got := runOfBridge(name); got != want {
			t.Errorf("runOfBridge(%q) = %q, want %q", name, got, want)
		}
	}
}

// What is recorded as missing, or with its mode and owner, reads back as
// the string the check's messages give.
func TestPathModeString(t *testing.T) {
	if s := (pathMode{Missing: true}).String(); s != "missing" {
		t.Errorf("missing: %q", s)
	}
	if s := (pathMode{Mode: 0o20000000000 | 0o755, UID: 0, GID: 109}).String(); s != "drwxr-xr-x 0:109" {
		t.Errorf("a directory: %q", s)
	}
}
