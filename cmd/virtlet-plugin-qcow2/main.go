// Command virtlet-plugin-qcow2 is the volume plugin of Virtlet's qcow2
// flexvolumes (ephemeral disks), shipped with Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/volume/qcow2"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(qcow2.New(sdk.Log)) }
