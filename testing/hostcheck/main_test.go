package main

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Only a link name of the harness's form carries a run id.
func TestRunOfLink(t *testing.T) {
	for name, want := range map[string]string{
		"vtab12cd85":       "ab12cd",
		"vtab12cd1":        "ab12cd",
		"vt0123459":        "012345",
		"vtab12cd0":        "ab12cd", // the service range's bridge
		"vtab12cdc417":     "ab12cd", // a unit test's veth
		"vtab12cd":         "",       // nothing after the id
		"vtab12cdk210n1":   "ab12cd", // a harness.Node's network namespace
		"vtab12cdk210n1h":  "ab12cd", // and its veth's host side
		"vtab12cd12345678": "",       // too long for a link name
		"vtab12cd-1":       "",       // not a letter or digit
		"vtAB12CD85":       "",       // the harness writes lower-case hex
		"vltest85":         "",       // another suite's (or an older run's) name
		"virbr0":           "",       // libvirt's
		"xvtab12cd85":      "",       // not at the start
	} {
		if got := runOfLink(name); got != want {
			t.Errorf("runOfLink(%q) = %q, want %q", name, got, want)
		}
	}
}

// A pod's network namespace of a test network carries the run's id.
func TestPodNetNSName(t *testing.T) {
	for name, want := range map[string]string{
		"vtab12cdn86-0123456789abcdef":  "ab12cd",
		"vtab12cdn300-0123456789abcdef": "ab12cd", // a unit test's
		"virtlet-0123456789abcdef":      "",       // a node's own (the default prefix)
		"vtab12cdn86-":                  "",       // no sandbox
		"vtab12cdn86-0123456789abcdef0": "",       // longer than the plugin makes
		"vtab12cdx86-0123456789abcdef":  "",
	} {
		got := ""
		if m := podNetNSName.FindStringSubmatch(name); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("run of netns %q = %q, want %q", name, got, want)
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

// A run whose test binary is still running is found (and begin leaves
// what it made); a run without one is not.
func TestRunningAs(t *testing.T) {
	if os.Getenv("HOSTCHECK_SLEEP") != "" {
		time.Sleep(time.Minute)
		return
	}
	id := fmt.Sprintf("t%05d", os.Getpid()%100000)
	if pid := runningAs(id); pid != 0 {
		t.Fatalf("run %s: process %d before any runs as it", id, pid)
	}
	// This test binary again, as run id.
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunningAs$")
	cmd.Env = append(os.Environ(), "HOSTCHECK_SLEEP=1", "VIRTLET_RUN="+id)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for runningAs(id) != cmd.Process.Pid {
		if time.Now().After(deadline) {
			t.Fatalf("run %s: its test binary %d not found", id, cmd.Process.Pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid := runningAs(id + "x"); pid != 0 {
		t.Errorf("run %sx: found process %d", id, pid)
	}
}
