// Command virtlet-plugin-cni is the CNI pod network plugin shipped with
// Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/cni"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(cni.New(sdk.Log)) }
