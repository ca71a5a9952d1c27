// The definitions of a live migration: what the sending node's libvirtd
// is given for the receiving domain (destinationXML), and what the
// receiving node's plugin lets its libvirtd take of an arriving one
// (checkArrivingXML).

package libvirt

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// domainType is the libvirt type of a domain's XML: kvmAccel's or
// tcgAccel's DomainType.
func domainType(domXML string) (string, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domXML); err != nil {
		return "", err
	}
	return d.Type, nil
}

// destinationXML is the sending domain's definition with what is the
// receiving node's own taken from its definition: disk files (by target
// device), the taps of the NICs (by MAC), the console, channels and
// display, the emulator, the security labels and resource partition. The
// virtual hardware stays the running guest's.
func destinationXML(own, theirs string) (string, error) {
	var src, dst libvirtxml.Domain
	if err := src.Unmarshal(own); err != nil {
		return "", err
	}
	if err := dst.Unmarshal(theirs); err != nil {
		return "", err
	}
	if src.UUID != dst.UUID || src.Name != dst.Name {
		return "", fmt.Errorf("it is domain %s (UUID %s), not %s (%s): %w", dst.Name, dst.UUID, src.Name, src.UUID, ports.ErrInvalidArgument)
	}
	if src.Devices == nil || dst.Devices == nil {
		return "", fmt.Errorf("a definition without devices: %w", ports.ErrInvalidArgument)
	}
	disks := map[string]libvirtxml.DomainDisk{}
	for _, d := range dst.Devices.Disks {
		if d.Target != nil {
			disks[d.Target.Dev] = d
		}
	}
	for i, d := range src.Devices.Disks {
		if d.Target == nil {
			continue
		}
		theirs, ok := disks[d.Target.Dev]
		if !ok {
			return "", fmt.Errorf("it has no disk %s: %w", d.Target.Dev, ports.ErrInvalidArgument)
		}
		src.Devices.Disks[i].Source = theirs.Source
		src.Devices.Disks[i].BackingStore = theirs.BackingStore
		src.Devices.Disks[i].Auth = theirs.Auth // a network disk's: the receiving node's secret
	}
	nics := map[string]libvirtxml.DomainInterface{}
	for _, n := range dst.Devices.Interfaces {
		if n.MAC != nil {
			nics[strings.ToLower(n.MAC.Address)] = n
		}
	}
	for i, n := range src.Devices.Interfaces {
		if n.MAC == nil {
			continue
		}
		theirs, ok := nics[strings.ToLower(n.MAC.Address)]
		if !ok {
			return "", fmt.Errorf("it has no NIC with the MAC %s: %w", n.MAC.Address, ports.ErrInvalidArgument)
		}
		src.Devices.Interfaces[i].Target = theirs.Target
		src.Devices.Interfaces[i].Source = theirs.Source
	}
	// Everything else that reaches the host is the receiving node's, as
	// checkArrivingXML wants it there.
	sd, dd := src.Devices, dst.Devices
	sd.Emulator = dd.Emulator
	sd.Serials, sd.Consoles, sd.Channels, sd.Parallels, sd.Graphics = dd.Serials, dd.Consoles, dd.Channels, dd.Parallels, dd.Graphics
	sd.Filesystems, sd.Hostdevs, sd.Smartcards, sd.RedirDevs, sd.Shmems = dd.Filesystems, dd.Hostdevs, dd.Smartcards, dd.RedirDevs, dd.Shmems
	sd.TPMs, sd.RNGs, sd.Inputs, sd.Audios, sd.Watchdogs = dd.TPMs, dd.RNGs, dd.Inputs, dd.Audios, dd.Watchdogs
	sd.Memorydevs, sd.Leases, sd.Crypto, sd.PStore, sd.VSock, sd.NVRAM = dd.Memorydevs, dd.Leases, dd.Crypto, dd.PStore, dd.VSock, dd.NVRAM
	src.SecLabel, src.Resource, src.Metadata, src.MemoryBacking = dst.SecLabel, dst.Resource, dst.Metadata, dst.MemoryBacking
	if src.OS != nil && dst.OS != nil {
		src.OS.Loader, src.OS.NVRam, src.OS.Kernel, src.OS.Initrd, src.OS.DTB = dst.OS.Loader, dst.OS.NVRam, dst.OS.Kernel, dst.OS.Initrd, dst.OS.DTB
	}
	return src.Marshal()
}

// checkArrivingXML takes an arriving definition only as the guest's
// virtual hardware: its identity must be the incoming VM's, it may pass
// nothing to QEMU itself, its disks and NICs must be this node's by target
// device and MAC, and it may have no more host-reaching devices than this
// node's definition. Everything of this node in it (the emulator,
// firmware and kernel files, memory backing, labels, cgroup partition,
// the disks' and NICs' host sides, consoles, channels, displays and
// every other host-reaching device) is then replaced by this node's own,
// and the result, marshalled as checked (what libvirtxml does not know
// of is left out), is what libvirtd gets: the sending node decides
// nothing of this one.
func checkArrivingXML(ours, arriving string) (string, error) {
	var o, a libvirtxml.Domain
	if err := o.Unmarshal(ours); err != nil {
		return "", err
	}
	if err := a.Unmarshal(arriving); err != nil {
		return "", fmt.Errorf("it is not a domain definition: %v: %w", err, ports.ErrFailedPrecondition)
	}
	if err := adoptHostParts(&o, &a); err != nil {
		return "", err
	}
	return a.Marshal()
}

func adoptHostParts(o, a *libvirtxml.Domain) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf(format+": %w", append(args, ports.ErrFailedPrecondition)...)
	}
	switch {
	case a.Name != o.Name || !strings.EqualFold(a.UUID, o.UUID):
		return refuse("it is domain %s (UUID %s), not %s (%s)", a.Name, a.UUID, o.Name, o.UUID)
	case a.QEMUCommandline != nil || a.QEMUCapabilities != nil || a.QEMUOverride != nil || a.QEMUDeprecation != nil:
		return refuse("it passes options to QEMU itself")
	case a.Devices == nil || o.Devices == nil:
		return refuse("it has no devices")
	}
	disks := map[string]libvirtxml.DomainDisk{}
	for _, d := range o.Devices.Disks {
		if d.Target != nil {
			disks[d.Target.Dev] = d
		}
	}
	if len(a.Devices.Disks) != len(o.Devices.Disks) {
		return refuse("it has %d disks, this node's definition %d", len(a.Devices.Disks), len(o.Devices.Disks))
	}
	for i, d := range a.Devices.Disks {
		if d.Target == nil {
			return refuse("a disk without a target")
		}
		ourDisk, ok := disks[d.Target.Dev]
		if !ok || d.Device != ourDisk.Device {
			return refuse("its disk %s is not this node's", d.Target.Dev)
		}
		ad := &a.Devices.Disks[i]
		ad.Source, ad.BackingStore, ad.Auth, ad.Driver = ourDisk.Source, ourDisk.BackingStore, ourDisk.Auth, ourDisk.Driver
		ad.Encryption, ad.Mirror = ourDisk.Encryption, nil
	}
	nics := map[string]libvirtxml.DomainInterface{}
	for _, n := range o.Devices.Interfaces {
		if n.MAC != nil {
			nics[strings.ToLower(n.MAC.Address)] = n
		}
	}
	if len(a.Devices.Interfaces) != len(o.Devices.Interfaces) {
		return refuse("it has %d network interfaces, this node's definition %d", len(a.Devices.Interfaces), len(o.Devices.Interfaces))
	}
	for i, n := range a.Devices.Interfaces {
		if n.MAC == nil {
			return refuse("a network interface without a MAC")
		}
		ourNIC, ok := nics[strings.ToLower(n.MAC.Address)]
		if !ok {
			return refuse("its network interface %s is not this node's", n.MAC.Address)
		}
		an := &a.Devices.Interfaces[i]
		an.Source, an.Target, an.Script, an.DownScript, an.Backend, an.ROM = ourNIC.Source, ourNIC.Target, ourNIC.Script, ourNIC.DownScript, ourNIC.Backend, ourNIC.ROM
		an.Driver = ourNIC.Driver
	}
	// Every other device that reaches the host: no more than this node's
	// definition has, and then this node's.
	ad, od := a.Devices, o.Devices
	for _, kind := range []struct {
		name      string
		its, mine int
	}{
		{"filesystem", len(ad.Filesystems), len(od.Filesystems)},
		{"host device", len(ad.Hostdevs), len(od.Hostdevs)},
		{"serial port", len(ad.Serials), len(od.Serials)},
		{"console", len(ad.Consoles), len(od.Consoles)},
		{"channel", len(ad.Channels), len(od.Channels)},
		{"parallel port", len(ad.Parallels), len(od.Parallels)},
		{"display", len(ad.Graphics), len(od.Graphics)},
		{"smartcard", len(ad.Smartcards), len(od.Smartcards)},
		{"USB redirection", len(ad.RedirDevs), len(od.RedirDevs)},
		{"shared memory", len(ad.Shmems), len(od.Shmems)},
		{"TPM", len(ad.TPMs), len(od.TPMs)},
		{"random source", len(ad.RNGs), len(od.RNGs)},
		{"input", len(ad.Inputs), len(od.Inputs)},
		{"audio", len(ad.Audios), len(od.Audios)},
		{"watchdog", len(ad.Watchdogs), len(od.Watchdogs)},
		{"memory device", len(ad.Memorydevs), len(od.Memorydevs)},
		{"lease", len(ad.Leases), len(od.Leases)},
		{"crypto device", len(ad.Crypto), len(od.Crypto)},
	} {
		if kind.its > kind.mine {
			return refuse("it has %d %s devices, this node's definition %d", kind.its, kind.name, kind.mine)
		}
	}
	ad.Emulator = od.Emulator
	ad.Filesystems, ad.Hostdevs, ad.Serials, ad.Consoles, ad.Channels, ad.Parallels, ad.Graphics = od.Filesystems, od.Hostdevs, od.Serials, od.Consoles, od.Channels, od.Parallels, od.Graphics
	ad.Smartcards, ad.RedirDevs, ad.Shmems, ad.TPMs, ad.RNGs, ad.Inputs, ad.Audios = od.Smartcards, od.RedirDevs, od.Shmems, od.TPMs, od.RNGs, od.Inputs, od.Audios
	ad.Watchdogs, ad.Memorydevs, ad.Leases, ad.Crypto, ad.PStore, ad.VSock, ad.NVRAM = od.Watchdogs, od.Memorydevs, od.Leases, od.Crypto, od.PStore, od.VSock, od.NVRAM
	a.MemoryBacking, a.SecLabel, a.Resource, a.Metadata = o.MemoryBacking, o.SecLabel, o.Resource, o.Metadata
	if a.OS != nil && o.OS != nil {
		a.OS.Loader, a.OS.NVRam, a.OS.Kernel, a.OS.Initrd, a.OS.DTB, a.OS.Cmdline = o.OS.Loader, o.OS.NVRam, o.OS.Kernel, o.OS.Initrd, o.OS.DTB, o.OS.Cmdline
	} else if a.OS != nil {
		a.OS.Loader, a.OS.NVRam, a.OS.Kernel, a.OS.Initrd, a.OS.DTB = nil, nil, "", "", ""
	}
	return nil
}
