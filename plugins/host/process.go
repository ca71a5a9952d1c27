package host

import (
	"os"
	"runtime"
	"sync"

	"github.com/hashicorp/go-plugin"
)

// process is one plugin process: its go-plugin client, its socket
// directory, and the OS thread that forked it.
type process struct {
	client  *plugin.Client
	sockDir string

	once   sync.Once
	forked chan struct{} // closed once the process is gone: frees its thread
}

// startPinned starts the client's process (client.Client forks it) on an
// OS thread of its own, held until the process is released.
//
// A plugin gets SIGKILL when its parent dies (PR_SET_PDEATHSIG), so that
// none outlives a daemon killed by SIGKILL; but Linux sends that signal
// when the thread that forked the child ends, not the process. The Go
// runtime ends a thread whenever a goroutine locked to it returns, as the
// daemon's look into a pod's network namespace does. A plugin forked on
// any thread of the pool would die, with no word in its log, the moment
// that thread went.
func startPinned(client *plugin.Client, sockDir string) (plugin.ClientProtocol, *process, error) {
	p := &process{client: client, sockDir: sockDir, forked: make(chan struct{})}
	type result struct {
		rpc plugin.ClientProtocol
		err error
	}
	started := make(chan result, 1)
	go func() {
		// Unlocked once the process is gone, never ended: the thread may
		// have forked another child before this goroutine locked it, and
		// ending it would kill that child as surely (a test process of
		// the harness forks its kube components so).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		rpc, err := client.Client()
		started <- result{rpc, err}
		<-p.forked
	}()
	r := <-started
	return r.rpc, p, r.err
}

// release ends a plugin process completely: the process if it still runs,
// the gRPC connection (which would otherwise go on redialling a dead
// socket), go-plugin's goroutines, the socket directory, and then the
// thread that forked it.
func (p *process) release() {
	p.client.Kill()
	os.RemoveAll(p.sockDir)
	p.once.Do(func() { close(p.forked) })
}
