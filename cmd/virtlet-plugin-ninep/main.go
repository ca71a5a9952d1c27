// Command virtlet-plugin-ninep is the volume plugin sharing directory
// volumes (emptyDir, hostPath, filesystem PersistentVolumes) with VMs over
// virtio-9p, shipped with Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/volume/ninep"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(ninep.New(sdk.Log)) }
