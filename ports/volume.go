package ports

import "context"

// Volumes provides VM disks and shares for one or more volume types
// (flexvolume `type` options, Kubernetes volume kinds).
type Volumes interface {
	// Prepare makes the volume ready to attach to the VM and says how.
	// Preparing the same (VMID, Name) again returns the same attachment.
	Prepare(ctx context.Context, req VolumeRequest) (VolumeAttachment, error)
	// Release undoes Prepare. Releasing an unknown volume succeeds.
	Release(ctx context.Context, req VolumeRequest) error
}

// VolumeRequest names one volume of one VM.
type VolumeRequest struct {
	VMID         string
	PodUID       string
	PodNamespace string
	Name         string // the pod's volume name
	Type         string // the volume type this plugin handles
	// Options are the volume's options (e.g. flexvolume options); values
	// may be sensitive and are never logged.
	Options map[string]string
	// HostPath is the host-side path of the volume, when there is one.
	HostPath string
}

// VolumeAttachment tells the hypervisor how to attach a prepared volume.
type VolumeAttachment struct {
	Disks       []Disk
	Filesystems []Filesystem
}
