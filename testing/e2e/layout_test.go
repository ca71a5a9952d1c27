package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/testing/harness"
)

// The libvirt plugin gives every PCI device of a pc machine its slot, and
// on q35 its PCIe root port (a pool domain, launched before a pod's NICs
// and disks exist, must leave theirs free). The slots are the ones libvirt itself gives the same
// domain without them, so that a cold VM's guest sees what it always saw:
// each golden domain of the plugin, its PCI addresses and its explicit
// virtio-serial controller taken out (as it was before), is defined in the
// real libvirtd, and libvirt's placement is compared with the plugin's.
func TestColdPCILayoutIsLibvirts(t *testing.T) {
	parallel(t)
	goldens, err := filepath.Glob(filepath.Join(harness.RepoRoot(), "adapters", "libvirt", "testdata", "*.xml"))
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden domains: %v", err)
	}
	pciAddress := regexp.MustCompile(`\s*<address type="pci"[^>]*></address>`)
	virtioSerial := regexp.MustCompile(`(?s)\s*<controller type="virtio-serial" index="0">\s*</controller>`)
	// q35's root ports go too: libvirt adds one per device itself, as it
	// did for the q35 VMs defined before the plugin laid them out.
	rootPorts := regexp.MustCompile(`\s*<controller type="pci" index="\d+" model="pcie-root-port"></controller>`)
	virtletMetadata := regexp.MustCompile(`(?s)\s*<metadata>.*?</metadata>`)
	dir := harness.VMDir(t)
	placed, checked, skipped := 0, 0, 0
	for _, golden := range goldens {
		data, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		var ours libvirtxml.Domain
		if err := ours.Unmarshal(string(data)); err != nil {
			t.Fatalf("%s: %v", golden, err)
		}
		if !strings.Contains(string(data), `<address type="pci"`) || strings.HasPrefix(filepath.Base(golden), "pool-") {
			continue // no layout of the plugin's; a pool domain leaves its pod's slots free
		}
		placed++
		t.Run(strings.TrimSuffix(filepath.Base(golden), ".xml"), func(t *testing.T) {
			name := fmt.Sprintf("virtlet-layout-%s", uuid.NewString()[:8])
			x := rootPorts.ReplaceAllString(virtioSerial.ReplaceAllString(pciAddress.ReplaceAllString(string(data), ""), ""), "")
			x = strings.Replace(x, "<name>"+ours.Name+"</name>", "<name>"+name+"</name>", 1)
			x = strings.ReplaceAll(x, ours.UUID, uuid.NewString())
			x = strings.ReplaceAll(x, "/var/lib/virtlet", dir) // the test's own directory: cleaned up after it
			// Without Virtlet's metadata the domain is no daemon's: a libvirt
			// plugin of another test resyncing meanwhile would otherwise take
			// a domain of its own without a record (the golden files name no
			// owner) and remove it as an orphan.
			x = virtletMetadata.ReplaceAllString(x, "")
			def := filepath.Join(dir, name+".xml")
			if err := os.WriteFile(def, []byte(x), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := harness.Virsh("define", def); err != nil {
				if strings.Contains(out, "unknown watchdog model 'itco'") {
					// TestBadInputLeavesNothing checks the error a pod gets.
					skipped++
					t.Skip("this libvirt has no itco watchdog")
				}
				t.Fatalf("define: %v: %s", err, out)
			}
			defer harness.Virsh("undefine", "--nvram", name)
			out, err := harness.Virsh("dumpxml", "--inactive", name)
			if err != nil {
				t.Fatalf("dumpxml: %v: %s", err, out)
			}
			var theirs libvirtxml.Domain
			if err := theirs.Unmarshal(out); err != nil {
				t.Fatal(err)
			}
			if want, got := pciSlots(&theirs), pciSlots(&ours); want != got {
				t.Fatalf("the plugin's slots differ from libvirt's:\nplugin:  %s\nlibvirt: %s", got, want)
			}
			checked++
		})
	}
	// A golden set without placed domains, or a subtest that ended
	// before its comparison, would check nothing.
	if placed == 0 || checked+skipped != placed || checked == 0 {
		t.Fatalf("%d of %d golden domains with PCI slots compared, %d skipped (of %d goldens)", checked, placed, skipped, len(goldens))
	}
	t.Logf("%d golden domains placed as libvirt places them", checked)
}

// pciSlots lists the PCI slots of a domain's devices, by kind.
func pciSlots(d *libvirtxml.Domain) string {
	slot := func(a *libvirtxml.DomainAddress) string {
		if a == nil || a.PCI == nil || a.PCI.Slot == nil {
			return "-"
		}
		bus := uint(0)
		if a.PCI.Bus != nil {
			bus = *a.PCI.Bus
		}
		return fmt.Sprintf("%d.%d", bus, *a.PCI.Slot) // q35: a root port's bus
	}
	var out []string
	for _, f := range d.Devices.Filesystems {
		out = append(out, "fs:"+slot(f.Address))
	}
	for _, n := range d.Devices.Interfaces {
		out = append(out, "nic:"+slot(n.Address))
	}
	for _, kind := range []string{"scsi", "virtio-serial"} { // libvirt lists controllers by kind
		for _, c := range d.Devices.Controllers {
			if c.Type == kind {
				out = append(out, c.Type+":"+slot(c.Address))
			}
		}
	}
	for _, disk := range d.Devices.Disks {
		if disk.Target != nil && disk.Target.Bus == "virtio" {
			out = append(out, disk.Target.Dev+":"+slot(disk.Address))
		}
	}
	if b := d.Devices.MemBalloon; b != nil {
		out = append(out, "balloon:"+slot(b.Address))
	}
	for _, r := range d.Devices.RNGs {
		out = append(out, "rng:"+slot(r.Address))
	}
	for _, w := range d.Devices.Watchdogs {
		out = append(out, "watchdog:"+slot(w.Address))
	}
	for _, v := range d.Devices.Videos {
		out = append(out, "video:"+slot(v.Address))
	}
	return strings.Join(out, " ")
}
