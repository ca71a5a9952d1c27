package host_test

import (
	"context"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/host"
)

// A plugin dies with the daemon (PR_SET_PDEATHSIG), and Linux ties that
// signal to the thread that forked it, not to the process. Go ends a
// thread whenever a goroutine locked to it returns (the daemon does so
// after each look into a pod's network namespace): were the plugin forked
// on any thread of the pool, it would be killed, without a word, the day
// that thread ended.
func TestPluginsOutliveTheThreadsThatStartedThem(t *testing.T) {
	h := start(t, manifests(t, nil), nil)
	before := h.Status()
	for _, st := range before {
		if !alive(st.PID) {
			t.Fatalf("plugin %s not running: %+v", st.Name, st)
		}
	}
	// End hundreds of the pool's threads, as many goroutines lock one
	// each, all at once, and return.
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				time.Sleep(time.Millisecond)
			}()
		}
		wg.Wait()
	}
	time.Sleep(300 * time.Millisecond) // a killed plugin is noticed within 100 ms
	for _, st := range before {
		now := status(h, st.Name)
		if !alive(st.PID) || now.PID != st.PID || now.Restarts != 0 {
			t.Errorf("plugin %s (pid %d) did not outlive the threads: now %+v", st.Name, st.PID, now)
		}
	}
}

// The thread a plugin was forked on is not ended when the plugin goes:
// it may have forked another child before (a test process forks its
// kube components so), which would die with it.
func TestReleasedPluginsEndNoThread(t *testing.T) {
	// Children with PR_SET_PDEATHSIG, forked on every thread of the
	// pool before the host locks some of them.
	var canaries []*exec.Cmd
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("sleep", "600")
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			canaries = append(canaries, cmd)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range canaries {
			c.Process.Kill()
			c.Wait()
		}
	})
	h, err := host.Start(context.Background(), manifests(t, nil), host.Options{StateDir: t.TempDir(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h.Shutdown()
	time.Sleep(300 * time.Millisecond)
	for _, c := range canaries {
		if !alive(c.Process.Pid) {
			t.Fatalf("a child forked before the plugins (pid %d) died when they went", c.Process.Pid)
		}
	}
}
