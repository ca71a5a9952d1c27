package libvirt

import (
	"reflect"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// The machine types offered are those of the x86_64 HVM guest for the
// domain type in use, aliases and canonical names both.
func TestMachinesOf(t *testing.T) {
	const capsXML = `<capabilities><host><cpu><arch>x86_64</arch></cpu></host>
<guest><os_type>hvm</os_type><arch name='i686'><wordsize>32</wordsize><machine>isapc</machine><domain type='qemu'/></arch></guest>
<guest><os_type>hvm</os_type><arch name='x86_64'><wordsize>64</wordsize>
  <machine maxCpus='255'>pc-i440fx-7.2</machine><machine canonical='pc-i440fx-7.2' maxCpus='255'>pc</machine>
  <machine maxCpus='288'>pc-q35-7.2</machine><machine canonical='pc-q35-7.2' maxCpus='288'>q35</machine>
  <machine maxCpus='1'>isapc</machine><machine maxCpus='288'>microvm</machine><machine maxCpus='1'>x-remote</machine>
  <domain type='qemu'/>
  <domain type='kvm'><machine maxCpus='255'>pc-i440fx-7.2</machine><machine canonical='pc-i440fx-7.2' maxCpus='255'>pc</machine></domain>
</arch></guest></capabilities>`
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		t.Fatal(err)
	}
	for dt, want := range map[string][]string{
		"qemu": {"pc", "pc-i440fx-7.2", "pc-q35-7.2", "q35"},
		"kvm":  {"pc", "pc-i440fx-7.2"},
	} {
		if got := machinesOf(caps, dt); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", dt, got, want)
		}
	}
}
