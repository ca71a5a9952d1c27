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
