package libvirt

import (
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setMemory sets the memory: the most the VM can be resized to, what it
// starts with (its balloon holding the rest), its hugepages, and the
// balloon, through which the guest reports its memory use every few
// seconds (stats) and hands back the pages it frees (free page reporting:
// QEMU drops them, so the host gets back what the guest no longer uses).
func setMemory(d *libvirtxml.Domain, in domainInput, slots pciSlots) error {
	s := in.Spec
	d.Memory = &libvirtxml.DomainMemory{Value: uint((maxMemory(s) + 1023) / 1024), Unit: "KiB"}
	if s.MaxMemoryBytes > s.MemoryBytes {
		d.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: uint((s.MemoryBytes + 1023) / 1024), Unit: "KiB"}
	}
	if size := s.HugepageSizeBytes; size > 0 {
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: &libvirtxml.DomainMemoryHugepages{
			Hugepages: []libvirtxml.DomainMemoryHugepage{{Size: uint(size >> 10), Unit: "KiB"}}}}
	}
	if s.NoMemorySharing {
		// QEMU marks guest memory mergeable unless told otherwise.
		if d.MemoryBacking == nil {
			d.MemoryBacking = &libvirtxml.DomainMemoryBacking{}
		}
		d.MemoryBacking.MemoryNosharepages = &libvirtxml.DomainMemoryNosharepages{}
	}
	d.Devices.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "virtio", FreePageReporting: "on",
		Stats: &libvirtxml.DomainMemBalloonStats{Period: balloonPeriod}, Address: slots.at(slots.balloon)}
	return nil
}

// maxMemory is the most memory the VM can be resized to.
func maxMemory(s ports.VMSpec) int64 {
	if s.MaxMemoryBytes > s.MemoryBytes {
		return s.MaxMemoryBytes
	}
	return s.MemoryBytes
}
