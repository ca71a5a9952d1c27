package ports

import "context"

// Datasource packages cloud-init data into media the guest reads (for
// example an ISO 9660 image labelled cidata for NoCloud).
type Datasource interface {
	// BuildMedia writes the media for one VM and describes the disk to
	// attach. Building again for the same VM replaces the media.
	BuildMedia(ctx context.Context, req MediaRequest) (Disk, error)
	// RemoveMedia deletes the VM's media. Unknown VMs are not an error.
	RemoveMedia(ctx context.Context, vmID string) error
}

// MediaRequest carries generated cloud-init documents. They may hold
// secrets and are never logged.
type MediaRequest struct {
	VMID          string
	Datasource    string // "nocloud" or "configdrive"
	MetaData      []byte // JSON
	UserData      []byte // may be empty: then no user-data file
	NetworkConfig []byte // NoCloud network-config v1 YAML or ConfigDrive network_data.json; may be empty
}
