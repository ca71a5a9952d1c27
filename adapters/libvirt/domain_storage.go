package libvirt

import (
	"cmp"
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setStorage sets the VM's disks and 9p shares.
func setStorage(d *libvirtxml.Domain, in domainInput, slots pciSlots) error {
	if err := addDisks(d, in, slots); err != nil {
		return err
	}
	for i, fs := range in.Spec.Filesystems {
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
	return nil
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
		if in.Pool != nil && disk.Overlay == nil && in.DiskPaths[disk.Name] == "" {
			// The pool domain has its root disk (an overlay of the
			// shape's image) and its medium's placeholder (a file of
			// DiskPaths); a VM claiming it plugs its other disks in and
			// its medium into the CD-ROM's tray.
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
			if p, ok := in.DiskPaths[disk.Name]; ok || disk.Overlay != nil {
				path = p
			}
			if disk.Overlay != nil {
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
