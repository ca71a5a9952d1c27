//go:build failpoints

package main

import (
	"os"
	"syscall"

	"github.com/sirupsen/logrus"
)

// failpointHook kills the daemon with SIGKILL at the core's failpoint named
// by VIRTLET_FAILPOINT: the crash-matrix tests build the daemon with the
// failpoints tag. A release build has no hook (nofailpoints.go).
func failpointHook(log logrus.FieldLogger) func(string) {
	want := os.Getenv("VIRTLET_FAILPOINT")
	if want == "" {
		return nil
	}
	log.WithField("failpoint", want).Warn("failpoints armed: the daemon kills itself there")
	return func(name string) {
		if name == want {
			log.WithField("failpoint", name).Warn("failpoint reached: SIGKILL")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
