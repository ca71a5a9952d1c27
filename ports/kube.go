package ports

import (
	"context"
	"os"
)

// KubeObjects reads Kubernetes objects a VM pod refers to. A missing
// object is ErrNotFound.
type KubeObjects interface {
	// ConfigMap returns a ConfigMap's data and binaryData keys.
	ConfigMap(ctx context.Context, namespace, name string) (map[string][]byte, error)
	// Secret returns a Secret's data keys. Values are never logged.
	Secret(ctx context.Context, namespace, name string) (map[string][]byte, error)
}

// ProjectedFiles reads what kubelet wrote on the node for a pod's
// ConfigMap, Secret, projected and downward API volumes. VMs cannot see
// the node's files, so the files travel into the guest by cloud-init.
type ProjectedFiles interface {
	// Read returns the files under a volume's host directory, by path
	// relative to it, following kubelet's symlinks and skipping its
	// "..data" bookkeeping entries. A missing directory is ErrNotFound.
	Read(ctx context.Context, hostPath string) ([]ProjectedFile, error)
}

// ProjectedFile is one file of a projected volume. Data may be secret.
type ProjectedFile struct {
	Path string // relative to the volume, slash-separated
	Data []byte
	Mode os.FileMode
}

// FlexvolumeOptionsFile is the file in a Virtlet flexvolume's directory
// (kubelet's <pod>/volumes/virtlet~flexvolume_driver/<name>) where the
// flexvolume driver keeps the volume's options, as a JSON object of
// strings.
const FlexvolumeOptionsFile = "virtlet-flexvolume.json"

// FlexvolumeOptions is what the flexvolume driver hands the runtime when
// kubelet mounts or unmounts a Virtlet flexvolume for a pod.
type FlexvolumeOptions struct {
	PodUID, PodNamespace, PodName string
	Volume                        string
	Options                       map[string]string // type and the volume's options; values may be secret
}

// VolumeDirs reads what volume drivers left in kubelet's volume
// directories on the node.
type VolumeDirs interface {
	// FlexvolumeOptions returns the options the Virtlet flexvolume driver
	// kept in a volume's directory. A directory without them is
	// ErrNotFound.
	FlexvolumeOptions(ctx context.Context, dir string) (map[string]string, error)
}
