package libvirt

import (
	"testing"

	"libvirt.org/go/libvirt"
)

// A domain found shut off (Stop, a resync) ends with the exit its stopped
// event would have given.
func TestExitFromShutoff(t *testing.T) {
	requested := &record{}
	requested.StopRequested = true
	for _, tc := range []struct {
		name   string
		reason libvirt.DomainShutoffReason
		r      *record
		want   exit
	}{
		{"shutdown on request", libvirt.DOMAIN_SHUTOFF_SHUTDOWN, requested, exit{0, "Completed", "the guest shut down on request"}},
		{"powered off", libvirt.DOMAIN_SHUTOFF_SHUTDOWN, &record{}, exit{0, "Completed", "the guest powered off"}},
		{"destroyed", libvirt.DOMAIN_SHUTOFF_DESTROYED, &record{}, forcedExit(&record{})},
		{"crashed", libvirt.DOMAIN_SHUTOFF_CRASHED, &record{}, exit{1, "Crashed", "the guest crashed"}},
		{"failed", libvirt.DOMAIN_SHUTOFF_FAILED, &record{}, exit{1, "Failed", "the QEMU process ended unexpectedly"}},
		{"other", libvirt.DomainShutoffReason(99), &record{}, exit{255, "Stopped", "found shut off (reason 99)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitFromShutoff(tc.reason, tc.r); got != tc.want {
				t.Errorf("exitFromShutoff(%d) = %+v, want %+v", tc.reason, got, tc.want)
			}
		})
	}
}
