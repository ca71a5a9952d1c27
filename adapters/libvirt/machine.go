package libvirt

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

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

// machineTypes caches the machine types libvirt offers. Its lock is taken
// alone.
type machineTypes struct {
	mu      sync.Mutex
	offered []string
}

// check refuses a machine type the node's QEMU does not offer for the
// accelerator in use, listing the ones it does.
func (m *machineTypes) check(conn *libvirt.Connect, accel accelerator, machine string) error {
	if machine == "" || machine == defaultMachine {
		return nil
	}
	offered, err := m.list(conn, accel)
	if err != nil {
		return err
	}
	if slices.Contains(offered, machine) {
		return nil
	}
	return &ports.InvalidError{Field: "annotation VirtletMachineType", Value: machine,
		Reason: "the node's QEMU has no such machine type", Allowed: strings.Join(offered, ", ")}
}

// list lists the x86_64 machine types (names and aliases) libvirt
// reports for the accelerator's domain type, once per plugin process. Like
// every libvirt call here, the capabilities are read without a lock held.
func (m *machineTypes) list(conn *libvirt.Connect, accel accelerator) ([]string, error) {
	m.mu.Lock()
	cached := m.offered
	m.mu.Unlock()
	if cached != nil {
		return cached, nil
	}
	capsXML, err := conn.GetCapabilities()
	if err != nil {
		return nil, libvirtError("read capabilities", err)
	}
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		return nil, fmt.Errorf("parse libvirt's capabilities: %w", err)
	}
	offered := append([]string{}, machinesOf(caps, accel.DomainType)...) // not nil: cached even when empty
	m.mu.Lock()
	m.offered = offered
	m.mu.Unlock()
	return offered, nil
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
func pcMachine(name string) bool { return i440fxMachine(name) || q35Machine(name) }

// i440fxMachine: pc, or one of its versions.
func i440fxMachine(name string) bool { return name == "pc" || strings.HasPrefix(name, "pc-i440fx-") }

// q35Machine: q35, or one of its versions.
func q35Machine(name string) bool { return name == "q35" || strings.HasPrefix(name, "pc-q35-") }

// checkHost refuses a VM the node cannot run as its spec asks: a machine
// type, watchdog or hugepages it lacks, Hyper-V enlightenments without
// KVM, CPUs it does not have online. It returns the host's online CPUs
// when the VM is pinned.
func checkHost(conn *libvirt.Connect, machines *machineTypes, spec ports.VMSpec, accel accelerator) ([]int, error) {
	if err := machines.check(conn, accel, spec.Machine); err != nil {
		return nil, err
	}
	if err := checkWatchdog(conn, spec.Watchdog); err != nil {
		return nil, err
	}
	if err := checkHugepages(conn, spec.HugepageSizeBytes, spec.MemoryBytes); err != nil {
		return nil, err
	}
	if spec.HyperV && accel.DomainType != kvmAccel.DomainType {
		return nil, &ports.InvalidError{Field: "annotation VirtletHyperV", Value: "true",
			Reason:  fmt.Sprintf("Hyper-V enlightenments need KVM; this node runs its VMs under %s (%s)", accel.Name, accel.Reason),
			Allowed: "false, or a node whose VMs run under KVM"}
	}
	return checkCPUSet(conn, spec.CPUSet)
}

// itcoSince is the first libvirt with the iTCO watchdog model (9.1.0).
const itcoSince = 9_001_000

// checkWatchdog refuses an iTCO watchdog where libvirt does not know it
// (its schema would refuse the domain with a less telling error). Setting
// Q35's TCO timer up through QEMU's own options instead is no way round:
// libvirt 9.0 dereferences the domain's missing <watchdog> when a watchdog
// fires, and libvirtd dies (seen here: segfault in libvirt_driver_qemu.so).
func checkWatchdog(conn *libvirt.Connect, w *ports.Watchdog) error {
	if w == nil || w.Model != "itco" {
		return nil
	}
	v, err := conn.GetLibVersion()
	if err != nil {
		return libvirtError("libvirt's version", err)
	}
	if v >= itcoSince {
		return nil
	}
	return &ports.InvalidError{Field: "annotation VirtletWatchdog", Value: w.Model, Allowed: "i6300esb",
		Reason: fmt.Sprintf("this node's libvirt %s has no iTCO watchdog (libvirt 9.1 has)", version(v))}
}

// checkHugepages refuses a hugepage-backed VM the node has too few free
// pages of its size for (kubelet accounts for hugepages per node, but the
// pages may be held by others or never reserved).
func checkHugepages(conn *libvirt.Connect, size, memory int64) error {
	if size == 0 {
		return nil
	}
	info, err := conn.GetNodeInfo()
	if err != nil {
		return libvirtError("the host's NUMA cells", err)
	}
	cells := info.Nodes
	if cells == 0 {
		cells = 1
	}
	free, err := conn.GetFreePages([]uint64{uint64(size >> 10)}, 0, uint(cells), 0)
	if err != nil {
		return fmt.Errorf("hugepages of %d KiB on this node: %w: %w", size>>10, libvirtError("free pages", err), ports.ErrFailedPrecondition)
	}
	var total uint64
	for _, n := range free {
		total += n
	}
	if need := uint64(memory / size); total < need {
		return fmt.Errorf("the VM's memory needs %d hugepages of %d KiB, the node has %d free (reserve them in /sys/kernel/mm/hugepages): %w",
			need, size>>10, total, ports.ErrFailedPrecondition)
	}
	return nil
}

// checkCPUSet returns the host's online CPUs when the VM is to be pinned,
// refusing CPUs the host does not have online.
func checkCPUSet(conn *libvirt.Connect, set []int) ([]int, error) {
	if len(set) == 0 {
		return nil, nil
	}
	online, _, err := conn.GetCPUMap(0)
	if err != nil {
		return nil, libvirtError("the host's CPUs", err)
	}
	var host []int
	for c, on := range online {
		if on {
			host = append(host, c)
		}
	}
	sort.Ints(host)
	for _, c := range set {
		if !online[c] {
			return nil, &ports.InvalidError{Field: "resources cpuset_cpus", Value: cpuList(set),
				Reason: fmt.Sprintf("CPU %d is not online on this node", c), Allowed: "the node's online CPUs " + cpuList(host)}
		}
	}
	return host, nil
}
