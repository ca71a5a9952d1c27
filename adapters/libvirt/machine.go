package libvirt

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// defaultMachine is the machine type of a VM that asks for none.
const defaultMachine = "pc"

func machineOrDefault(m string) string {
	if m == "" {
		return defaultMachine
	}
	return m
}

// checkMachine refuses a machine type the node's QEMU does not offer for
// the accelerator in use, listing the ones it does.
func (h *Hypervisor) checkMachine(conn *libvirt.Connect, accel accelerator, machine string) error {
	if machine == "" || machine == defaultMachine {
		return nil
	}
	offered, err := h.machines(conn, accel)
	if err != nil {
		return err
	}
	if slices.Contains(offered, machine) {
		return nil
	}
	return &ports.InvalidError{Field: "annotation VirtletMachineType", Value: machine,
		Reason: "the node's QEMU has no such machine type", Allowed: strings.Join(offered, ", ")}
}

// machines lists the x86_64 machine types (names and aliases) libvirt
// reports for the accelerator's domain type, once per plugin process.
func (h *Hypervisor) machines(conn *libvirt.Connect, accel accelerator) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.machineTypes != nil {
		return h.machineTypes, nil
	}
	capsXML, err := conn.GetCapabilities()
	if err != nil {
		return nil, libvirtError("read capabilities", err)
	}
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		return nil, fmt.Errorf("parse libvirt's capabilities: %w", err)
	}
	h.machineTypes = machinesOf(caps, accel.DomainType)
	return h.machineTypes, nil
}

// machinesOf picks the x86_64 HVM guest's PC machine types (pc, q35 and
// their versions: the ones a VM pod's devices fit) for a domain type (its
// own list if it has one, else the emulator's), with their canonical
// names.
func machinesOf(caps libvirtxml.Caps, domainType string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(ms []libvirtxml.CapsGuestMachine) {
		for _, m := range ms {
			for _, n := range []string{m.Name, m.Canonical} {
				if pcMachine(n) && !seen[n] {
					seen[n] = true
					out = append(out, n)
				}
			}
		}
	}
	for _, g := range caps.Guests {
		if g.OSType != "hvm" || g.Arch.Name != "x86_64" {
			continue
		}
		for _, d := range g.Arch.Domains {
			if d.Type == domainType {
				add(d.Machines)
			}
		}
		if len(out) == 0 {
			add(g.Arch.Machines)
		}
	}
	sort.Strings(out)
	return out
}

// pcMachine: the i440FX and Q35 machines, not isapc, microvm or x-remote.
func pcMachine(name string) bool {
	return name == "pc" || name == "q35" || strings.HasPrefix(name, "pc-i440fx-") || strings.HasPrefix(name, "pc-q35-")
}
