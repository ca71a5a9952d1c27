package libvirt

import (
	"libvirt.org/go/libvirtxml"
)

// setConsole sets the serial console: a pty that virtlogd also writes to
// the VM's console log, which the plugin streams to the CRI log.
func setConsole(d *libvirtxml.Domain, in domainInput, _ pciSlots) error {
	zero := uint(0)
	d.Devices.Serials = []libvirtxml.DomainSerial{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainSerialTarget{Port: &zero},
		Log:    &libvirtxml.DomainChardevLog{File: in.ConsoleLog, Append: "on"},
	}}
	d.Devices.Consoles = []libvirtxml.DomainConsole{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &zero},
	}}
	return nil
}
