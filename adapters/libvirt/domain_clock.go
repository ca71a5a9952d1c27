package libvirt

import (
	"strconv"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setClock sets the guest's clock and timers.
func setClock(d *libvirtxml.Domain, in domainInput, _ pciSlots) error {
	d.Clock = clockXML(in.Spec.Clock)
	return nil
}

// clockXML is the domain's <clock>: UTC unless the pod asks otherwise.
func clockXML(c ports.ClockSpec) *libvirtxml.DomainClock {
	x := &libvirtxml.DomainClock{Offset: "utc"}
	switch c.Offset {
	case "localtime":
		x.Offset = "localtime"
	case "timezone":
		x.Offset, x.TimeZone = "timezone", c.Timezone
	case "variable":
		x.Offset, x.Basis, x.Adjustment = "variable", "utc", strconv.FormatInt(c.AdjustmentSeconds, 10)
	}
	for _, t := range c.Timers {
		x.Timer = append(x.Timer, libvirtxml.DomainTimer{Name: t.Name, TickPolicy: t.TickPolicy, Present: t.Present})
	}
	return x
}
