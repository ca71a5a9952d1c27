package annotations

// Doc describes one annotation: docs/vm-pods.md's reference is made from
// these (testing/docs checks it), and Known from their names.
type Doc struct {
	Name    string
	Values  string // what it accepts
	Default string // "" when unset means none
	Meaning string
}

// Reference documents every Virtlet annotation this package understands.
var Reference = []Doc{
	{VCPUCount, "an integer from 1 to 255", "1", "the VM's vCPUs"},
	{MaxVCPUCount, "an integer from 1 to 255, at least VirtletVCPUCount", "",
		"the most vCPUs the VM can have while it runs: the vCPU count then follows the container's CPU limit (rounded up, at least VirtletVCPUCount), and an in-place resize of the limit hot-plugs or unplugs vCPUs"},
	{CPUTopology, "sockets=S,cores=C,threads=T (each 1 when left out)", "one socket per vCPU",
		"how the vCPUs are laid out; S×C×T must be the vCPU count"},
	{CPUModel, `"" or host-model`, `""`, "host-model gives the guest the host's CPU model and features (nested virtualisation)"},
	{LibvirtCPUSetting, "YAML of libvirt's <cpu> element with capitalised keys (Mode, Match, Check, Model: {Fallback, VendorID, Value}, Vendor, Topology, Features: [{Policy, Name}], Cache, Numa)", "",
		"the VM's CPU definition, as libvirt takes it"},
	{DiskDriver, "scsi or virtio", "scsi", "the bus of the VM's disks: the root disk, volumes and the cloud-init medium (a CD-ROM on scsi, a read-only disk on virtio)"},
	{RootVolumeSize, "a quantity such as 10Gi, at least the image's virtual size", "the image's virtual size",
		"the size of the root disk the guest sees (an overlay over the image; it grows, never shrinks)"},
	{MaxMemory, "a quantity such as 4Gi, at least the VM's memory", "the VM's memory",
		"the most memory the VM can be resized to while it runs (in-place pod resize, through the balloon)"},
	{MachineType, "pc, q35, or a machine type of the node's QEMU such as pc-q35-7.2", "pc", "the VM's machine type"},
	{Firmware, "bios or uefi", "bios", "the VM's firmware; uefi is OVMF, with an NVRAM store of the VM's own"},
	{SecureBoot, "true or false; true needs VirtletFirmware uefi and VirtletMachineType q35", "false",
		"boot with Secure Boot on and Microsoft's keys enrolled"},
	{HyperV, "true or false", "false", "Hyper-V enlightenments (paravirtual interfaces Windows uses under a hypervisor) and the Hyper-V clock"},
	{Clock, "utc, localtime, a time zone such as Europe/Berlin, or a signed offset in seconds such as +3600", "utc",
		"the guest's hardware clock"},
	{ClockTimers, "comma-separated name:policy pairs: rtc and pit take a tick policy (delay, catchup; pit also discard), every timer (rtc, pit, hpet, kvmclock) yes or no", "",
		"tunes the guest's timers"},
	{Watchdog, "i6300esb, or itco (with VirtletMachineType q35)", "", "adds a watchdog device"},
	{WatchdogAction, "reset, poweroff, shutdown or dump (dump only where the node's operator allows it)", "reset",
		"what the watchdog does when the guest stops petting it; the container then exits with reason Watchdog"},
	{SystemUUID, "a non-nil UUID, unique on the node", "libvirt's",
		"the VM's SMBIOS system UUID"},
	{CloudInitImageType, "nocloud, configdrive, or the type of another installed datasource plugin", "nocloud",
		"the cloud-init datasource, and so the medium's format (docs/cloud-init.md)"},
	{CloudInitMetaData, "a YAML or JSON mapping", "", "keys that override the generated meta-data"},
	{CloudInitUserData, "a YAML or JSON mapping", "", "user-data merged into the generated user-data (docs/cloud-init.md has the rules)"},
	{CloudInitUserDataOverwrite, "true or false", "false",
		"VirtletCloudInitUserData replaces the source's user-data instead of being merged with it, and VirtletSSHKeys the source's keys; the generated parts (files, mounts, scripts) stay"},
	{CloudInitUserDataScript, "a script (or any user-data document)", "",
		"replaces the user-data entirely; @virtlet-mount-script@ in it becomes the script that mounts the pod's volumes"},
	{CloudInitUserDataSource, "configmap/NAME or secret/NAME", "",
		"a ConfigMap or Secret of the pod's namespace, each of whose keys is a user-data key (its value YAML), merged into the user-data"},
	{CloudInitUserDataSourceKey, "a ConfigMap/Secret key, with VirtletCloudInitUserDataSource", "",
		"this key of the source holds the whole user-data document (a script, or a #cloud-config mapping), which replaces the generated user-data as VirtletCloudInitUserDataScript does"},
	{CloudInitUserDataSourceEncoding, "plain or base64", "plain", "how the source's values are encoded"},
	{SSHKeys, "SSH public keys, one a line", "", "keys the guest's default user accepts (meta-data public-keys)"},
	{SSHKeySource, "configmap/NAME, secret/NAME, or KIND/NAME/KEY", "key authorized_keys",
		"a ConfigMap or Secret holding more SSH public keys"},
	{FilesFromDataSource, "configmap/NAME or secret/NAME", "",
		"each key X is written to the path in key X_path (its content base64 unless X_encoding is plain) in the root file system before the first boot (ext2/3/4 roots)"},
	{Chown9pfsMounts, "true or false", "false", "gives the files of the pod's 9p shares to the VM's QEMU user, so that the guest can write them"},
	{ForceDHCPNetworkConfig, "true or false", "false", "the guest configures its network by DHCP only: no network-config in the cloud-init data"},
	{PersistentRootfsReinit, "true or false, with a persistent root filesystem", "false",
		"overwrite a persistent root filesystem that holds another image (or data that is not one) with the pod's image"},
	{MemorySharing, "true or false", "true",
		"false keeps the host from merging the VM's memory pages with other VMs' (KSM, where the node runs it): identical pages shared across tenants are a known side channel"},
	{MigrateFrom, "JSON naming the migrating VM: its pod, pod UID, node, domain, UUID and MACs", "",
		"the pod receives that VM by live migration instead of booting one (virtletctl migrate creates such pods; docs/migration.md)"},
	{Preset, "the name of one of the node's VM presets", "", "the operator's preset the pod starts from; the pod's own annotations win over it"},
}

// Known lists every Virtlet annotation this package understands.
var Known = func() []string {
	names := make([]string, len(Reference))
	for i, d := range Reference {
		names[i] = d.Name
	}
	return names
}()
