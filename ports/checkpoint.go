package ports

import (
	"context"
	"time"
)

// Checkpoints of running VMs (CRI CheckpointContainer): the hypervisor
// captures a VM's state into a directory, and the archive port packs that
// directory, with the pod's and container's metadata, into the archive
// kubelet asked for.

// VMCheckpointer captures a running VM's state without stopping it. A
// hypervisor adapter may implement it besides Hypervisor; the plugin client
// implements it and reports ErrUnimplemented when its plugin does not.
type VMCheckpointer interface {
	// CheckpointVM writes VM id's memory and device state, and a copy of
	// each disk the guest writes to, into dir (which exists, is empty and
	// is on the node's file system). The VM is paused only while they are
	// written and runs on afterwards, whatever the outcome (a plugin killed
	// meanwhile resumes it when it starts again). A VM whose
	// state cannot be captured whole (a 9p share, a host block device, a
	// network disk) is refused with ErrFailedPrecondition naming what,
	// before it is paused; a VM that is not running, likewise.
	CheckpointVM(ctx context.Context, id, dir string) (VMCheckpoint, error)
}

// VMCheckpoint is what CheckpointVM wrote. Paths are relative to its dir,
// slash-separated.
type VMCheckpoint struct {
	// StateFile holds the VM's memory and device state, in the
	// hypervisor's own format (libvirt: a save image, which embeds the
	// domain's definition).
	StateFile string
	// DefinitionFile is the VM's definition in the hypervisor's terms
	// (libvirt: the domain XML), for people and tools reading the archive.
	DefinitionFile string
	// Disks are the copies of the VM's writable disks.
	Disks []CheckpointDisk
	// Skipped are the disks left out and why (read-only media a restoring
	// pod brings along itself: the cloud-init ISO).
	Skipped []CheckpointDisk
	// Paused is how long the guest was paused.
	Paused time.Duration
	// Hypervisor is the hypervisor's name and version, and the machine
	// type and accelerator the VM ran on: a restore needs the same.
	Hypervisor  string
	Machine     string
	Accelerator string
}

// CheckpointDisk is one disk of a checkpointed VM.
type CheckpointDisk struct {
	Name   string // the disk's name in the VMSpec ("root", "vol-data")
	File   string // the copy, relative to the checkpoint's dir; "" when skipped
	Format string // "qcow2" or "raw"
	// BackingFile is the base image a qcow2 copy refers to (a root
	// overlay's), as the node named it: the copy holds only what the guest
	// changed.
	BackingFile string
	Bytes       int64  // the copy's size on disk
	Why         string // why a disk was skipped
}

// CheckpointArchiver writes checkpoint archives.
type CheckpointArchiver interface {
	// WriteCheckpoint makes an empty working directory, has capture fill
	// it, and packs it with meta into an archive at location, written
	// whole or not at all; the working directory is removed either way.
	WriteCheckpoint(ctx context.Context, location string, meta CheckpointMeta,
		capture func(ctx context.Context, dir string) (VMCheckpoint, error)) (CheckpointArchive, error)
}

// CheckpointMeta describes the checkpointed container and its pod, for
// the archive's metadata files.
type CheckpointMeta struct {
	ContainerID   string
	ContainerName string
	Attempt       uint32
	SandboxID     string
	PodName       string
	PodNamespace  string
	PodUID        string
	// Image is the image as the pod spec names it, ImageRef its digest
	// reference, ImageID its content digest.
	Image, ImageRef, ImageID string
	Labels                   map[string]string
	Annotations              map[string]string // the container's
	PodAnnotations           map[string]string
	IPs                      []string
	CreatedAt                time.Time
	CheckpointedAt           time.Time
	// Runtime and RuntimeVersion name the runtime that wrote the archive.
	Runtime, RuntimeVersion string
	// VM is the VM's spec (without secrets).
	VM VMSpec
}

// CheckpointArchive is a written archive.
type CheckpointArchive struct {
	Path       string
	Bytes      int64
	Checkpoint VMCheckpoint
}

// ImageFormatCheckpoint is the format of an image that is a VM checkpoint
// archive (FetchResult.Format): a container created from it restores the
// checkpointed VM instead of booting one.
const ImageFormatCheckpoint = "checkpoint"

// VMRestore is what a VM restored from a checkpoint starts from
// (VMSpec.Restore): its state file and the copies of its disks, by disk
// name, unpacked on the node's file system. Define takes them over (moves
// or copies them to where it keeps the VM's files); Start resumes the
// guest from the state instead of booting it.
type VMRestore struct {
	StateFile string
	Disks     map[string]string
}

// CheckpointReader reads checkpoint archives, which are untrusted: only
// the files a VM checkpoint has, regular, within bounds.
type CheckpointReader interface {
	// ReadCheckpoint reads the archive's metadata without unpacking it.
	ReadCheckpoint(ctx context.Context, archive string) (CheckpointMeta, VMCheckpoint, error)
	// UnpackCheckpoint unpacks the archive into a fresh directory, calls use
	// with the state file's and the disk copies' paths in it, and removes
	// the directory when use returns.
	UnpackCheckpoint(ctx context.Context, archive string, use func(ctx context.Context, r VMRestore) error) error
}

// MACAdopter lets a pod's network serve its VM's NICs under MACs other
// than the ones Setup gave them: a VM restored from a checkpoint keeps the
// MACs it was saved with (its hypervisor will not change a running
// guest's), and the pod's DHCP answers go to them.
type MACAdopter interface {
	// AdoptMACs gives the pod's interfaces, in the attachment's order, the
	// MACs given and returns the attachment as it now is.
	AdoptMACs(ctx context.Context, req NetworkRequest, macs []string) (NetworkAttachment, error)
}
