package libvirt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// poolSpecFor is what the core asks for a pod with these annotations: its
// VM runs as a user of its own, the pod asks for no UUID, the cloud-init
// medium is the last disk.
func poolSpecFor(t *testing.T, ann map[string]string, edit func(*ports.VMSpec)) ports.VMSpec {
	t.Helper()
	s := specFor(t, ann)
	if ann[annotations.SystemUUID] == "" {
		s.UUID = ""
	}
	s.RunAs = &ports.ProcessIdentity{UID: 2000000003, GID: 2000000003}
	s.Disks[0].Serial = "virtlet-root"
	ci := ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, Bus: s.Disks[0].Bus, ReadOnly: true, Serial: "virtlet-cidata",
		Source: ports.DiskSource{Type: ports.SourceFile, Path: "/var/lib/virtlet/plugins/nocloud/media/x.iso", Format: "raw"}}
	if ci.Bus == ports.BusVirtio {
		ci.Device = ports.DeviceDisk
	}
	s.Disks = append(s.Disks, ci)
	if edit != nil {
		edit(&s)
	}
	return s
}

// Which VMs the pool serves, and why the others start cold: one function
// decides.
func TestPoolable(t *testing.T) {
	with := func(kv ...string) map[string]string {
		m := map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		edit func(*ports.VMSpec)
		why  string // "" : poolable
	}{
		{"defaults", with(), nil, ""},
		{"virtio disks, two vCPUs", with(annotations.DiskDriver, "virtio", annotations.VCPUCount, "2"), nil, ""},
		{"pod network and volumes", with(), func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", Bridge: "vlb-x"}}
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusSCSI, Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop1", Format: "raw"}}, s.Disks[1])
		}, ""},
		{"host-model CPU", with(annotations.CPUModel, "host-model"), nil, ""},
		{"own UUID", with(annotations.SystemUUID, "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"), nil, "VirtletSystemUUID"},
		{"q35", with(annotations.MachineType, "q35"), nil, ""},
		{"versioned q35, virtio disks", with(annotations.MachineType, "pc-q35-7.2", annotations.DiskDriver, "virtio"), nil, ""},
		{"versioned pc", with(annotations.MachineType, "pc-i440fx-7.2"), nil, ""},
		{"another machine", with(), func(s *ports.VMSpec) { s.Machine = "microvm" }, "machine microvm"},
		{"uefi", with(annotations.Firmware, "uefi"), nil, "UEFI"},
		{"hyperv", with(annotations.HyperV, "true"), nil, "Hyper-V"},
		{"hugepages", with(), func(s *ports.VMSpec) { s.HugepageSizeBytes = 2 << 20 }, "hugepages"},
		{"no memory sharing", with(), func(s *ports.VMSpec) { s.NoMemorySharing = true }, "VirtletMemorySharing"},
		{"pinned", with(), func(s *ports.VMSpec) { s.CPUSet = []int{1} }, "pinned"},
		{"memory ceiling", with(), func(s *ports.VMSpec) { s.MaxMemoryBytes = 2 * s.MemoryBytes }, "VirtletMaxMemory"},
		{"vCPU hotplug", with(), func(s *ports.VMSpec) { s.MaxVCPUs = 4 }, "VirtletMaxVCPUCount"},
		{"CPU setting", with(annotations.LibvirtCPUSetting, "Model: {Value: qemu64}\n"), nil, "VirtletLibvirtCPUSetting"},
		{"clock", with(annotations.Clock, "+3600"), nil, "clock"},
		{"timers", with(annotations.ClockTimers, "hpet:no"), nil, "clock"},
		{"watchdog", with(annotations.Watchdog, "i6300esb"), nil, "watchdog"},
		{"9p share", with(), func(s *ports.VMSpec) { s.Filesystems = []ports.Filesystem{{Source: "/srv", Tag: "srv"}} }, "9p"},
		{"qemu.conf's user", with(), func(s *ports.VMSpec) { s.RunAs = nil }, "qemu.conf's user"},
		{"a shared group", with(), func(s *ports.VMSpec) { s.RunAs.GID = 108 }, "share a group"},
		{"SATA disk", with(), func(s *ports.VMSpec) { s.Disks[0].Bus = ports.BusSATA }, "sata bus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape, why := poolable(poolSpecFor(t, tc.ann, tc.edit), accelerator{DomainType: "qemu"}, 0)
			if tc.why == "" && (why != "" || shape.Key == "") {
				t.Fatalf("starts cold: %s", why)
			}
			if tc.why != "" && !strings.Contains(why, tc.why) {
				t.Fatalf("cold because %q, want %q", why, tc.why)
			}
		})
	}
}

// A shape holds what the guest sees and cannot be plugged in later, and
// nothing of one pod: two pods' VMs of the same size, image and layout
// share a shape; another size, image, root size, bus, disk count or NIC
// count is another.
func TestPoolShapes(t *testing.T) {
	keyWith := func(medium int64, edit func(*ports.VMSpec)) string {
		shape, why := poolable(poolSpecFor(t, nil, edit), accelerator{DomainType: "qemu"}, medium)
		if why != "" {
			t.Fatal(why)
		}
		return shape.Key
	}
	key := func(edit func(*ports.VMSpec)) string { return keyWith(0, edit) }
	base := key(nil)
	same := key(func(s *ports.VMSpec) {
		s.ID, s.Name, s.PodName, s.PodUID = "feed", "virtlet-feed-other", "other", "uid-2"
		s.Disks[1].Source.Path = "/y.iso"
		s.ConsoleLogPath, s.RunAs = "/var/log/pods/x/0.log", &ports.ProcessIdentity{UID: 2000000009, GID: 2000000009}
	})
	if same != base {
		t.Errorf("another pod of the same shape: key %s, want %s", same, base)
	}
	if named := key(func(s *ports.VMSpec) { s.Machine = "pc" }); named != base {
		t.Errorf("the default machine named: key %s, want %s", named, base)
	}
	for name, edit := range map[string]func(*ports.VMSpec){
		"memory": func(s *ports.VMSpec) { s.MemoryBytes *= 2 },
		"vCPUs":  func(s *ports.VMSpec) { s.VCPUs = 2 },
		"disk bus": func(s *ports.VMSpec) {
			s.Disks[0].Bus, s.Disks[1].Bus, s.Disks[1].Device = ports.BusVirtio, ports.BusVirtio, ports.DeviceDisk
		},
		"a volume": func(s *ports.VMSpec) { s.Disks = append(s.Disks, ports.Disk{Bus: ports.BusSCSI}) },
		"machine":  func(s *ports.VMSpec) { s.Machine = "q35" },
		"a NIC":    func(s *ports.VMSpec) { s.NICs = []ports.NIC{{MAC: "0a:58:c6:12:05:02", Bridge: "vlb-x"}} },
	} {
		if key(edit) == base {
			t.Errorf("%s: the same shape", name)
		}
	}
	// The medium's placeholder has the medium's size: media of one size
	// share a shape, of another size or none (too large) they do not.
	virtio := func(s *ports.VMSpec) {
		s.Disks[0].Bus, s.Disks[1].Bus, s.Disks[1].Device = ports.BusVirtio, ports.BusVirtio, ports.DeviceDisk
	}
	for _, edit := range []func(*ports.VMSpec){nil, virtio} {
		mib := keyWith(1<<20, edit)
		if keyWith(1<<20, func(s *ports.VMSpec) {
			if edit != nil {
				edit(s)
			}
			s.Disks[1].Source.Path = "/other.iso"
		}) != mib {
			t.Error("two media of one size: two shapes")
		}
		if keyWith(2<<20, edit) == mib || keyWith(0, edit) == mib {
			t.Error("media of another size, or none: the same shape")
		}
	}
}

// Which disk a pool domain holds a placeholder of: the cloud-init medium,
// a read-only raw file on virtio-blk or a SCSI CD-ROM, nothing else.
func TestInPlaceMedium(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		edit func(*ports.VMSpec)
		want int
	}{
		{"SCSI CD-ROM", nil, nil, 1},
		{"virtio disk", map[string]string{annotations.DiskDriver: "virtio"}, nil, 1},
		{"after a volume", nil, func(s *ports.VMSpec) {
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusSCSI, ReadOnly: true,
				Source: ports.DiskSource{Type: ports.SourceFile, Path: "/x/vol-a.img", Format: "raw"}}, s.Disks[1])
		}, 2},
		{"a read-only volume", nil, func(s *ports.VMSpec) { s.Disks[1].Name = "vol-a" }, -1},
		{"written by the guest", nil, func(s *ports.VMSpec) { s.Disks[1].ReadOnly = false }, -1},
		{"qcow2", nil, func(s *ports.VMSpec) { s.Disks[1].Source.Format = "qcow2" }, -1},
		{"a block device", nil, func(s *ports.VMSpec) { s.Disks[1].Source.Type = ports.SourceBlock }, -1},
		{"a slice", nil, func(s *ports.VMSpec) { s.Disks[1].Source.Size = 4096 }, -1},
		{"a SCSI disk", nil, func(s *ports.VMSpec) { s.Disks[1].Device = ports.DeviceDisk }, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inPlaceMedium(poolSpecFor(t, tc.ann, tc.edit)); got != tc.want {
				t.Errorf("inPlaceMedium = %d, want %d", got, tc.want)
			}
		})
	}
}

// The pool domain of a shape, once a VM plugged its disks, medium and NICs
// into it, is the domain a cold start of that VM defines: every device at
// the same address, nothing else different. The guest cannot tell.
func TestPoolDomainPlusTheVMsDevicesIsTheColdDomain(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		edit func(*ports.VMSpec)
	}{
		{"defaults", nil, nil},
		{"virtio", map[string]string{annotations.DiskDriver: "virtio", annotations.VCPUCount: "2"}, nil},
		{"pod network and volumes", nil, func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", MTU: 1500, Bridge: "vlb-x"}, {Name: "net1", MAC: "0a:58:c6:13:00:07", Bridge: "vlb1x"}}
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusSCSI, Serial: "vol-a",
				Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop1", Format: "raw"}}, s.Disks[1])
		}},
		{"virtio network and volumes", map[string]string{annotations.DiskDriver: "virtio"}, func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", Bridge: "vlb-x"}}
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusVirtio, Serial: "vol-a",
				Source: ports.DiskSource{Type: ports.SourceFile, Path: "/x/vol-a.qcow2", Format: "qcow2"}}, s.Disks[1])
		}},
		{"q35", map[string]string{annotations.MachineType: "q35"}, nil},
		{"q35, pod network and volumes", map[string]string{annotations.MachineType: "q35"}, func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", MTU: 1500, Bridge: "vlb-x"}}
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusSCSI, Serial: "vol-a",
				Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop1", Format: "raw"}}, s.Disks[1])
		}},
		{"q35, virtio network and volumes", map[string]string{annotations.MachineType: "pc-q35-7.2", annotations.DiskDriver: "virtio"}, func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", Bridge: "vlb-x"}, {Name: "net1", MAC: "0a:58:c6:13:00:07", Bridge: "vlb1x"}}
			s.Disks = append(s.Disks[:1], ports.Disk{Name: "vol-a", Bus: ports.BusVirtio, Serial: "vol-a",
				Source: ports.DiskSource{Type: ports.SourceFile, Path: "/x/vol-a.qcow2", Format: "qcow2"}}, s.Disks[1])
		}},
	} {
		for _, medium := range []int64{0, 1 << 20} {
			name := tc.name
			if medium > 0 {
				name += ", medium placeholder"
			}
			t.Run(name, func(t *testing.T) { poolDomainPlusTheVMsDevices(t, tc.ann, tc.edit, medium) })
		}
	}
}

// poolDomainPlusTheVMsDevices checks one VM: its medium has medium bytes
// (0: the shape holds no placeholder).
func poolDomainPlusTheVMsDevices(t *testing.T, ann map[string]string, edit func(*ports.VMSpec), medium int64) {
	spec := poolSpecFor(t, map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}, nil)
	if ann != nil {
		ann[annotations.TargetRuntime] = annotations.TargetRuntimeValue
		spec = poolSpecFor(t, ann, nil)
	}
	if edit != nil {
		edit(&spec)
	}
	shape, why := poolable(spec, accelerator{DomainType: "qemu"}, medium)
	if why != "" {
		t.Fatal(why)
	}
	// The pool domain's identity, given to both.
	id := func(s ports.VMSpec) ports.VMSpec {
		s.Name, s.UUID, s.RunAs = "virtlet-pool-0123abcd-5e6f7a8b", "5e6f7a8b-1111-4222-8333-944445555666", &ports.ProcessIdentity{UID: 2000065536, GID: 2000065536}
		return s
	}
	console := "/var/lib/virtlet/plugins/libvirt/pool/virtlet-pool-0123abcd-5e6f7a8b.console"
	paths := map[string]string{"root": "/var/lib/virtlet/plugins/libvirt/pool/virtlet-pool-0123abcd-5e6f7a8b-root.qcow2"}
	if shape.Medium != nil {
		// The claimed VM's medium is in the placeholder.
		paths[shape.Medium.Disk] = "/var/lib/virtlet/plugins/libvirt/pool/virtlet-pool-0123abcd-5e6f7a8b-medium.img"
	} else if medium > 0 {
		t.Fatal("a medium of 1 MiB, and the shape holds no placeholder of it")
	}
	cold, err := buildDomain(domainInput{Spec: id(spec), accelerator: accelerator{DomainType: "qemu"}, ConsoleLog: console, DiskPaths: paths})
	if err != nil {
		t.Fatal(err)
	}
	pooled, err := buildDomain(domainInput{Spec: id(shape.Spec), accelerator: accelerator{DomainType: "qemu"}, ConsoleLog: console, DiskPaths: paths,
		Pool: &poolMetadata{Owner: "0123abcd", Shape: shape.Key}})
	if err != nil {
		t.Fatal(err)
	}
	// The pool domain has the root disk, and the medium's placeholder or
	// a SCSI CD-ROM's empty tray; a claim writes the medium into the
	// placeholder (the same file both ways here) or puts it into the tray,
	// plugs the VM's other disks and its NICs in, and sets its metadata.
	if len(pooled.Devices.Disks) == 0 || pooled.Devices.Disks[0].Boot == nil || pooled.Devices.Interfaces != nil {
		t.Fatalf("the pool domain's disks %+v, NICs %+v", pooled.Devices.Disks, pooled.Devices.Interfaces)
	}
	launched := map[string]libvirtxml.DomainDisk{}
	for _, d := range pooled.Devices.Disks {
		launched[d.Target.Dev] = d
	}
	var claimed []libvirtxml.DomainDisk
	for _, c := range cold.Devices.Disks {
		d, ok := launched[c.Target.Dev]
		switch {
		case !ok:
			d = c // plugged in
		case d.Device == "cdrom" && d.Source == nil:
			d.Source = c.Source // the medium in the tray
		}
		claimed = append(claimed, d)
	}
	if len(claimed) != len(pooled.Devices.Disks)+len(spec.Disks)-len(launched) {
		t.Fatalf("the pool domain has disks the VM lacks: %+v", pooled.Devices.Disks)
	}
	if medium > 0 && len(launched) != 2 {
		t.Fatalf("the pool domain's disks %+v: want its root and the medium's placeholder", pooled.Devices.Disks)
	}
	pooled.Devices.Disks = claimed
	pooled.Devices.Interfaces = cold.Devices.Interfaces
	pooled.Metadata = cold.Metadata
	want, _ := cold.Marshal()
	got, _ := pooled.Marshal()
	if got != want {
		t.Fatalf("the claimed pool domain differs from the cold one:\n%s\nwant\n%s", got, want)
	}
	for _, d := range cold.Devices.Disks {
		if d.Address == nil {
			t.Errorf("disk %s has no explicit address", d.Target.Dev)
		}
	}
	for _, n := range cold.Devices.Interfaces {
		if n.Address == nil {
			t.Errorf("NIC %s has no explicit address", n.MAC.Address)
		}
	}
}

// The pool domain of the default shape (golden).
func TestPoolDomainGolden(t *testing.T) {
	spec := poolSpecFor(t, map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}, func(s *ports.VMSpec) {
		s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02", MTU: 1500, Bridge: "vlb-x"}}
	})
	shape, why := poolable(spec, accelerator{DomainType: "qemu"}, 1<<20)
	if why != "" {
		t.Fatal(why)
	}
	s := shape.Spec
	s.Name, s.UUID, s.RunAs = "virtlet-pool-0123abcd-5e6f7a8b", "5e6f7a8b-1111-4222-8333-944445555666", &ports.ProcessIdentity{UID: 2000065536, GID: 2000065536}
	dir := "/var/lib/virtlet/plugins/libvirt/pool/"
	got, err := domainXML(domainInput{Spec: s, accelerator: accelerator{DomainType: "qemu"}, ConsoleLog: dir + s.Name + ".console",
		DiskPaths: map[string]string{"root": dir + s.Name + "-root.qcow2", "cloud-init": dir + s.Name + "-medium.img"}, Pool: &poolMetadata{Owner: "0123abcd", Shape: shape.Key}})
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "pool-domain", got)
}

// Define is idempotent for the spec the VM was defined from, whatever
// identity the plugin gave the VM; not while a claim is in progress.
func TestDefinedFrom(t *testing.T) {
	spec := poolSpecFor(t, map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}, nil)
	pooled := spec
	pooled.Name, pooled.UUID, pooled.RunAs = "virtlet-pool-0123abcd-5e6f7a8b", "5e6f7a8b-1111-4222-8333-944445555666", &ports.ProcessIdentity{UID: 2000065536, GID: 2000065536}
	r := &record{Spec: pooled, Asked: &vmIdentity{Name: spec.Name, RunAs: spec.RunAs}, Claim: claimed}
	other := spec
	other.VCPUs++
	renamed := spec
	renamed.Name = "virtlet-0123456789ab-other"
	for _, tc := range []struct {
		name  string
		r     *record
		spec  ports.VMSpec
		equal bool
	}{
		{"cold, same spec", &record{Spec: spec}, spec, true},
		{"cold, another spec", &record{Spec: spec}, other, false},
		{"claimed, same spec", r, spec, true},
		{"claimed, another spec", r, other, false},
		{"claimed, another name asked", r, renamed, false},
		{"claim in progress", &record{Spec: pooled, Asked: r.Asked, Claim: claiming}, spec, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.definedFrom(tc.spec); got != tc.equal {
				t.Fatalf("definedFrom = %v, want %v", got, tc.equal)
			}
		})
	}
}

// A shape's name changes with the translation cache a pool domain is
// launched with, and only then: the config's size and the per-VM default
// name the same shape when they give the same cache; a pool domain saved
// before the cache was sized per VM (QEMU's default, uncapped) is not
// claimed by a shape named today.
func TestShapeKeyFollowsTheTranslationCache(t *testing.T) {
	spec := ports.VMSpec{VCPUs: 1, MemoryBytes: 128 << 20}
	old, _ := json.Marshal(struct {
		Type string
		Spec ports.VMSpec
	}{"qemu", spec})
	sum := sha256.Sum256(old)
	if got := shapeKey(accelerator{DomainType: "qemu"}, spec, nil); got == hex.EncodeToString(sum[:])[:12] {
		t.Errorf("the per-VM cache's key %s is the one of an uncapped pool domain", got)
	}
	if a, b := shapeKey(accelerator{DomainType: "qemu"}, spec, nil), shapeKey(accelerator{DomainType: "qemu", TBCacheMiB: 16}, spec, nil); a != b {
		t.Errorf("a 128 MiB VM's per-VM cache (16 MiB) and a configured 16 MiB name two shapes: %s, %s", a, b)
	}
	keys := map[string]bool{}
	for _, a := range []accelerator{{DomainType: "qemu"}, {DomainType: "qemu", TBCacheMiB: 32}, {DomainType: "qemu", TBCacheMiB: 1024}, {DomainType: "kvm"}, {DomainType: "kvm", TBCacheMiB: 32}} {
		keys[shapeKey(a, spec, nil)] = true
	}
	if len(keys) != 4 {
		t.Errorf("%d keys for 4 translation caches (KVM has none, whatever the config)", len(keys))
	}
}

// A claim writes the medium into its placeholder, and only a medium of
// the placeholder's size into a regular file: never through a symlink.
func TestWriteMedium(t *testing.T) {
	dir := t.TempDir()
	medium, placeholder := filepath.Join(dir, "x.iso"), filepath.Join(dir, "p-medium.img")
	data := bytes.Repeat([]byte("cidata"), 1000)
	if err := os.WriteFile(medium, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := makePlaceholder(placeholder, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := writeMedium(medium, placeholder, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(placeholder); !bytes.Equal(got, data) {
		t.Fatalf("the placeholder holds %d bytes unlike the medium's %d", len(got), len(data))
	}
	if err := writeMedium(medium, placeholder, int64(len(data))+1); err == nil {
		t.Error("a medium of another size than the placeholder's was written")
	}
	link := filepath.Join(dir, "link.img")
	if err := os.Symlink(placeholder, link); err != nil {
		t.Fatal(err)
	}
	if err := writeMedium(medium, link, int64(len(data))); err == nil {
		t.Error("written through a symlink")
	}
}
