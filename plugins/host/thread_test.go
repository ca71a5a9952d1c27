package host_test

import (
	"runtime"
	"sync"
	"testing"
	"time"
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
