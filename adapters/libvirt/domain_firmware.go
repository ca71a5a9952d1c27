package libvirt

import (
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// setFirmware sets the machine, the firmware (BIOS, or UEFI with or
// without Secure Boot), the SMBIOS the guest reads, and the platform
// features (ACPI, APIC, Hyper-V's enlightenments, TCG's translation cache).
func setFirmware(d *libvirtxml.Domain, in domainInput, _ pciSlots) error {
	s := in.Spec
	d.OS = &libvirtxml.DomainOS{
		Type:   &libvirtxml.DomainOSType{Arch: "x86_64", Machine: machineOrDefault(s.Machine), Type: "hvm"},
		SMBios: &libvirtxml.DomainSMBios{Mode: "sysinfo"},
	}
	d.SysInfo = []libvirtxml.DomainSysInfo{{SMBIOS: &libvirtxml.DomainSysInfoSMBIOS{System: &libvirtxml.DomainSysInfoSystem{
		Entry: []libvirtxml.DomainSysInfoEntry{
			{Name: "manufacturer", Value: "Virtlet"},
			{Name: "product", Value: "VM pod"},
			{Name: "uuid", Value: s.UUID},
		},
	}}}}
	d.Features = &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}}
	if mib := in.tbCacheMiB(maxMemory(s)); mib > 0 {
		d.Features.TCG = &libvirtxml.DomainFeatureTCG{TBCache: &libvirtxml.DomainFeatureTCGTBCache{Unit: "MiB", Size: uint(mib)}}
	}
	firmware(d, s)
	if s.HyperV {
		hyperV(d)
	}
	return nil
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
	if d.Clock == nil {
		d.Clock = &libvirtxml.DomainClock{Offset: "utc"}
	}
	d.Clock.Timer = append(d.Clock.Timer, libvirtxml.DomainTimer{Name: "hypervclock", Present: "yes"})
}
