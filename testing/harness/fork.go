package harness

import (
	"os/exec"
	"runtime"
	"sync"
)

// startForLife starts cmd, whose SysProcAttr.Pdeathsig asks the kernel to
// kill it when its parent goes. Linux sends that signal when the *thread*
// that forked the child ends, not the process, and the Go runtime ends a
// thread whenever a goroutine locked to it returns (as code entering a
// network namespace does). So every such child is forked on one thread
// that is locked for the test process's life and never ends: it dies with
// the test process only. (Kubelets of the cluster tests were SIGKILLed
// mid-test, their nodes going NotReady for good.)
func startForLife(cmd *exec.Cmd) error {
	forkerOnce.Do(func() {
		forks = make(chan forkRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread outlives every child
			for req := range forks {
				req.done <- req.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	forks <- forkRequest{cmd, done}
	return <-done
}

type forkRequest struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	forkerOnce sync.Once
	forks      chan forkRequest
)
