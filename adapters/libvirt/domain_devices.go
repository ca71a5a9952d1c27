package libvirt

import (
	"slices"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setDevices sets the devices every VM has: the controllers, the VNC
// display and its video card, the guest agent's channel, the RNG, the
// panic device and the watchdog.
func setDevices(d *libvirtxml.Domain, in domainInput, slots pciSlots) error {
	dev := d.Devices
	dev.Controllers = []libvirtxml.DomainController{{Type: "usb", Model: "none"}}
	// A q35 machine's root ports, one per device, in the layout's order
	// (libvirt places them on pcie.0).
	for i := uint(1); i <= slots.rootPorts; i++ {
		dev.Controllers = append(dev.Controllers, libvirtxml.DomainController{Type: "pci", Index: uintp(i), Model: "pcie-root-port"})
	}
	if slots.serial != 0 {
		// The agent channel's controller, made explicit to give it its slot.
		dev.Controllers = append(dev.Controllers, libvirtxml.DomainController{Type: "virtio-serial", Index: uintp(0), Address: slots.at(slots.serial)})
	}
	// VNC on a unix socket libvirt makes in the domain's private
	// directory: only the VM's QEMU user and root (the daemon's
	// `virtletctl vnc`) may open it; a TCP port, even on loopback, lets
	// any local process drive any VM.
	dev.Graphics = []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{
		Listeners: []libvirtxml.DomainGraphicListener{{Socket: &libvirtxml.DomainGraphicListenerSocket{}}},
	}}}
	dev.Videos = []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "vga", Heads: 1, Primary: "yes"}, Address: slots.videoAt()}}
	// The guest agent's channel: exec and exec probes go through it;
	// libvirt picks the socket and reports whether the agent listens.
	dev.Channels = []libvirtxml.DomainChannel{{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: AgentChannel}},
	}}
	dev.RNGs = []libvirtxml.DomainRNG{{Model: "virtio", Address: slots.at(slots.rng),
		Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}}
	dev.Panics = []libvirtxml.DomainPanic{{Model: "isa"}}
	if w := in.Spec.Watchdog; w != nil {
		// The action's names are libvirt's ("dump" keeps the guest's memory
		// in libvirtd's auto-dump directory and lets the VM run on).
		dev.Watchdogs = []libvirtxml.DomainWatchdog{{Model: w.Model, Action: w.Action, Address: slots.at(slots.watchdog)}}
	}
	return nil
}

// pciSlots are the slots of a VM's PCI devices on a pc machine's pci.0,
// given in the order libvirt itself gives them, so that a cold VM keeps
// the layout it always had: 9p shares, NICs, the virtio-scsi controller,
// the virtio-serial controller (the agent's channel), virtio disks, the
// balloon, the RNG, the watchdog (slot 1 is the PIIX3, 2 the VGA). They
// are explicit because a pool domain, launched before the pod's NICs and
// disks exist, must leave their slots free: the guest of a pooled VM then
// sees every device where a cold start puts it. Slot 0 means libvirt's
// choice.
//
// On a q35 machine each device has a PCIe root port of its own, in the
// same order: the slots are then the ports' indexes (pci.1, pci.2, …),
// and a pool domain is launched with every port, the ones its claim
// hot-plugs into empty.
type pciSlots struct {
	video, scsi, serial, balloon, rng, watchdog uint
	filesystems, nics                           []uint
	disks                                       map[int]uint // virtio disks, by index in the spec
	rootPorts                                   uint         // q35: pci.1 to pci.rootPorts
}

// lastPCISlot is pci.0's last slot; libvirt puts what does not fit
// behind a PCI bridge. A q35 machine's root ports are held to as many.
const lastPCISlot = 31

// layoutPCI lays out a VM's PCI devices on a pc or q35 machine; none
// (libvirt's choice) when they do not fit, or on a q35 machine with the
// i6300esb watchdog, a conventional PCI device that needs a bridge.
func layoutPCI(s ports.VMSpec) pciSlots {
	m := machineOrDefault(s.Machine)
	q35 := q35Machine(m)
	if !q35 && !i440fxMachine(m) {
		return pciSlots{}
	}
	next := uint(3)
	p := pciSlots{video: 2, disks: map[int]uint{}}
	if q35 {
		// The VGA sits on pcie.0 itself (videoAt).
		next = 1
		if s.Watchdog != nil && s.Watchdog.Model == "i6300esb" {
			return pciSlots{}
		}
	}
	take := func() uint {
		next++
		return next - 1
	}
	for range s.Filesystems {
		p.filesystems = append(p.filesystems, take())
	}
	for range s.NICs {
		p.nics = append(p.nics, take())
	}
	if slices.ContainsFunc(s.Disks, func(d ports.Disk) bool { return d.Bus == ports.BusSCSI }) {
		p.scsi = take()
	}
	p.serial = take()
	for i, d := range s.Disks {
		if d.Bus == ports.BusVirtio {
			p.disks[i] = take()
		}
	}
	p.balloon, p.rng = take(), take()
	if s.Watchdog != nil && s.Watchdog.Model == "i6300esb" {
		p.watchdog = take()
	}
	if next-1 > lastPCISlot {
		return pciSlots{}
	}
	if q35 {
		p.rootPorts = next - 1
	}
	return p
}

// at is a slot's address: on pci.0, or on a q35 machine the first slot
// of that root port's bus (nil for libvirt's choice).
func (p pciSlots) at(slot uint) *libvirtxml.DomainAddress {
	if slot == 0 {
		return nil
	}
	if p.rootPorts > 0 {
		return &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: uintp(0), Bus: uintp(slot), Slot: uintp(0), Function: uintp(0)}}
	}
	return &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: uintp(0), Bus: uintp(0), Slot: uintp(slot), Function: uintp(0)}}
}

// videoAt is the VGA's address: its slot on pci.0, or on a q35 machine
// pcie.0's slot 1, where libvirt puts it.
func (p pciSlots) videoAt() *libvirtxml.DomainAddress {
	if p.rootPorts > 0 {
		return &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: uintp(0), Bus: uintp(0), Slot: uintp(1), Function: uintp(0)}}
	}
	return p.at(p.video)
}

func nth(slots []uint, i int) uint {
	if i < len(slots) {
		return slots[i]
	}
	return 0
}
