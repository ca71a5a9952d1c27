package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

const sendingXML = `<domain type='qemu'>
  <name>virtlet-0123456789ab-vm</name>
  <uuid>9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d</uuid>
  <metadata><virtlet xmlns="https://virtlet.cloud/domain"><owner>node-1</owner></virtlet></metadata>
  <memory unit='KiB'>131072</memory>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/node-1/vms/aaaa-root.qcow2'/>
      <target dev='sda' bus='scsi'/>
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='/node-1/media/aaaa.iso'/>
      <target dev='sdb' bus='scsi'/>
      <readonly/>
      <address type='drive' controller='0' bus='0' target='0' unit='1'/>
    </disk>
    <interface type='ethernet'>
      <mac address='52:54:00:aa:bb:cc'/>
      <target dev='tap-node1' managed='no'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/>
    </interface>
    <serial type='file'><source path='/node-1/vms/aaaa.console'/><target port='0'/></serial>
  </devices>
  <seclabel type='static' model='dac' relabel='yes'><label>+2000000001:+2000000001</label></seclabel>
</domain>`

const receivingXML = `<domain type='qemu'>
  <name>virtlet-0123456789ab-vm</name>
  <uuid>9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d</uuid>
  <metadata><virtlet xmlns="https://virtlet.cloud/domain"><owner>node-2</owner></virtlet></metadata>
  <memory unit='KiB'>131072</memory>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/node-2/vms/bbbb-root.qcow2'/>
      <target dev='sda' bus='scsi'/>
      <address type='drive' controller='0' bus='0' target='0' unit='1'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='/node-2/media/bbbb.iso'/>
      <target dev='sdb' bus='scsi'/>
      <readonly/>
    </disk>
    <interface type='ethernet'>
      <mac address='52:54:00:AA:BB:CC'/>
      <target dev='tap-node2' managed='no'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/>
    </interface>
    <serial type='file'><source path='/node-2/vms/bbbb.console'/><target port='0'/></serial>
  </devices>
  <seclabel type='static' model='dac' relabel='yes'><label>+2000000007:+2000000007</label></seclabel>
</domain>`

func TestTheDestinationIsTheGuestsHardwareOnTheReceivingHost(t *testing.T) {
	out, err := destinationXML(sendingXML, receivingXML)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(out); err != nil {
		t.Fatal(err)
	}
	disks := d.Devices.Disks
	if disks[0].Source.File.File != "/node-2/vms/bbbb-root.qcow2" || disks[1].Source.File.File != "/node-2/media/bbbb.iso" {
		t.Errorf("disk files %s, %s: want the receiving node's", disks[0].Source.File.File, disks[1].Source.File.File)
	}
	if a := disks[0].Address.Drive; a == nil || *a.Unit != 0 {
		t.Errorf("the root disk's address %+v: want the running guest's (unit 0)", disks[0].Address)
	}
	nic := d.Devices.Interfaces[0]
	if nic.Target.Dev != "tap-node2" || *nic.Address.PCI.Slot != 7 {
		t.Errorf("the NIC: tap %s, slot %d: want the receiving node's tap in the guest's slot 7", nic.Target.Dev, *nic.Address.PCI.Slot)
	}
	if p := d.Devices.Serials[0].Source.File.Path; p != "/node-2/vms/bbbb.console" {
		t.Errorf("the console goes to %s", p)
	}
	if l := d.SecLabel[0].Label; l != "+2000000007:+2000000007" || !strings.Contains(d.Metadata.XML, "node-2") {
		t.Errorf("the security label %s and metadata %s: want the receiving node's", l, d.Metadata.XML)
	}
}

func TestADestinationOfAnotherGuestIsRefused(t *testing.T) {
	for name, edit := range map[string]func(string) string{
		"another UUID":   func(x string) string { return strings.Replace(x, "9b1f4a52", "00000000", 1) },
		"another name":   func(x string) string { return strings.Replace(x, "-vm</name>", "-other</name>", 1) },
		"a disk missing": func(x string) string { return strings.Replace(x, "dev='sdb'", "dev='sdc'", 1) },
		"another MAC":    func(x string) string { return strings.Replace(x, "52:54:00:AA:BB:CC", "52:54:00:AA:BB:CD", 1) },
		"no devices at all": func(x string) string {
			return x[:strings.Index(x, "<devices>")] + x[strings.Index(x, "</devices>")+len("</devices>"):]
		},
	} {
		if _, err := destinationXML(sendingXML, edit(receivingXML)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLibvirtdsSocketIsItsURIs(t *testing.T) {
	for uri, want := range map[string]string{
		"qemu:///system": "/run/libvirt/libvirt-sock",
		"qemu+unix:///system?socket=/n2/run/libvirt-sock": "/n2/run/libvirt-sock",
		"qemu+tcp://host/system":                          "",
		"qemu:///session":                                 "",
	} {
		got, err := libvirtSocket(uri)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("libvirtSocket(%q) = %q, %v; want %q", uri, got, err, want)
		}
	}
}

func TestAnArrivingDefinitionKeepsNothingOfTheSendingHost(t *testing.T) {
	// What the sending node sends for an honest migration passes.
	dest, err := destinationXML(sendingXML, receivingXML)
	if err != nil {
		t.Fatal(err)
	}
	checked, err := checkArrivingXML(receivingXML, dest)
	if err != nil {
		t.Fatalf("an honest destination refused: %v", err)
	}
	if !strings.Contains(checked, "/node-2/vms/bbbb-root.qcow2") {
		t.Errorf("the checked definition passed on:\n%s", checked)
	}
	// An element the check does not know of is not passed on to libvirtd.
	odd, err := checkArrivingXML(receivingXML, strings.Replace(dest, "</devices>", "</devices><unheardof path='/etc/shadow'/>", 1))
	if err != nil || strings.Contains(odd, "unheardof") {
		t.Errorf("an unknown element: %v, passed on as\n%s", err, odd)
	}
	// What names the host is replaced by this node's own...
	for name, edit := range map[string]func(string) string{
		"another disk file":    func(x string) string { return strings.Replace(x, "/node-2/vms/bbbb-root.qcow2", "/etc/shadow", 1) },
		"another emulator":     func(x string) string { return strings.Replace(x, "/usr/bin/qemu-system-x86_64", "/tmp/evil", 1) },
		"another console file": func(x string) string { return strings.Replace(x, "/node-2/vms/bbbb.console", "/etc/passwd", 1) },
		"another user":         func(x string) string { return strings.Replace(x, "+2000000007:+2000000007", "+0:+0", 1) },
		"another tap":          func(x string) string { return strings.Replace(x, "tap-node2", "eth0", 1) },
		"a script to run": func(x string) string {
			return strings.Replace(x, `<model type="virtio">`, `<script path="/tmp/evil.sh"></script><model type="virtio">`, 1)
		},
	} {
		got, err := checkArrivingXML(receivingXML, edit(dest))
		if err != nil {
			t.Errorf("%s: refused (%v); want it replaced by this node's", name, err)
			continue
		}
		for _, bad := range []string{"/etc/shadow", "/tmp/evil", "/etc/passwd", "+0:+0", `dev="eth0"`} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: %s passed on:\n%s", name, bad, got)
			}
		}
	}
	// ...and what would add to it is refused.
	for name, tc := range map[string]struct {
		edit func(string) string
		want string
	}{
		"a disk more": {func(x string) string {
			return strings.Replace(x, "<interface", `<disk type="file" device="disk"><source file="/etc/shadow"/><target dev="sdz" bus="scsi"/></disk><interface`, 1)
		}, "it has 3 disks"},
		"a host directory shared": {func(x string) string {
			return strings.Replace(x, "<interface", `<filesystem type="mount"><source dir="/"/><target dir="root"/></filesystem><interface`, 1)
		}, "filesystem"},
		"a QEMU option": {func(x string) string {
			return strings.Replace(x, "</devices>", "</devices><commandline xmlns='http://libvirt.org/schemas/domain/qemu/1.0'><arg value='-chardev'/></commandline>", 1)
		}, "passes options to QEMU"},
		"another guest": {func(x string) string { return strings.Replace(x, "9b1f4a52", "00000000", 1) }, "not virtlet-0123456789ab-vm"},
		"another NIC":   {func(x string) string { return strings.Replace(x, "52:54:00:aa:bb:cc", "52:54:00:aa:bb:cd", 1) }, "network interface"},
	} {
		_, err := checkArrivingXML(receivingXML, tc.edit(dest))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal saying %q", name, err, tc.want)
		}
	}
}

func TestOnlyAKVMGuestIsCopiedLive(t *testing.T) {
	for _, tc := range []struct {
		xml  string
		live bool
	}{
		{`<domain type="kvm"><name>a</name></domain>`, true},
		{`<domain type="qemu"><name>a</name></domain>`, false},
		{`<domain><name>a</name></domain>`, false},
	} {
		typ, err := domainType(tc.xml)
		if err != nil {
			t.Fatalf("domainType(%s): %v", tc.xml, err)
		}
		flags, live := migrationFlags(typ)
		if live != tc.live || (flags&libvirt.MIGRATE_LIVE != 0) != tc.live {
			t.Errorf("%s: flags %#x, live %v; want live %v", tc.xml, flags, live, tc.live)
		}
		if want := libvirt.MIGRATE_PEER2PEER | libvirt.MIGRATE_ABORT_ON_ERROR; flags&want != want {
			t.Errorf("%s: flags %#x lack peer to peer and abort on error", tc.xml, flags)
		}
	}
	if _, err := domainType("<domain"); err == nil {
		t.Error("domainType of malformed XML: no error")
	}
}
