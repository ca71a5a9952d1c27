package libvirt

import (
	"fmt"
	"net"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setNetwork sets the VM's NICs, one on each pod interface's host bridge;
// a pool domain has none (they are plugged in when a VM claims it).
func setNetwork(d *libvirtxml.Domain, in domainInput, slots pciSlots) error {
	if in.Pool != nil {
		return nil
	}
	for i, nic := range in.Spec.NICs {
		iface, err := domainInterface(i, nic)
		if err != nil {
			return fmt.Errorf("VM %s: %w", in.Spec.Name, err)
		}
		iface.Address = slots.at(nth(slots.nics, i))
		d.Devices.Interfaces = append(d.Devices.Interfaces, iface)
	}
	return nil
}

// domainInterface is a virtio NIC on the pod's host bridge: libvirt makes
// the tap, plugs it into the bridge, and removes it when the VM stops, so
// QEMU needs no privileges and no file descriptor crosses a process.
func domainInterface(i int, nic ports.NIC) (libvirtxml.DomainInterface, error) {
	field := fmt.Sprintf("NIC %d (%s)", i, nic.Name)
	if nic.Bridge == "" {
		return libvirtxml.DomainInterface{}, &ports.InvalidError{Field: field + " bridge", Allowed: "the host bridge the network plugin made"}
	}
	mac, err := net.ParseMAC(nic.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return libvirtxml.DomainInterface{}, &ports.InvalidError{Field: field + " MAC", Value: nic.MAC, Allowed: "a unicast Ethernet address"}
	}
	iface := libvirtxml.DomainInterface{
		MAC:    &libvirtxml.DomainInterfaceMAC{Address: mac.String()},
		Source: &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: nic.Bridge}},
		Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	}
	if nic.MTU > 0 {
		iface.MTU = &libvirtxml.DomainInterfaceMTU{Size: uint(nic.MTU)}
	}
	return iface, nil
}
