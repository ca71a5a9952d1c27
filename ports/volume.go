package ports

import "context"

// Volumes provides VM disks and shares for one or more volume types: the
// `type` option of a Virtlet flexvolume (qcow2, raw, ceph, or a third
// party's), and the kinds the core maps Kubernetes volumes to (VolumeShare
// for directories, VolumeBlock for block devices).
type Volumes interface {
	// Validate checks a volume's options when kubelet sets the volume up for
	// a pod (the flexvolume driver's mount), before any VM uses it, and
	// returns the options to keep in the volume's directory. Errors name the
	// option. A plugin may keep sensitive options (keys) itself, by pod UID
	// and volume name, and leave them out of what it returns: Prepare finds
	// them again.
	Validate(ctx context.Context, req VolumeRequest) (map[string]string, error)
	// Forget drops what Validate kept, when kubelet tears the volume down.
	// Forgetting an unknown volume succeeds.
	Forget(ctx context.Context, req VolumeRequest) error
	// Prepare makes the volume ready to attach to the VM and says how.
	// Preparing the same (VMID, Name) again returns the same attachment.
	Prepare(ctx context.Context, req VolumeRequest) (VolumeAttachment, error)
	// Release undoes Prepare: an ephemeral volume's data is deleted, a
	// persistent one's is kept. Releasing an unknown volume succeeds.
	Release(ctx context.Context, req VolumeRequest) error
}

// Volume types the core chooses itself (flexvolume types come from the
// pod's volume options).
const (
	// VolumeShare is a host directory shared with the guest: emptyDir,
	// hostPath and filesystem PersistentVolumes (the shipped ninep plugin
	// handles it with virtio-9p; another plugin may take it over, e.g.
	// with virtiofs).
	VolumeShare = "share"
	// VolumeBlock is a host block device: a block PersistentVolume
	// (volumeDevices), or a persistent root filesystem (devicePath "/").
	VolumeBlock = "block"
)

// RootfsOption is the flexvolume option by which a volume asks to hold the
// VM's persistent root filesystem ("true"), on a type whose plugin lists it
// in PluginInfo.RootfsTypes. The volume's mount path is not mounted in the
// guest: the disk is the VM's root.
const RootfsOption = "rootfs"

// RootfsHolder is a Volumes that says on which of its types a flexvolume
// may hold the VM's persistent root filesystem (PluginInfo.RootfsTypes). A
// Volumes that is not one holds none: the core refuses RootfsOption rather
// than have a plugin that ignores VolumeRequest.Rootfs attach a blank disk
// as the VM's root.
type RootfsHolder interface {
	RootfsTypes(ctx context.Context) ([]string, error)
}

// VolumeRequest names one volume of one VM.
type VolumeRequest struct {
	VMID         string
	PodUID       string
	PodNamespace string
	PodName      string
	Name         string // the pod's volume name
	Type         string // the volume type this plugin handles
	// Options are the volume's options (e.g. flexvolume options); values
	// may be sensitive and are never logged.
	Options map[string]string
	// HostPath is the host-side path of the volume, when there is one: the
	// directory of a share, the device of a block volume.
	HostPath string
	// ReadOnly asks for a volume the guest cannot write.
	ReadOnly bool
	// Chown asks for a share's files to be given to the hypervisor's user,
	// so that the guest may write them (VirtletChown9pfsMounts).
	Chown bool
	// RunAs is the VM's own user and group (VMSpec.RunAs), when it has
	// them: a share is made for that user rather than the hypervisor's
	// default one.
	RunAs *ProcessIdentity
	// Rootfs, set on a block volume (devicePath "/") or a flexvolume with
	// RootfsOption, makes it the VM's persistent root disk holding this
	// image.
	Rootfs *RootfsRequest
}

// RootfsRequest asks for a volume to hold a VM's root disk: the
// image is written to it once, and the VM boots from it for as long as it
// holds that image.
type RootfsRequest struct {
	ImagePath        string // the stored image file
	ImageFormat      string // "qcow2" or "raw"
	ImageDigest      string // "sha256:<hex>": what the device must hold
	ImageName        string // for messages
	ImageVirtualSize int64
	// Reinitialize allows overwriting a volume that holds another image or
	// data that is not a Virtlet root filesystem.
	Reinitialize bool
}

// VolumeAttachment tells the hypervisor how to attach a prepared volume.
type VolumeAttachment struct {
	Disks       []Disk
	Filesystems []Filesystem
	// Format, for a disk, is the file system the guest makes on it when
	// it is blank ("ext4" for ephemeral disks); empty: never formatted.
	// FormatUUID, if set, is that file system's UUID.
	Format     string
	FormatUUID string
}
