package ports

import "context"

// Datasource packages cloud-init data into media the guest reads (for
// example an ISO 9660 image labelled cidata for NoCloud). A datasource owns
// its format: the core hands it the data in cloud-init's own neutral forms,
// and the plugin lays them out as its medium requires.
type Datasource interface {
	// BuildMedia writes the media for one VM and describes the disk to
	// attach. Building again for the same VM replaces the media.
	BuildMedia(ctx context.Context, req MediaRequest) (Disk, error)
	// RemoveMedia deletes the VM's media. Unknown VMs are not an error.
	RemoveMedia(ctx context.Context, vmID string) error
}

// MediaRequest carries a VM's cloud-init data. It may hold secrets and is
// never logged.
type MediaRequest struct {
	VMID       string
	Datasource string // the VirtletCloudInitImageType the pod asked for
	// MetaData is a JSON object: instance-id, local-hostname, public-keys
	// (when there are keys), and the keys VirtletCloudInitMetaData sets.
	MetaData []byte
	// UserData is the user-data document (#cloud-config, or the script
	// VirtletCloudInitUserDataScript gives); never empty.
	UserData []byte
	// NetworkConfig is cloud-init's network config version 1 (YAML) for the
	// pod's network; empty when the VM configures its network by DHCP.
	NetworkConfig []byte
	// Network is the same network, structured, for media that describe
	// networks in a format of their own; nil when NetworkConfig is empty.
	Network *NetworkAttachment
}
