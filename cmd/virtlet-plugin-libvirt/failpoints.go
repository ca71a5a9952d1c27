//go:build failpoints

package main

import (
	"os"
	"strings"
	"syscall"

	"github.com/virtlet/virtlet/adapters/libvirt"
	"github.com/virtlet/virtlet/plugins/sdk"
)

// A test build (the failpoints tag) kills the plugin with SIGKILL at the
// step (of a pool claim, of a checkpoint) named by its manifest's argument
// --failpoint=NAME, once: the file named by --failpoint-once=PATH records
// that it fired, so that the plugin the daemon restarts goes on. A release
// build has no hook.
func init() {
	var want, once string
	for _, a := range os.Args[1:] {
		if v, ok := strings.CutPrefix(a, "--failpoint="); ok {
			want = v
		}
		if v, ok := strings.CutPrefix(a, "--failpoint-once="); ok {
			once = v
		}
	}
	if want == "" || once == "" {
		return
	}
	libvirt.Failpoint = func(name string) {
		if name != want {
			return
		}
		if f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			f.Close()
			sdk.Log.WithField("failpoint", name).Warn("failpoint reached: SIGKILL")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
