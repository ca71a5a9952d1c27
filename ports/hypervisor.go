package ports

import (
	"context"
	"os"
	"time"
)

// Hypervisor runs VMs. Implementations touch only VMs they created (tagged
// as Virtlet's); a hypervisor shared with other users loses nothing.
type Hypervisor interface {
	// Capabilities reports the hypervisor's version and accelerator. It is
	// also the readiness probe of the hypervisor.
	Capabilities(ctx context.Context) (HypervisorCapabilities, error)
	// Define creates (but does not start) the VM described by spec,
	// including its root disk. Defining an ID that exists with the same
	// spec succeeds; with a different spec it fails with ErrAlreadyExists.
	Define(ctx context.Context, spec VMSpec) error
	// Start boots a defined VM. Starting a running VM succeeds.
	Start(ctx context.Context, id string) error
	// Stop asks the guest to shut down (ACPI) and waits up to timeout,
	// then forces it off. Stopping a VM that is not running succeeds.
	Stop(ctx context.Context, id string, timeout time.Duration) (VMStatus, error)
	// Undefine removes a VM and everything Define created for it. The VM
	// is forced off first if it still runs. Unknown IDs: ErrNotFound.
	Undefine(ctx context.Context, id string) error
	// Status reports one VM. Unknown IDs: ErrNotFound.
	Status(ctx context.Context, id string) (VMStatus, error)
	// List reports every VM the implementation owns.
	List(ctx context.Context) ([]VMStatus, error)
	// Watch streams state changes until ctx ends or the implementation goes
	// away; then the channel is closed. A watcher that does not keep up is
	// cut off the same way rather than skipped. Consumers resynchronise
	// with List after each (re)subscription.
	Watch(ctx context.Context) (<-chan VMStatus, error)
	// ReopenLog reopens the VM's console log file after kubelet rotated it.
	ReopenLog(ctx context.Context, id string) error
	// WriteFiles writes files into the root file system of a defined VM's
	// boot disk before it first boots (VirtletFilesFromDataSource). The
	// files may be secret and are never logged or kept.
	WriteFiles(ctx context.Context, id string, files []GuestFile) error
	// SetMemory resizes a VM's memory within its MaxMemoryBytes: live,
	// through the balloon, when it runs, and for its next boot.
	SetMemory(ctx context.Context, id string, bytes int64) error
	// SetVCPUs hot-plugs or unplugs vCPUs within MinVCPUs..MaxVCPUs: live
	// when the VM runs (the guest's agent brings new ones online), and for
	// its next boot.
	SetVCPUs(ctx context.Context, id string, n int) error
	// SetCPULimits sets the VM's CPU weight and limit: live when it runs,
	// and for its next boot.
	SetCPULimits(ctx context.Context, id string, l CPULimits) error
}

// CPULimits are a VM's share of the node's CPU time, as a pod's CPU
// request and limit give a container's (CFS): Shares weighs the VM against
// the others (cpu_shares, 2 to 262144; 0: the hypervisor's default), and
// the whole VM may use Quota microseconds of CPU time per Period (Quota ≤
// 0: no limit; Period 0: 100 ms).
type CPULimits struct {
	Shares uint64
	Period int64
	Quota  int64
}

// WithoutSecrets returns a copy of the spec whose disks carry no
// authentication secret, and without the restore source (files that are
// gone once the VM is defined): the form kept in records.
func (s VMSpec) WithoutSecrets() VMSpec {
	s.Restore = nil
	disks := make([]Disk, len(s.Disks))
	for i, d := range s.Disks {
		if d.Source.Auth != nil {
			auth := *d.Source.Auth
			auth.Secret = nil
			d.Source.Auth = &auth
		}
		disks[i] = d
	}
	s.Disks = disks
	return s
}

// GuestFile is a file to write into a guest's file system. Data may be
// secret.
type GuestFile struct {
	Path string // absolute path in the guest
	Data []byte
	Mode os.FileMode
	// Source says where the file comes from, for messages (e.g. "key
	// conf of configmap/app").
	Source string
}

// HypervisorCapabilities describe the hypervisor behind a Hypervisor port.
type HypervisorCapabilities struct {
	Name        string // e.g. "libvirt"
	Version     string // e.g. "9.0.0 (QEMU 7.2.0)"
	Accelerator string // "kvm", "tcg", or "none" for fakes
	Details     map[string]string
}

// VMState is the hypervisor-level state of a VM.
type VMState string

const (
	VMDefined VMState = "defined" // exists, never started
	VMRunning VMState = "running"
	VMStopped VMState = "stopped" // was started and is no longer running
	VMUnknown VMState = "unknown"
)

// VMStatus is a VM's state as the hypervisor sees it.
type VMStatus struct {
	ID         string
	State      VMState
	StartedAt  time.Time
	FinishedAt time.Time
	// ExitCode: 0 when the guest powered itself off or shut down on request;
	// non-zero when it crashed or was forced off.
	ExitCode int32
	Reason   string // short CamelCase reason, e.g. "Completed", "Crashed", "Destroyed"
	Message  string // human readable detail

	// Name and UUID are what the hypervisor knows the VM by, when they
	// are not the spec's: a VM claimed from a pool of pre-launched VMs
	// keeps the name and UUID the pool gave it (an empty spec UUID lets
	// the hypervisor choose). Empty: as the spec says.
	Name string
	UUID string
	// Prelaunched: the VM's process already runs, paused before the
	// guest's first instruction (a VM claimed from the pool, its pod's
	// devices plugged in), so that its next Start only resumes it.
	Prelaunched bool
}

// VMSpec is a hypervisor-neutral description of one VM.
type VMSpec struct {
	ID           string // Virtlet's container ID: stable, unique
	Name         string // human-friendly unique name (domain name)
	UUID         string // the UUID the pod asks for (VirtletSystemUUID), also the guest's SMBIOS UUID; empty: the hypervisor picks one (VMStatus.UUID)
	SandboxID    string
	PodName      string
	PodNamespace string
	PodUID       string

	// VCPUs is the VM's vCPU count. MaxVCPUs, when above it, is the most
	// it can be given while it runs (SetVCPUs); the first MinVCPUs (at
	// least 1) can never be unplugged.
	VCPUs       int
	MaxVCPUs    int
	MinVCPUs    int
	MemoryBytes int64
	// MaxMemoryBytes, when above MemoryBytes, is the most memory the VM
	// can be resized to while it runs (SetMemory; the guest's balloon
	// holds the rest).
	MaxMemoryBytes int64
	// HugepageSizeBytes, when set, backs all of the VM's memory with host
	// hugepages of this size (the pod's hugepages-<size> limit).
	HugepageSizeBytes int64
	CPU               CPUSpec
	// CPUSet, when set, is the host CPUs the VM's vCPUs are pinned to (the
	// container's exclusive CPUs); its emulator threads stay off them.
	CPUSet []int
	// Machine is the machine type (VirtletMachineType): "" for pc, q35, or
	// another the hypervisor offers (it refuses one it does not).
	Machine string
	// Firmware is "" for BIOS or FirmwareUEFI (the hypervisor keeps the
	// VM's own UEFI variable store and removes it with the VM).
	Firmware string
	// SecureBoot (UEFI, q35) boots with Secure Boot on and Microsoft's
	// keys enrolled.
	SecureBoot bool
	// HyperV gives the guest Hyper-V enlightenments (KVM only).
	HyperV bool
	// NoMemorySharing keeps the host from merging the VM's memory pages
	// with other VMs' (KSM): identical pages shared across tenants are a
	// known side channel (VirtletMemorySharing: "false").
	NoMemorySharing bool
	// CPULimits are the VM's CPU weight and limit.
	CPULimits CPULimits
	// Clock is the guest's hardware clock and timers.
	Clock ClockSpec
	// Watchdog, when set, is the VM's watchdog device: a guest that stops
	// petting it is acted on, and a VM it stops exits with reason Watchdog.
	Watchdog *Watchdog

	Disks       []Disk
	Filesystems []Filesystem
	NICs        []NIC

	// ConsoleLogPath is the CRI log file the serial console is written to,
	// in the CRI log format (kubectl logs reads it).
	ConsoleLogPath string

	// Restore, when set, makes the VM the one a checkpoint holds: Define
	// takes over its disks and state, Start resumes it (its name, UUID and
	// NIC MACs are the checkpointed VM's: the hypervisor takes them from
	// the state).
	Restore *VMRestore `json:"restore,omitempty"`

	// Incoming, when set, makes the VM the receiving end of a live
	// migration (ports.VMMigrator): Define prepares it with the migrating
	// domain's identity, Start waits until the guest has arrived.
	Incoming *VMIncoming `json:"incoming,omitempty"`

	// RunAs, when set, is the VM's own user and group: its hypervisor
	// process runs as them and its files belong to them while it runs, so
	// that one VM's process cannot reach another's disks. Nil: the
	// hypervisor's one default user for every VM.
	RunAs *ProcessIdentity
}

// ProcessIdentity is the host user and group a VM's hypervisor process
// runs as.
type ProcessIdentity struct {
	UID, GID int
}

// CPUSpec selects the guest CPU.
type CPUSpec struct {
	// Model: "" for the hypervisor's default, "host-model" for nested
	// virtualisation.
	Model string
	// Setting, when set, is the full CPU definition (VirtletLibvirtCPUSetting)
	// and overrides Model.
	Setting *CPUSetting
}

// CPUSetting mirrors libvirt's <cpu> element; keys are capitalised in the
// annotation's YAML, as Virtlet documented.
type CPUSetting struct {
	Mode       string           `json:"Mode,omitempty"`
	Match      string           `json:"Match,omitempty"`
	Check      string           `json:"Check,omitempty"`
	Migratable string           `json:"Migratable,omitempty"`
	Model      *CPUSettingModel `json:"Model,omitempty"`
	Vendor     string           `json:"Vendor,omitempty"`
	Topology   *CPUTopology     `json:"Topology,omitempty"`
	Features   []CPUFeature     `json:"Features,omitempty"`
	Cache      *CPUCache        `json:"Cache,omitempty"`
	Numa       *CPUNuma         `json:"Numa,omitempty"`
}

type CPUSettingModel struct {
	Fallback string `json:"Fallback,omitempty"`
	VendorID string `json:"VendorID,omitempty"`
	Value    string `json:"Value,omitempty"`
}

type CPUTopology struct {
	Sockets int `json:"Sockets,omitempty"`
	Dies    int `json:"Dies,omitempty"`
	Cores   int `json:"Cores,omitempty"`
	Threads int `json:"Threads,omitempty"`
}

type CPUFeature struct {
	Policy string `json:"Policy,omitempty"`
	Name   string `json:"Name"`
}

type CPUCache struct {
	Level int    `json:"Level,omitempty"`
	Mode  string `json:"Mode"`
}

type CPUNuma struct {
	Cells []CPUNumaCell `json:"Cells,omitempty"`
}

type CPUNumaCell struct {
	ID     *int   `json:"ID,omitempty"`
	CPUs   string `json:"CPUs"`
	Memory uint64 `json:"Memory"`
	Unit   string `json:"Unit,omitempty"`
}

// DiskBus is how a disk is attached to the guest.
type DiskBus string

const (
	BusSCSI   DiskBus = "scsi"   // virtio-scsi controller, sdX in the guest
	BusVirtio DiskBus = "virtio" // virtio-blk, vdX in the guest
	BusSATA   DiskBus = "sata"
	BusIDE    DiskBus = "ide"
)

// DiskDevice is the kind of block device the guest sees.
type DiskDevice string

const (
	DeviceDisk  DiskDevice = "disk"
	DeviceCDROM DiskDevice = "cdrom"
)

// DiskSourceType says where a disk's data lives.
type DiskSourceType string

const (
	SourceFile    DiskSourceType = "file"
	SourceBlock   DiskSourceType = "block"
	SourceNetwork DiskSourceType = "network"
)

// Disk is one block device of a VM.
type Disk struct {
	Name     string // unique within the VM: "root", "cloud-init", "vol-<name>"
	Device   DiskDevice
	Bus      DiskBus
	ReadOnly bool
	Boot     bool   // boot from this disk
	Serial   string // optional serial visible in the guest
	Source   DiskSource
	// Overlay asks the hypervisor to create Source.Path as a copy-on-write
	// overlay of a base image (and to delete it with the VM).
	Overlay *DiskOverlay
}

// DiskSource is a disk's backing data.
type DiskSource struct {
	Type   DiskSourceType
	Path   string // file or block device path
	Format string // "qcow2" or "raw"
	// Offset and Size, when Offset is set, make the guest see only that
	// slice of a raw source (a persistent root filesystem behind its
	// header).
	Offset int64
	Size   int64
	// Network sources (e.g. Ceph RBD).
	Protocol string // "rbd"
	Name     string // "pool/image"
	Hosts    []NetworkHost
	Auth     *DiskAuth
}

// NetworkHost is a network disk server.
type NetworkHost struct {
	Name string
	Port string
}

// DiskAuth authenticates to a network disk. Secret is sensitive: it is
// never logged, and never kept in a record on disk (see
// VMSpec.WithoutSecrets); the hypervisor keeps it where the hypervisor keeps
// such keys (a libvirt secret).
type DiskAuth struct {
	Username   string
	SecretType string // e.g. "ceph"
	Secret     []byte
}

// DiskOverlay describes a copy-on-write overlay on a base image.
type DiskOverlay struct {
	BasePath   string // base image file (never written)
	BaseFormat string // "qcow2" or "raw"
	SizeBytes  int64  // virtual size; 0 or smaller than the base: the base's size
	// KeepFreeBytes, when not 0, is the space the overlay's file system
	// must have free before it is made (the daemon's keepFreeSpace): a
	// node short of space starts no more VMs whose disks would grow there.
	KeepFreeBytes int64
}

// Filesystem is a host directory shared with the guest (virtio-9p).
type Filesystem struct {
	Source     string // host directory
	Tag        string // mount tag seen by the guest
	AccessMode string // "squash", "mapped" or "passthrough"
	ReadOnly   bool
}

// NIC is one network interface of a VM.
type NIC struct {
	Name string // interface name inside the pod network namespace
	MAC  string
	MTU  int
	// Bridge is the host bridge the NIC joins; the hypervisor makes the
	// tap.
	Bridge string
}

// ClockSpec is a VM's hardware clock (VirtletClock, VirtletClockTimers).
type ClockSpec struct {
	// Offset: "" or "utc", "localtime", "timezone" (Timezone), or
	// "variable" (AdjustmentSeconds from UTC).
	Offset            string       `json:"offset,omitempty"`
	Timezone          string       `json:"timezone,omitempty"`
	AdjustmentSeconds int64        `json:"adjustmentSeconds,omitempty"`
	Timers            []ClockTimer `json:"timers,omitempty"`
}

// ClockTimer tunes one of the guest's timers (rtc, pit, hpet, kvmclock).
type ClockTimer struct {
	Name       string `json:"name"`
	TickPolicy string `json:"tickPolicy,omitempty"` // delay, catchup, discard
	Present    string `json:"present,omitempty"`    // yes, no
}

// FirmwareUEFI is VMSpec.Firmware for UEFI (OVMF).
const FirmwareUEFI = "uefi"

// Watchdog is a VM's watchdog device (VirtletWatchdog, VirtletWatchdogAction).
type Watchdog struct {
	Model  string `json:"model"`  // i6300esb, itco
	Action string `json:"action"` // reset, poweroff, shutdown, dump
}
