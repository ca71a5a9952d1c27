package libvirt

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
	"libvirt.org/go/libvirtxml"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// specFor builds the VM spec the core builds for a pod with these
// annotations, so the golden files follow annotations end to end.
func specFor(t *testing.T, ann map[string]string) ports.VMSpec {
	t.Helper()
	opts, err := annotations.Parse(ann)
	if err != nil {
		t.Fatal(err)
	}
	uuid := opts.SystemUUID
	if uuid == "" {
		uuid = "6ea51c38-5b5d-5c41-a1a8-0b3d0b4b7c8e"
	}
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	return ports.VMSpec{
		ID: id, Name: "virtlet-0123456789ab-cirros-vm", UUID: uuid,
		SandboxID: "fedcba9876543210", PodName: "cirros-vm", PodNamespace: "default", PodUID: "uid-1",
		VCPUs: opts.VCPUCount, MaxVCPUs: opts.MaxVCPUCount, MinVCPUs: opts.VCPUCount, MemoryBytes: 160 << 20,
		CPU: ports.CPUSpec{Model: opts.CPUModel, Setting: opts.CPUSetting}, Machine: opts.MachineType, Firmware: opts.Firmware, SecureBoot: opts.SecureBoot, HyperV: opts.HyperV, Clock: opts.Clock, Watchdog: opts.Watchdog, NoMemorySharing: opts.NoMemorySharing,
		Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: opts.DiskDriver, Boot: true,
			Source:  ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"},
			Overlay: &ports.DiskOverlay{BasePath: "/var/lib/virtlet/images/sha256/ab", BaseFormat: "qcow2", SizeBytes: opts.RootVolumeSize}}},
		ConsoleLogPath: "/var/log/pods/default_cirros-vm_uid-1/cirros-vm/0.log",
	}
}

// libvirt9_1Cases are golden cases for libvirt 9.1 and later, whose schema
// this node's libvirt may not have.
var libvirt9_1Cases = map[string]bool{"watchdog-itco": true}

// domainCase is a VM the golden tests render: a pod's annotations, and
// what the core adds to its spec.
type domainCase struct {
	name string
	ann  map[string]string
	edit func(*ports.VMSpec)
	tcg  bool
}

// domainCases are the golden tests' VMs, each testdata/<name>.xml.
func domainCases() []domainCase {
	target := map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range target {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	return []domainCase{
		{"defaults", with(), nil, true},
		// The VM's own user and group (the daemon's vmUsers).
		{"own-user", with(), func(s *ports.VMSpec) { s.RunAs = &ports.ProcessIdentity{UID: 100000007, GID: 109} }, true},
		{"seed-001", with(annotations.VCPUCount, "1", annotations.DiskDriver, "virtio", annotations.RootVolumeSize, "1Gi",
			annotations.SSHKeys, "ssh-rsa AAAA me@localhost"), nil, true},
		{"two-vcpus-scsi", with(annotations.VCPUCount, "2"), nil, true},
		{"q35", with(annotations.MachineType, "q35"), nil, true},
		{"clock-offset-timers", with(annotations.Clock, "-1800", annotations.ClockTimers, "rtc:catchup,pit:delay,hpet:no"), nil, true},
		{"clock-timezone", with(annotations.Clock, "Asia/Kolkata"), nil, true},
		{"watchdog", with(annotations.Watchdog, "i6300esb", annotations.WatchdogAction, "poweroff"), nil, true},
		// For libvirt 9.1 and later (libvirt9_1Cases); 9.0 refuses itco.
		{"watchdog-itco", with(annotations.MachineType, "q35", annotations.Watchdog, "itco", annotations.WatchdogAction, "poweroff"), nil, true},
		{"cpu-topology", with(annotations.VCPUCount, "4", annotations.CPUTopology, "sockets=1,cores=2,threads=2"), nil, true},
		{"pinned", with(annotations.VCPUCount, "2"), func(s *ports.VMSpec) { s.CPUSet = []int{2, 3} }, true},
		// Booted with 3 of 4 vCPUs (its CPU limit), the first 2 fixed.
		{"vcpu-hotplug", with(annotations.VCPUCount, "2", annotations.MaxVCPUCount, "4"), func(s *ports.VMSpec) { s.VCPUs = 3 }, true},
		{"vcpu-hotplug-topology", with(annotations.MaxVCPUCount, "4", annotations.CPUTopology, "sockets=2,cores=2"), nil, true},
		{"hugepages-2m", with(), func(s *ports.VMSpec) { s.HugepageSizeBytes = 2 << 20 }, true},
		{"max-memory", with(), func(s *ports.VMSpec) { s.MaxMemoryBytes = 512 << 20 }, true},
		{"hyperv", with(annotations.HyperV, "true"), nil, true},
		{"no-memory-sharing", with(annotations.MemorySharing, "false"), nil, true},
		// A CPU request and a 0.5 CPU limit, for the whole VM.
		{"cpu-limits", with(), func(s *ports.VMSpec) { s.CPULimits = ports.CPULimits{Shares: 512, Period: 100_000, Quota: 50_000} }, true},
		{"uefi", with(annotations.Firmware, "uefi"), nil, true},
		{"uefi-secure-boot", with(annotations.Firmware, "uefi", annotations.SecureBoot, "true", annotations.MachineType, "q35"), nil, true},
		{"pinned-to-all-host-cpus", with(annotations.VCPUCount, "2"), func(s *ports.VMSpec) { s.CPUSet = []int{0, 1, 2, 3} }, true},
		{"host-model", with(annotations.CPUModel, "host-model"), nil, false},
		{"libvirt-cpu-setting", with(annotations.LibvirtCPUSetting, "Match: exact\nModel:\n  Fallback: allow\n  Value: core2duo\n"), nil, true},
		{"cpu-setting-topology-numa", with(annotations.VCPUCount, "2", annotations.LibvirtCPUSetting,
			"Mode: custom\nModel: {Value: qemu64}\nTopology: {Sockets: 1, Cores: 2, Threads: 1}\nFeatures: [{Policy: disable, Name: vmx}]\nNuma:\n  Cells:\n  - {ID: 0, CPUs: \"0-1\", Memory: 163840, Unit: KiB}\n"), nil, true},
		{"system-uuid", with(annotations.SystemUUID, "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"), nil, true},
		{"extra-disks-and-share", with(annotations.DiskDriver, "virtio"), func(s *ports.VMSpec) {
			s.Disks = append(s.Disks,
				ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, Bus: ports.BusSCSI, ReadOnly: true, Source: ports.DiskSource{Type: ports.SourceFile, Path: "/run/ci.iso", Format: "raw"}},
				ports.Disk{Name: "vol-data", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop7", Format: "raw"}})
			s.Filesystems = []ports.Filesystem{{Source: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/data", Tag: "data", AccessMode: "squash"}}
		}, true},
		// the volumes of Virtlet's ubuntu-vm example: a qcow2 flexvolume, a raw device, a Ceph RBD
		// image (its key in a libvirt secret the domain names), 9p shares
		// read-write and read-only; every disk with its serial.
		{"volumes", with(), func(s *ports.VMSpec) {
			s.Disks[0].Serial = "virtlet-root"
			s.Disks = append(s.Disks,
				ports.Disk{Name: "vol-extra", Device: ports.DeviceDisk, Bus: ports.BusSCSI, Serial: "vol-extra",
					Source: ports.DiskSource{Type: ports.SourceFile, Path: "/var/lib/virtlet/plugins/qcow2/disks/x-extra.qcow2", Format: "qcow2"}},
				ports.Disk{Name: "vol-raw", Device: ports.DeviceDisk, Bus: ports.BusSCSI, Serial: "vol-raw", ReadOnly: true,
					Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/mapper/somevg", Format: "raw"}},
				ports.Disk{Name: "vol-ceph", Device: ports.DeviceDisk, Bus: ports.BusSCSI, Serial: "vol-ceph",
					Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: "libvirt-pool/rbd-test-image", Format: "raw",
						Hosts: []ports.NetworkHost{{Name: "10.0.0.1", Port: "6789"}},
						Auth:  &ports.DiskAuth{Username: "libvirt", SecretType: "ceph", Secret: []byte("never in the XML")}}},
				ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, Bus: ports.BusSCSI, ReadOnly: true, Serial: "virtlet-cidata",
					Source: ports.DiskSource{Type: ports.SourceFile, Path: "/run/ci.iso", Format: "raw"}})
			s.Filesystems = []ports.Filesystem{
				{Source: "/var/lib/virtlet/plugins/ninep/shares/x/data", Tag: "data", AccessMode: "squash"},
				{Source: "/var/lib/virtlet/plugins/ninep/shares/x/config", Tag: "config", AccessMode: "squash", ReadOnly: true}}
		}, true},
		// A persistent root: the block device behind its 1 MiB header.
		{"persistent-root", with(annotations.DiskDriver, "virtio"), func(s *ports.VMSpec) {
			s.Disks[0] = ports.Disk{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true, Serial: "virtlet-root",
				Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop3", Format: "raw", Offset: 1 << 20, Size: 4<<30 - 1<<20}}
		}, true},
		// A persistent root on Ceph RBD: the RBD image behind its 1 MiB
		// header, a slice of a network source, its key in a secret.
		{"persistent-root-rbd", with(annotations.DiskDriver, "virtio"), func(s *ports.VMSpec) {
			s.Disks[0] = ports.Disk{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true, Serial: "virtlet-root",
				Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: "libvirt-pool/vm-root", Format: "raw",
					Offset: 1 << 20, Size: 4<<30 - 1<<20, Hosts: []ports.NetworkHost{{Name: "10.0.0.1", Port: "6789"}},
					Auth: &ports.DiskAuth{Username: "libvirt", SecretType: "ceph", Secret: []byte("never in the XML")}}}
		}, true},
		{"pod-network", with(), func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{
				{Name: "eth0", MAC: "0A:58:C6:12:05:02", MTU: 1500, Bridge: "vlb-fedcba98765"},
				{Name: "net1", MAC: "0a:58:c6:13:00:07", Bridge: "vlb1fedcba98765"},
			}
		}, true},
	}
}

// input is the domain input of a golden case.
func (tc domainCase) input(t *testing.T) domainInput {
	spec := specFor(t, tc.ann)
	if tc.edit != nil {
		tc.edit(&spec)
	}
	dt := "kvm"
	if tc.tcg {
		dt = "qemu"
	}
	return domainInput{Spec: spec, accelerator: accelerator{DomainType: dt},
		DiskPaths: map[string]string{"root": "/var/lib/virtlet/vms/" + spec.ID + "-root.qcow2"}, ConsoleLog: "/var/lib/virtlet/vms/" + spec.ID + ".console",
		Secrets: map[string]string{"vol-ceph": "1c0a2b3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d", "root": "2d1b3c4e-5f60-5b7c-9d8e-0f1a2b3c4d5e"}, HostCPUs: []int{0, 1, 2, 3}}
}

func TestDomainGolden(t *testing.T) {
	for _, tc := range domainCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := domainXML(tc.input(t))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(got, "never in the XML") {
				t.Fatal("a disk's key is in the domain XML")
			}
			checkGolden(t, tc.name, got)
		})
	}
}

// checkGolden compares a domain's XML with testdata/<name>.xml (rewritten
// with -update) and has libvirt's schema validate it.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	golden := filepath.Join("testdata", name+".xml")
	if *update {
		os.WriteFile(golden, []byte(got+"\n"), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if strings.TrimSpace(string(want)) != strings.TrimSpace(got) {
		t.Fatalf("domain XML differs from %s (run with -update and review the diff):\n%s", golden, got)
	}
	if validate, _ := exec.LookPath("virt-xml-validate"); validate != "" && !libvirt9_1Cases[name] {
		if out, err := exec.Command(validate, golden, "domain").CombinedOutput(); err != nil {
			t.Fatalf("libvirt's schema refuses %s: %v\n%s", golden, err, out)
		}
	}
}

func TestDomainRefusals(t *testing.T) {
	spec := specFor(t, nil)
	for _, tc := range []struct {
		name string
		edit func(*ports.VMSpec)
		want string
	}{
		{"foreign name", func(s *ports.VMSpec) { s.Name = "my-vm" }, "a name starting with virtlet-"},
		{"network disk of another protocol", func(s *ports.VMSpec) {
			s.Disks[0] = ports.Disk{Name: "ceph", Bus: ports.BusSCSI, Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "nbd"}}
		}, "disk ceph protocol"},
		{"RBD disk without monitors", func(s *ports.VMSpec) {
			s.Disks[0] = ports.Disk{Name: "ceph", Bus: ports.BusSCSI, Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: "p/i", Format: "raw"}}
		}, "monitor hosts"},
		{"RBD disk whose key has no secret", func(s *ports.VMSpec) {
			s.Disks[0] = ports.Disk{Name: "ceph", Bus: ports.BusSCSI, Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: "p/i", Format: "raw",
				Hosts: []ports.NetworkHost{{Name: "h", Port: "6789"}}, Auth: &ports.DiskAuth{Username: "u", SecretType: "ceph", Secret: []byte("k")}}}
		}, "no libvirt secret"},
		{"slice of a qcow2 disk", func(s *ports.VMSpec) {
			s.Disks[0].Source.Offset, s.Disks[0].Source.Size = 512, 1024
		}, "slice"},
		{"unknown source type", func(s *ports.VMSpec) { s.Disks[0].Source.Type = "nvme" }, "file, block or network"},
		{"bad bus", func(s *ports.VMSpec) { s.Disks[0].Bus = "floppy" }, "scsi, virtio, ide or sata"},
		{"bad format", func(s *ports.VMSpec) {
			s.Disks[0].Overlay = nil
			s.Disks[0].Source.Path = "/x"
			s.Disks[0].Source.Format = "vmdk"
		}, "qcow2 or raw"},
		{"nic without bridge", func(s *ports.VMSpec) { s.NICs = []ports.NIC{{Name: "eth0", MAC: "0a:58:c6:12:05:02"}} }, "NIC 0 (eth0) bridge"},
		{"nic with multicast MAC", func(s *ports.VMSpec) {
			s.NICs = []ports.NIC{{Name: "eth0", MAC: "01:00:5e:00:00:01", Bridge: "vlb-x"}}
		}, "NIC 0 (eth0) MAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.Disks = append([]ports.Disk(nil), spec.Disks...)
			tc.edit(&s)
			_, err := domainXML(domainInput{Spec: s, accelerator: accelerator{DomainType: "qemu"}, DiskPaths: map[string]string{"root": "/x.qcow2"}, ConsoleLog: "/c"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// A TCG domain's translation cache is the plugin's tcgTranslationCacheMiB,
// or by default an eighth of the VM's memory (the most it can be resized
// to) within 16 and 256 MiB; a KVM domain has none.
func TestTranslationCacheOnlyUnderTCG(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tcg    bool
		config int   // tcgTranslationCacheMiB
		memory int64 // MiB; 0: the annotations' default
		max    int64 // MiB, VirtletMaxMemory; 0: none
		want   int   // 0: no <tcg>
	}{
		{name: "tcg, the config's size", tcg: true, config: 32, want: 32},
		{name: "tcg, QEMU's default size from the config", tcg: true, config: 1024, memory: 512, want: 1024},
		{name: "tcg, sized per VM: 1 GiB", tcg: true, memory: 1024, want: 128},
		{name: "tcg, sized per VM: 512 MiB", tcg: true, memory: 512, want: 64},
		{name: "tcg, sized per VM: 128 MiB", tcg: true, memory: 128, want: 16},
		{name: "tcg, sized per VM: 64 MiB, at least 16", tcg: true, memory: 64, want: 16},
		{name: "tcg, sized per VM: 8 GiB, at most 256", tcg: true, memory: 8192, want: 256},
		{name: "tcg, sized per VM by the most it can be resized to", tcg: true, memory: 256, max: 1024, want: 128},
		{name: "kvm", config: 32},
		{name: "kvm, sized per VM", memory: 512},
	} {
		in := domainCase{name: "defaults", ann: map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}, tcg: tc.tcg}.input(t)
		in.TBCacheMiB = tc.config
		if tc.memory > 0 {
			in.Spec.MemoryBytes = tc.memory << 20
		}
		in.Spec.MaxMemoryBytes = tc.max << 20
		got, err := domainXML(in)
		if err != nil {
			t.Fatal(err)
		}
		var d libvirtxml.Domain
		if err := d.Unmarshal(got); err != nil {
			t.Fatal(err)
		}
		size := 0
		if tcg := d.Features.TCG; tcg != nil && tcg.TBCache != nil {
			if tcg.TBCache.Unit != "MiB" {
				t.Errorf("%s: translation cache in %q", tc.name, tcg.TBCache.Unit)
			}
			size = int(tcg.TBCache.Size)
		}
		if size != tc.want {
			t.Errorf("%s: translation cache %d MiB, want %d", tc.name, size, tc.want)
		}
		if tc.config == 32 && tc.tcg {
			checkGolden(t, "tcg-translation-cache", got)
		}
	}
}
