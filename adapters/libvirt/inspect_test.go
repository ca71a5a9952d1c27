package libvirt

import (
	"strings"
	"testing"
)

// virtletctl virsh reaches the pod's own domain, read-only, and nothing
// else: each verb takes only the options and arguments listed for it.
func TestCheckVirshArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "" = accepted
	}{
		{[]string{"dominfo"}, ""},
		{[]string{"domstate", "--reason"}, ""},
		{[]string{"domstats", "--cpu-total", "--balloon"}, ""},
		{[]string{"domblkinfo", "vda", "--human"}, ""},
		{[]string{"domblkinfo", "--device", "vda"}, ""},
		{[]string{"domblkstat", "--device=sda"}, ""},
		{[]string{"domifstat", "tap0"}, ""},
		{[]string{"domifaddr", "--source", "lease", "--full"}, ""},
		{nil, "virsh command: none given"},
		{[]string{"destroy"}, `virsh command: invalid value "destroy": only commands that read`},
		{[]string{"domstats", "virtlet-other"}, "domstats takes 0 argument(s) besides the pod's own domain"},
		{[]string{"dominfo", "--domain", "virtlet-other"}, `virsh dominfo option: invalid value "--domain"`},
		{[]string{"dominfo", "--domain=virtlet-other"}, `virsh dominfo option: invalid value "--domain=virtlet-other"`},
		{[]string{"dumpxml", "-c", "qemu:///system"}, `invalid value "-c"`},
		{[]string{"dumpxml", "--connect=qemu:///system"}, `invalid value "--connect=qemu:///system"`},
		{[]string{"dumpxml", "--security-info"}, `invalid value "--security-info"`},
		{[]string{"domblkinfo", "vda", "vdb"}, "domblkinfo takes 1 argument(s)"},
		{[]string{"domblkinfo", "vda;destroy"}, "not a device or interface name"},
		{[]string{"domblkinfo", "--device"}, "option --device: needs a value"},
		{[]string{"domblkinfo", "--device", "--all"}, "not a plain name"},
		{[]string{"domstate", "--reason=yes"}, `invalid value "--reason=yes"`},
	} {
		err := checkVirshArgs(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q refused: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got %v, want an error with %q", tc.args, err, tc.err)
		}
	}
}
