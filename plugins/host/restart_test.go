package host_test

import (
	"context"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/host"
)

// openFDs counts the test process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// settle lets goroutines and descriptors of finished work go away.
func settle(count func() int) int {
	n := count()
	for i := 0; i < 50; i++ {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		m := count()
		if m >= n && i > 10 {
			return m
		}
		n = m
	}
	return n
}

// A restart leaves nothing of the dead plugin behind in the daemon: no
// descriptors, no goroutines (its gRPC connection and go-plugin client),
// no socket directory.
func TestRestartsLeaveNothingOfTheDeadPlugin(t *testing.T) {
	// A short path of the test's own: socket paths are limited in length.
	sockets, err := os.MkdirTemp("", "vh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockets) })
	h, err := host.Start(context.Background(), manifests(t, nil), host.Options{StateDir: t.TempDir(), Log: quiet(),
		InitialBackoff: 100 * time.Millisecond, SocketDir: sockets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	ctx := context.Background()
	socketDirs := func() []string {
		entries, _ := os.ReadDir(sockets)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	restart := func() {
		t.Helper()
		before := status(h, "fake-hypervisor")
		if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			st := status(h, "fake-hypervisor")
			if st.State == host.Running && st.PID != before.PID {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not restarted: %+v", st)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := h.Hypervisor().Capabilities(ctx); err != nil {
			t.Fatal(err)
		}
	}
	restart() // the first restart's one-time costs are not leaks
	fds := settle(func() int { return openFDs(t) })
	goroutines := settle(runtime.NumGoroutine)
	const restarts = 4
	for range restarts {
		restart()
	}
	fdsAfter := settle(func() int { return openFDs(t) })
	goroutinesAfter := settle(runtime.NumGoroutine)
	t.Logf("open descriptors %d -> %d, goroutines %d -> %d", fds, fdsAfter, goroutines, goroutinesAfter)
	if fdsAfter > fds+1 {
		t.Errorf("%d restarts left %d more open descriptors", restarts, fdsAfter-fds)
	}
	if goroutinesAfter > goroutines+restarts/2 {
		t.Errorf("%d restarts left %d more goroutines", restarts, goroutinesAfter-goroutines)
	}
	// One socket directory per live plugin process (the hypervisor and
	// the scratch volume plugin), none of the dead ones'.
	if dirs := socketDirs(); len(dirs) != 2 {
		t.Errorf("socket directories %v, want the two live plugins'", dirs)
	}
	h.Shutdown()
	if dirs := socketDirs(); len(dirs) != 0 {
		t.Errorf("socket directories %v after shutdown", dirs)
	}
}
