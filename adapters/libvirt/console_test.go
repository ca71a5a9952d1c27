package libvirt

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The tailer follows virtlogd's raw console log into the CRI log: woken by
// inotify (no polling), across a rotation, with a partial line flushed on
// its own; an idle VM's position is not saved again and again.
func TestTailerFollowsTheConsoleLog(t *testing.T) {
	dir := t.TempDir()
	raw, cri := filepath.Join(dir, "vm.console"), filepath.Join(dir, "cri.log")
	var saves atomic.Int32
	tl, err := startTailer(raw, cri, 0, 0, func(int64, uint64) { saves.Add(1) }, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer tl.close()
	if tl.wake == nil {
		t.Fatal("no inotify watch: the tailer polls")
	}
	appendTo := func(path, s string) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	shows := func(want string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if data, _ := os.ReadFile(cri); strings.Contains(string(data), want) {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		data, _ := os.ReadFile(cri)
		t.Fatalf("the CRI log lacks %q after %s:\n%s", want, within, data)
	}
	// Bounds far above the follower's poll: what is tested is that each
	// shows up, not how soon.
	appendTo(raw, "first line\n")
	shows("stdout F first line", 20*time.Second)
	// A prompt without a newline shows up on its own.
	appendTo(raw, "login: ")
	shows("stdout P login: ", 20*time.Second)
	// virtlogd rotates: the old file is renamed, a new one written.
	if err := os.Rename(raw, raw+".0"); err != nil {
		t.Fatal(err)
	}
	appendTo(raw, "after rotation\n")
	shows("stdout F after rotation", 20*time.Second)

	// Idle: no more saves once the position is saved.
	time.Sleep(1500 * time.Millisecond)
	before := saves.Load()
	time.Sleep(2500 * time.Millisecond)
	if n := saves.Load() - before; n != 0 {
		t.Errorf("an idle console saved its position %d times", n)
	}
}

// A plugin killed between two saves of the record's position (once a
// second) restarts its tailer from that older position; the position file
// says what reached the CRI log, so no line is written twice, none is
// lost, and an incomplete line the killed tailer still held is written
// once it completes.
func TestARestartedTailerWritesNoLineTwice(t *testing.T) {
	dir := t.TempDir()
	raw, cri := filepath.Join(dir, "vm.console"), filepath.Join(dir, "cri.log")
	appendTo := func(s string) {
		f, err := os.OpenFile(raw, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	lines := func() []string {
		data, _ := os.ReadFile(cri)
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if i := strings.Index(l, " stdout "); i >= 0 {
				out = append(out, l[i+len(" stdout "):])
			}
		}
		return out
	}
	waitLines := func(n int) []string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if l := lines(); len(l) >= n {
				return l
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("the CRI log has %q, want %d lines", lines(), n)
		return nil
	}
	noSave := func(int64, uint64) {}
	first, err := startTailer(raw, cri, 0, 0, noSave, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	appendTo("one\ntwo\nthree\n")
	waitLines(3)
	// A line begun: read, held as incomplete. What a kill now leaves on
	// disk is the CRI log and the position file as they are: they are
	// kept, the tailer stopped (which flushes the line and notes it),
	// and they are put back.
	appendTo("fo")
	time.Sleep(100 * time.Millisecond) // read (or not yet): either is a state a kill leaves
	kept := map[string][]byte{}
	for _, f := range []string{cri, positionFile(raw)} {
		if kept[f], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	first.close()
	for f, data := range kept {
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	second, err := startTailer(raw, cri, 0, 0, noSave, quietLog()) // the record's stale position
	if err != nil {
		t.Fatal(err)
	}
	defer second.close()
	appendTo("ur\nfive\n")
	waitLines(5)
	time.Sleep(200 * time.Millisecond)
	// The begun line, unless the killed tailer had flushed it already
	// (an incomplete line shows up partialAfter after its last byte).
	switch got := strings.Join(lines(), "|"); got {
	case "F one|F two|F three|F four|F five", "F one|F two|F three|P fo|F ur|F five":
	default:
		t.Fatalf("the CRI log after the restart: %q", got)
	}
}
