// Command virtlet-plugin-raw is the volume plugin of host block devices
// (raw flexvolumes, block PersistentVolumes, persistent root file
// systems), shipped with Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/volume/raw"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(raw.New(sdk.Log)) }
