package libvirt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// concernCases names, for each concern of the converter, the golden cases
// that exercise it.
var concernCases = map[string][]string{
	"compute":  {"defaults", "vcpu-hotplug", "cpu-topology", "pinned", "libvirt-cpu-setting", "cpu-limits"},
	"memory":   {"defaults", "max-memory", "hugepages-2m", "volumes"},
	"clock":    {"defaults", "clock-offset-timers", "clock-timezone"},
	"firmware": {"defaults", "q35", "uefi-secure-boot", "hyperv", "system-uuid"},
	"devices":  {"defaults", "watchdog", "volumes"},
	"storage":  {"defaults", "volumes", "persistent-root", "extra-disks-and-share"},
	"network":  {"pod-network"},
	"console":  {"defaults"},
}

// Each concern of the converter alone, on an empty domain, makes what
// testdata/concerns/<concern>-<case>.xml holds (rewritten with -update):
// a change to one concern shows in its own files.
func TestConcernGolden(t *testing.T) {
	cases := map[string]domainCase{}
	for _, tc := range domainCases() {
		cases[tc.name] = tc
	}
	for _, c := range domainConcerns {
		names, ok := concernCases[c.name]
		if !ok {
			t.Errorf("concern %s has no golden cases", c.name)
			continue
		}
		for _, name := range names {
			t.Run(c.name+"-"+name, func(t *testing.T) {
				tc, ok := cases[name]
				if !ok {
					t.Fatalf("no golden case %s", name)
				}
				in := tc.input(t)
				d := &libvirtxml.Domain{Type: in.DomainType, Name: in.Spec.Name, Devices: &libvirtxml.DomainDeviceList{}}
				if err := c.set(d, in, layoutPCI(in.Spec)); err != nil {
					t.Fatal(err)
				}
				got, err := d.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				golden := filepath.Join("testdata", "concerns", c.name+"-"+name+".xml")
				if *update {
					os.MkdirAll(filepath.Dir(golden), 0o755)
					os.WriteFile(golden, []byte(got+"\n"), 0o644)
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if strings.TrimSpace(string(want)) != strings.TrimSpace(got) {
					t.Fatalf("%s differs from %s (run with -update and review the diff):\n%s", c.name, golden, got)
				}
			})
		}
	}
}
