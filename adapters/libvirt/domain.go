package libvirt

import (
	"cmp"
	"encoding/xml"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Ownership marks. A domain is Virtlet's when its name has NamePrefix and
// its metadata holds a <virtlet:vm> element in MetadataNS; nothing else on a
// shared libvirtd is ever touched.
const (
	NamePrefix  = "virtlet-"
	MetadataNS  = "https://virtlet.cloud/xmlns/domain/v1"
	metadataKey = "virtlet"
)

// AgentChannel is the virtio-serial port qemu-guest-agent listens on.
const AgentChannel = "org.qemu.guest_agent.0"

// balloonPeriod is how often (seconds) guests report memory statistics.
const balloonPeriod = 5

// vmMetadata is the <virtlet:vm> element of our domains.
type vmMetadata struct {
	XMLName   xml.Name `xml:"vm"`
	ID        string   `xml:"id,attr"`
	Sandbox   string   `xml:"sandbox,attr,omitempty"`
	Pod       string   `xml:"pod,attr,omitempty"`
	CreatedBy string   `xml:"createdBy,attr"`
	// Owner is the plugin instance that made the domain (a hash of its
	// state directory): another daemon on the same libvirtd leaves it
	// alone. Domains made before owners were recorded have none.
	Owner string `xml:"owner,attr,omitempty"`
}

// domainInput is everything a domain definition needs beyond the VM spec.
type domainInput struct {
	Spec       ports.VMSpec
	DomainType string            // "kvm" or "qemu" (TCG)
	DiskPaths  map[string]string // resolved paths of overlay disks, by disk name
	ConsoleLog string            // raw serial log written by virtlogd
	// Secrets are the UUIDs of the libvirt secrets holding network disks'
	// keys, by disk name: the domain names the secret, never the key.
	Secrets map[string]string
	// HostCPUs are the host's online CPUs, for pinning (Spec.CPUSet).
	HostCPUs []int
	// Pool, when set, renders the pool domain of the spec's shape, paused
	// until a VM of that shape claims it: it has its root disk, but the
	// devices a pod brings (other disks, NICs) are left out and their PCI
	// slots free, a SCSI CD-ROM is an empty tray; the metadata marks it as
	// the pool's.
	Pool *poolMetadata
	// Owner is recorded in a VM domain's metadata (vmMetadata.Owner).
	Owner string
}

// domainXML renders the libvirt domain of a VM. It is deterministic, so
// golden files can hold it.
func domainXML(in domainInput) (string, error) {
	d, err := buildDomain(in)
	if err != nil {
		return "", err
	}
	return d.Marshal()
}

// newVMMetadata is the metadata of VM s's domain, made by plugin instance
// owner.
func newVMMetadata(s ports.VMSpec, owner string) vmMetadata {
	return vmMetadata{ID: s.ID, Sandbox: s.SandboxID, Pod: s.PodNamespace + "/" + s.PodName, CreatedBy: "virtlet", Owner: owner}
}

// metadataXML is a domain's <virtlet:…> element: the VM's, or the pool's
// for a pool domain.
func metadataXML(in domainInput) (string, error) {
	var v interface{} = newVMMetadata(in.Spec, in.Owner)
	if in.Pool != nil {
		v = in.Pool
	}
	raw, err := xml.Marshal(v)
	if err != nil {
		return "", err
	}
	// <vm id=…></vm> → <virtlet:vm xmlns:virtlet="…" id=…/>
	name := strings.TrimPrefix(strings.Fields(string(raw))[0], "<")
	out := strings.Replace(string(raw), "<"+name+" ", fmt.Sprintf(`<%s:%s xmlns:%s="%s" `, metadataKey, name, metadataKey, MetadataNS), 1)
	return strings.Replace(out, "></"+name+">", "/>", 1), nil
}

// buildDomain builds the libvirt domain of a VM (or, with in.Pool, of
// the pool domain of its shape).
func buildDomain(in domainInput) (*libvirtxml.Domain, error) {
	s := in.Spec
	if !strings.HasPrefix(s.Name, NamePrefix) {
		return nil, &ports.InvalidError{Field: "VM name", Value: s.Name, Allowed: "a name starting with " + NamePrefix}
	}
	metaXML, err := metadataXML(in)
	if err != nil {
		return nil, err
	}
	slots := layoutPCI(s)

	zero := uint(0)
	d := &libvirtxml.Domain{
		Type: in.DomainType, Name: s.Name, UUID: s.UUID,
		Metadata: &libvirtxml.DomainMetadata{XML: metaXML},
		Memory:   &libvirtxml.DomainMemory{Value: uint((maxMemory(s) + 1023) / 1024), Unit: "KiB"},
		VCPU:     &libvirtxml.DomainVCPU{Placement: "static", Value: uint(s.VCPUs)},
		VCPUs:    hotplugVCPUs(s),
		SysInfo: []libvirtxml.DomainSysInfo{{SMBIOS: &libvirtxml.DomainSysInfoSMBIOS{System: &libvirtxml.DomainSysInfoSystem{
			Entry: []libvirtxml.DomainSysInfoEntry{
				{Name: "manufacturer", Value: "Virtlet"},
				{Name: "product", Value: "VM pod"},
				{Name: "uuid", Value: s.UUID},
			},
		}}}},
		OS: &libvirtxml.DomainOS{
			Type:   &libvirtxml.DomainOSType{Arch: "x86_64", Machine: machineOrDefault(s.Machine), Type: "hvm"},
			SMBios: &libvirtxml.DomainSMBios{Mode: "sysinfo"},
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		Clock:      clockXML(s.Clock),
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		SecLabel: []libvirtxml.DomainSecLabel{dacLabel(s.RunAs)},
		Devices: &libvirtxml.DomainDeviceList{
			Controllers: []libvirtxml.DomainController{{Type: "usb", Model: "none"}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: &zero},
				Log:    &libvirtxml.DomainChardevLog{File: in.ConsoleLog, Append: "on"},
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &zero},
			}},
			// VNC on a unix socket libvirt makes in the domain's private
			// directory: only the VM's QEMU user and root (the daemon's
			// `virtletctl vnc`) may open it; a TCP port, even on
			// loopback, lets any local process drive any VM.
			Graphics: []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{
				Listeners: []libvirtxml.DomainGraphicListener{{Socket: &libvirtxml.DomainGraphicListenerSocket{}}},
			}}},
			Videos: []libvirtxml.DomainVideo{{Model: libvirtxml.DomainVideoModel{Type: "vga", Heads: 1, Primary: "yes"}, Address: slots.at(slots.video)}},
			// The guest reports its memory use every few seconds (stats).
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "virtio", Stats: &libvirtxml.DomainMemBalloonStats{Period: balloonPeriod}, Address: slots.at(slots.balloon)},
			// The guest agent's channel: exec and exec probes go through
			// it; libvirt picks the socket and reports whether the agent
			// listens.
			Channels: []libvirtxml.DomainChannel{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: AgentChannel}},
			}},
			RNGs: []libvirtxml.DomainRNG{{Model: "virtio", Address: slots.at(slots.rng),
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}},
			Panics: []libvirtxml.DomainPanic{{Model: "isa"}},
		},
	}
	if slots.serial != 0 {
		// The agent channel's controller, made explicit to give it its slot.
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "virtio-serial", Index: uintp(0), Address: slots.at(slots.serial)})
	}
	cpu, err := domainCPU(s.CPU)
	if err != nil {
		return nil, err
	}
	d.CPU = cpu
	if s.MaxMemoryBytes > s.MemoryBytes {
		// The guest starts with its balloon holding what lies above its memory.
		d.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: uint((s.MemoryBytes + 1023) / 1024), Unit: "KiB"}
	}
	firmware(d, s)
	if s.HyperV {
		hyperV(d)
	}
	if size := s.HugepageSizeBytes; size > 0 {
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: &libvirtxml.DomainMemoryHugepages{
			Hugepages: []libvirtxml.DomainMemoryHugepage{{Size: uint(size >> 10), Unit: "KiB"}}}}
	}
	if d.VCPUs != nil {
		d.VCPU.Current, d.VCPU.Value = uint(s.VCPUs), uint(topVCPUs(s))
	}
	d.CPUTune = cpuTune(topVCPUs(s), s.CPUSet, in.HostCPUs)
	if w := s.Watchdog; w != nil {
		// The action's names are libvirt's ("dump" keeps the guest's memory
		// in libvirtd's auto-dump directory and lets the VM run on).
		d.Devices.Watchdogs = []libvirtxml.DomainWatchdog{{Model: w.Model, Action: w.Action, Address: slots.at(slots.watchdog)}}
	}
	if err := addDisks(d, in, slots); err != nil {
		return nil, err
	}
	for i, fs := range s.Filesystems {
		f := libvirtxml.DomainFilesystem{
			AccessMode: fs.AccessMode,
			Source:     &libvirtxml.DomainFilesystemSource{Mount: &libvirtxml.DomainFilesystemSourceMount{Dir: fs.Source}},
			Target:     &libvirtxml.DomainFilesystemTarget{Dir: fs.Tag},
		}
		if fs.ReadOnly {
			f.ReadOnly = &libvirtxml.DomainFilesystemReadOnly{}
		}
		f.Address = slots.at(nth(slots.filesystems, i))
		d.Devices.Filesystems = append(d.Devices.Filesystems, f)
	}
	for i, nic := range s.NICs {
		if in.Pool != nil {
			break // plugged in when a VM claims the pool domain
		}
		iface, err := domainInterface(i, nic)
		if err != nil {
			return nil, fmt.Errorf("VM %s: %w", s.Name, err)
		}
		iface.Address = slots.at(nth(slots.nics, i))
		d.Devices.Interfaces = append(d.Devices.Interfaces, iface)
	}
	return d, nil
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

func domainCPU(c ports.CPUSpec) (*libvirtxml.DomainCPU, error) {
	if s := c.Setting; s != nil {
		cpu := &libvirtxml.DomainCPU{Mode: s.Mode, Match: s.Match, Check: s.Check, Migratable: s.Migratable, Vendor: s.Vendor}
		if m := s.Model; m != nil {
			cpu.Model = &libvirtxml.DomainCPUModel{Fallback: m.Fallback, VendorID: m.VendorID, Value: m.Value}
		}
		if t := s.Topology; t != nil {
			cpu.Topology = &libvirtxml.DomainCPUTopology{Sockets: t.Sockets, Dies: t.Dies, Cores: t.Cores, Threads: t.Threads}
		}
		for _, f := range s.Features {
			cpu.Features = append(cpu.Features, libvirtxml.DomainCPUFeature{Policy: f.Policy, Name: f.Name})
		}
		if ca := s.Cache; ca != nil {
			cpu.Cache = &libvirtxml.DomainCPUCache{Mode: ca.Mode}
			if ca.Level > 0 {
				cpu.Cache.Level = uint(ca.Level)
			}
		}
		if n := s.Numa; n != nil {
			cpu.Numa = &libvirtxml.DomainNuma{}
			for _, cell := range n.Cells {
				dc := libvirtxml.DomainCell{CPUs: cell.CPUs, Memory: uint(cell.Memory), Unit: cell.Unit}
				if cell.ID != nil {
					id := uint(*cell.ID)
					dc.ID = &id
				}
				cpu.Numa.Cell = append(cpu.Numa.Cell, dc)
			}
		}
		return cpu, nil
	}
	switch c.Model {
	case "":
		return nil, nil // the hypervisor's default CPU
	case "host-model":
		return &libvirtxml.DomainCPU{Mode: "host-model"}, nil
	default:
		return nil, &ports.InvalidError{Field: "CPU model", Value: c.Model, Allowed: `"" or "host-model"`}
	}
}

// addDisks adds the VM's disks with stable guest device names: sdX on the
// virtio-scsi controller, vdX for virtio-blk, hdX for IDE. A pool domain
// (in.Pool) gets its root disk and a SCSI CD-ROM, as an empty tray.
func addDisks(d *libvirtxml.Domain, in domainInput, slots pciSlots) error {
	next := map[string]int{}
	devName := func(prefix string) string {
		n := next[prefix]
		next[prefix]++
		return prefix + string(rune('a'+n))
	}
	scsiUnit := uint(0)
	haveSCSI := false
	boot := uint(1)
	for i, disk := range in.Spec.Disks {
		dd := libvirtxml.DomainDisk{Device: string(disk.Device), Serial: disk.Serial}
		if dd.Device == "" {
			dd.Device = string(ports.DeviceDisk)
		}
		switch disk.Bus {
		case ports.BusSCSI:
			haveSCSI = true
			unit := scsiUnit
			scsiUnit++
			dd.Target = &libvirtxml.DomainDiskTarget{Dev: devName("sd"), Bus: "scsi"}
			dd.Address = &libvirtxml.DomainAddress{Drive: &libvirtxml.DomainAddressDrive{
				Controller: uintp(0), Bus: uintp(0), Target: uintp(0), Unit: &unit}}
		case ports.BusVirtio:
			dd.Target = &libvirtxml.DomainDiskTarget{Dev: devName("vd"), Bus: "virtio"}
			dd.Address = slots.at(slots.disks[i])
		case ports.BusIDE:
			dd.Target = &libvirtxml.DomainDiskTarget{Dev: devName("hd"), Bus: "ide"}
		case ports.BusSATA:
			dd.Target = &libvirtxml.DomainDiskTarget{Dev: devName("sd"), Bus: "sata"}
		default:
			return &ports.InvalidError{Field: "disk " + disk.Name + " bus", Value: string(disk.Bus), Allowed: "scsi, virtio, ide or sata"}
		}
		if disk.ReadOnly || disk.Device == ports.DeviceCDROM {
			dd.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		if in.Pool != nil && disk.Overlay == nil {
			// The pool domain has its root disk (an overlay of the
			// shape's image); a VM claiming it plugs its other disks in
			// and its medium into the CD-ROM's tray.
			if disk.Device == ports.DeviceCDROM && disk.Bus == ports.BusSCSI {
				dd.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu", Type: cmp.Or(disk.Source.Format, "raw")}
				d.Devices.Disks = append(d.Devices.Disks, dd)
			}
			continue
		}
		format := disk.Source.Format
		switch disk.Source.Type {
		case ports.SourceFile:
			path := disk.Source.Path
			if disk.Overlay != nil {
				path = in.DiskPaths[disk.Name]
				format = "qcow2"
			}
			if path == "" {
				return &ports.InvalidError{Field: "disk " + disk.Name, Value: "", Reason: "no file path"}
			}
			dd.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}}
			if o := disk.Overlay; o != nil {
				// The image store's file is shared by every VM of the
				// image, read-only and world-readable: libvirt must not
				// give it to one VM's user.
				dd.BackingStore = &libvirtxml.DomainDiskBackingStore{
					Format: &libvirtxml.DomainDiskFormat{Type: o.BaseFormat},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: o.BasePath,
						SecLabel: []libvirtxml.DomainDeviceSecLabel{{Model: "dac", Relabel: "no"}}}},
					BackingStore: &libvirtxml.DomainDiskBackingStore{},
				}
			}
		case ports.SourceBlock:
			if !strings.HasPrefix(disk.Source.Path, "/dev/") {
				return &ports.InvalidError{Field: "disk " + disk.Name + " device", Value: disk.Source.Path, Allowed: "a block device under /dev"}
			}
			dd.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: disk.Source.Path}}
		case ports.SourceNetwork:
			src, err := networkSource(disk, in.Secrets[disk.Name])
			if err != nil {
				return err
			}
			dd.Source = &libvirtxml.DomainDiskSource{Network: src}
		default:
			return &ports.InvalidError{Field: "disk " + disk.Name + " source type", Value: string(disk.Source.Type), Allowed: "file, block or network"}
		}
		if format != "qcow2" && format != "raw" {
			return &ports.InvalidError{Field: "disk " + disk.Name + " format", Value: format, Allowed: "qcow2 or raw"}
		}
		if disk.Source.Offset > 0 || disk.Source.Size > 0 {
			if format != "raw" || disk.Source.Offset < 0 || disk.Source.Size <= 0 {
				return &ports.InvalidError{Field: "disk " + disk.Name + " slice",
					Value: fmt.Sprintf("offset %d size %d (%s)", disk.Source.Offset, disk.Source.Size, format), Allowed: "a positive size and an offset on a raw disk"}
			}
			dd.Source.Slices = &libvirtxml.DomainDiskSlices{Slices: []libvirtxml.DomainDiskSlice{{
				Type: "storage", Offset: uint(disk.Source.Offset), Size: uint(disk.Source.Size)}}}
		}
		dd.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format}
		if disk.Boot {
			dd.Boot = &libvirtxml.DomainDeviceBoot{Order: boot}
			boot++
		}
		d.Devices.Disks = append(d.Devices.Disks, dd)
	}
	if haveSCSI {
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "scsi", Index: uintp(0), Model: "virtio-scsi",
			Address: slots.at(slots.scsi)})
	}
	return nil
}

func uintp(v uint) *uint { return &v }

// pciSlots are the slots of a VM's PCI devices on a pc machine's pci.0,
// given in the order libvirt itself gives them, so that a cold VM keeps
// the layout it always had: 9p shares, NICs, the virtio-scsi controller,
// the virtio-serial controller (the agent's channel), virtio disks, the
// balloon, the RNG, the watchdog (slot 1 is the PIIX3, 2 the VGA). They
// are explicit because a pool domain, launched before the pod's NICs and
// disks exist, must leave their slots free: the guest of a pooled VM then
// sees every device where a cold start puts it. Slot 0 means libvirt's
// choice.
type pciSlots struct {
	video, scsi, serial, balloon, rng, watchdog uint
	filesystems, nics                           []uint
	disks                                       map[int]uint // virtio disks, by index in the spec
}

// lastPCISlot is pci.0's last slot; libvirt puts what does not fit
// behind a PCI bridge.
const lastPCISlot = 31

// layoutPCI lays out a VM's PCI devices; none on machines other than pc
// (q35 gives each device a root port of libvirt's choice) or when they
// do not fit on pci.0.
func layoutPCI(s ports.VMSpec) pciSlots {
	if m := machineOrDefault(s.Machine); m != "pc" && !strings.HasPrefix(m, "pc-i440fx-") {
		return pciSlots{}
	}
	next := uint(3)
	take := func() uint {
		next++
		return next - 1
	}
	p := pciSlots{video: 2, disks: map[int]uint{}}
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
	return p
}

// at is a slot's address on pci.0 (nil for libvirt's choice).
func (p pciSlots) at(slot uint) *libvirtxml.DomainAddress {
	if slot == 0 {
		return nil
	}
	return &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: uintp(0), Bus: uintp(0), Slot: uintp(slot), Function: uintp(0)}}
}

func nth(slots []uint, i int) uint {
	if i < len(slots) {
		return slots[i]
	}
	return 0
}

// networkSource is a network disk (Ceph RBD) whose key the domain finds in
// the libvirt secret secretUUID.
func networkSource(disk ports.Disk, secretUUID string) (*libvirtxml.DomainDiskSourceNetwork, error) {
	src := disk.Source
	if src.Protocol != "rbd" {
		return nil, &ports.InvalidError{Field: "disk " + disk.Name + " protocol", Value: src.Protocol, Allowed: "rbd"}
	}
	if src.Name == "" || len(src.Hosts) == 0 {
		return nil, &ports.InvalidError{Field: "disk " + disk.Name + " source", Reason: "an RBD disk needs pool/image and monitor hosts"}
	}
	n := &libvirtxml.DomainDiskSourceNetwork{Protocol: src.Protocol, Name: src.Name}
	for _, h := range src.Hosts {
		n.Hosts = append(n.Hosts, libvirtxml.DomainDiskSourceHost{Name: h.Name, Port: h.Port})
	}
	if a := src.Auth; a != nil {
		if secretUUID == "" {
			return nil, fmt.Errorf("disk %s: no libvirt secret holds its key: %w", disk.Name, ports.ErrInvalidArgument)
		}
		n.Auth = &libvirtxml.DomainDiskAuth{Username: a.Username, Secret: &libvirtxml.DomainDiskSecret{Type: a.SecretType, UUID: secretUUID}}
	}
	return n, nil
}

// dacLabel confines the VM's QEMU with libvirt's DAC driver, which owns
// the VM's disks to it only while it runs: the VM's own user and group
// when it has them (one VM's QEMU then cannot open another's disks), else
// qemu.conf's one user (dynamic). Asked for by the domain itself, so that
// a host whose qemu.conf sets security_default_confined = 0 does not run
// it unconfined.
func dacLabel(runAs *ports.ProcessIdentity) libvirtxml.DomainSecLabel {
	if runAs == nil {
		return libvirtxml.DomainSecLabel{Type: "dynamic", Model: "dac", Relabel: "yes"}
	}
	return libvirtxml.DomainSecLabel{Type: "static", Model: "dac", Relabel: "yes", Label: fmt.Sprintf("+%d:+%d", runAs.UID, runAs.GID)}
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

// topVCPUs is the most vCPUs the VM can have.
func topVCPUs(s ports.VMSpec) int { return max(s.VCPUs, s.MaxVCPUs) }

// hotplugVCPUs lays out the vCPUs of a VM that can change them while it
// runs (MaxVCPUs set; nil for one that cannot): the first MinVCPUs fixed,
// the rest up to VCPUs present and hot-pluggable (so that they can be
// unplugged again), the rest up to MaxVCPUs absent and hot-pluggable.
func hotplugVCPUs(s ports.VMSpec) *libvirtxml.DomainVCPUs {
	if s.MaxVCPUs == 0 {
		return nil
	}
	top, fixed := topVCPUs(s), max(s.MinVCPUs, 1)
	v := &libvirtxml.DomainVCPUs{}
	for i := 0; i < top; i++ {
		id := uint(i)
		c := libvirtxml.DomainVCPUsVCPU{Id: &id, Enabled: "no", Hotpluggable: "yes"}
		if i < s.VCPUs {
			c.Enabled = "yes"
			order := uint(i + 1)
			c.Order = &order
		}
		if i < fixed {
			c.Hotpluggable = "no"
		}
		v.VCPU = append(v.VCPU, c)
	}
	return v
}

// cpuTune pins the vCPUs to the container's CPUs, one each in order when
// there are exactly as many (kubelet's static CPU manager gives a
// Guaranteed pod as many as it has whole CPUs), else each to all of them, and keeps QEMU's emulator
// threads on the host's other CPUs (unpinned when there are none).
func cpuTune(vcpus int, set, host []int) *libvirtxml.DomainCPUTune {
	if len(set) == 0 {
		return nil
	}
	t := &libvirtxml.DomainCPUTune{}
	all := cpuList(set)
	for i := 0; i < vcpus; i++ {
		pin := all
		if len(set) == vcpus {
			pin = strconv.Itoa(set[i])
		}
		t.VCPUPin = append(t.VCPUPin, libvirtxml.DomainCPUTuneVCPUPin{VCPU: uint(i), CPUSet: pin})
	}
	var others []int
	for _, c := range host {
		if !slices.Contains(set, c) {
			others = append(others, c)
		}
	}
	if len(others) > 0 {
		t.EmulatorPin = &libvirtxml.DomainCPUTuneEmulatorPin{CPUSet: cpuList(others)}
	}
	return t
}

func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// firmware picks UEFI by the features of the firmware descriptors the
// node's OVMF installs (/usr/share/qemu/firmware): libvirt chooses the
// image and makes the VM a variable store of its own from the descriptor's
// template (removed with the domain: Undefine passes UNDEFINE_NVRAM).
// Secure Boot asks for the image with Microsoft's keys enrolled and turns
// SMM on, which that image needs.
func firmware(d *libvirtxml.Domain, s ports.VMSpec) {
	if s.Firmware != ports.FirmwareUEFI {
		return
	}
	yesNo := map[bool]string{true: "yes", false: "no"}
	d.OS.Firmware = "efi"
	d.OS.FirmwareInfo = &libvirtxml.DomainOSFirmwareInfo{Features: []libvirtxml.DomainOSFirmwareFeature{
		{Name: "secure-boot", Enabled: yesNo[s.SecureBoot]},
		{Name: "enrolled-keys", Enabled: yesNo[s.SecureBoot]},
	}}
	if s.SecureBoot {
		d.Features.SMM = &libvirtxml.DomainFeatureSMM{State: "on"}
	}
}

// maxMemory is the most memory the VM can be resized to.
func maxMemory(s ports.VMSpec) int64 {
	if s.MaxMemoryBytes > s.MemoryBytes {
		return s.MaxMemoryBytes
	}
	return s.MemoryBytes
}

// hyperV gives the guest the Hyper-V enlightenments Windows uses under a
// hypervisor (the set KubeVirt and virt-install recommend for Windows)
// and the Hyper-V reference clock. QEMU offers them under KVM only: the
// adapter refuses them on a TCG node before this.
func hyperV(d *libvirtxml.Domain) {
	on := &libvirtxml.DomainFeatureState{State: "on"}
	d.Features.HyperV = &libvirtxml.DomainFeatureHyperV{
		Mode: "custom", Relaxed: on, VAPIC: on,
		Spinlocks: &libvirtxml.DomainFeatureHyperVSpinlocks{DomainFeatureState: *on, Retries: 8191},
		VPIndex:   on, Runtime: on, Synic: on,
		STimer: &libvirtxml.DomainFeatureHyperVSTimer{DomainFeatureState: *on},
		Reset:  on, Frequencies: on,
		TLBFlush: &libvirtxml.DomainFeatureHyperVTLBFlush{DomainFeatureState: *on},
		IPI:      on,
	}
	d.Clock.Timer = append(d.Clock.Timer, libvirtxml.DomainTimer{Name: "hypervclock", Present: "yes"})
}
