package libvirt

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

func TestPlanCheckpoint(t *testing.T) {
	root := ports.Disk{Name: "root", Boot: true, Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"}, Overlay: &ports.DiskOverlay{BasePath: "/images/tiny"}}
	ci := ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, ReadOnly: true, Source: ports.DiskSource{Type: ports.SourceFile, Path: "/vms/ci.iso", Format: "raw"}}
	vol := ports.Disk{Name: "vol-data", Source: ports.DiskSource{Type: ports.SourceFile, Path: "/vols/data.qcow2", Format: "qcow2"}}
	live := &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{Disks: []libvirtxml.DomainDisk{
		{Target: &libvirtxml.DomainDiskTarget{Dev: "vda"}}, {Target: &libvirtxml.DomainDiskTarget{Dev: "sda"}}, {Target: &libvirtxml.DomainDiskTarget{Dev: "vdb"}}}}}
	for _, tc := range []struct {
		name   string
		spec   ports.VMSpec
		live   *libvirtxml.Domain
		copies []string
		want   string // error
	}{
		{name: "root overlay and a qcow2 volume copied, cloud-init skipped", spec: ports.VMSpec{Disks: []ports.Disk{root, ci, vol}}, live: live,
			copies: []string{"root:/vms/root.qcow2:qcow2:/images/tiny", "vol-data:/vols/data.qcow2:qcow2:"}},
		{name: "9p share", spec: ports.VMSpec{Disks: []ports.Disk{root}, Filesystems: []ports.Filesystem{{Source: "/srv/share", Tag: "data"}}}, live: live,
			want: `shares the host directory /srv/share with its guest (9p, tag "data")`},
		{name: "host block device", spec: ports.VMSpec{Disks: []ports.Disk{root, {Name: "vol-dev", Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/sdz"}}}}, live: live,
			want: "disk vol-dev is the host block device /dev/sdz"},
		{name: "ceph", spec: ports.VMSpec{Disks: []ports.Disk{{Name: "root", Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: "pool/img"}}}}, live: live,
			want: "disk root is the network disk rbd pool/img"},
		{name: "persistent root slice", spec: ports.VMSpec{Disks: []ports.Disk{{Name: "root", Source: ports.DiskSource{Type: ports.SourceFile, Path: "/vols/pv", Offset: 4096}}}}, live: live,
			want: "disk root is a slice of /vols/pv"},
		{name: "UEFI", spec: ports.VMSpec{Disks: []ports.Disk{root}, Firmware: ports.FirmwareUEFI}, live: live, want: "its UEFI variable store is not part of a checkpoint"},
		{name: "host device", spec: ports.VMSpec{Disks: []ports.Disk{root}}, live: &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{Hostdevs: []libvirtxml.DomainHostdev{{}}}},
			want: "has a host device passed through"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &record{Spec: tc.spec, DiskPaths: map[string]string{}}
			for _, d := range tc.spec.Disks {
				if d.Overlay != nil {
					r.DiskPaths[d.Name] = "/vms/" + d.Name + ".qcow2"
				}
			}
			r.Spec.Name = "vm"
			p, err := planCheckpoint(r, tc.live)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range p.copies {
				got = append(got, c.name+":"+c.source+":"+c.format+":"+c.backing)
			}
			if strings.Join(got, " ") != strings.Join(tc.copies, " ") || len(p.skipped) != 1 || p.skipped[0].Name != "cloud-init" || len(p.targets) != 3 {
				t.Fatalf("plan %+v", p)
			}
			x, err := memorySnapshotXML("/cp/checkpoint/memory.save", p.targets)
			if err != nil || !strings.Contains(x, `<memory snapshot="external" file="/cp/checkpoint/memory.save">`) || strings.Count(x, `snapshot="no"`) != 3 {
				t.Fatalf("snapshot XML %s %v", x, err)
			}
		})
	}
}

// libvirtd (root) reads a restored state's header: only a raw save image
// of libvirt's own version, with a bounded XML, gets that far.
func TestCheckSaveHeader(t *testing.T) {
	header := func(magic string, version, xmlLen, format uint32) []byte {
		h := make([]byte, saveHeaderLen+16)
		copy(h, magic)
		binary.LittleEndian.PutUint32(h[16:], version)
		binary.LittleEndian.PutUint32(h[20:], xmlLen)
		binary.LittleEndian.PutUint32(h[28:], format)
		return h
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"a raw save image", header("LibvirtQemudSave", 2, 66891, 0), ""},
		{"compressed", header("LibvirtQemudSave", 2, 66891, 3), "compressed (format 3)"},
		{"partial", header("LibvirtQemudPart", 2, 66891, 0), "not a complete libvirt save image"},
		{"another version", header("LibvirtQemudSave", 3, 66891, 0), "version 3"},
		{"a huge XML", header("LibvirtQemudSave", 2, 1<<31, 0), "a domain XML of 2147483648 bytes"},
		{"short", []byte("LibvirtQemudSave"), "its header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "memory.save")
			os.WriteFile(p, tc.data, 0o600)
			err := checkSaveHeader(p)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
